"""Tests for aotrt/runtime/backends/cuda/copies.py: which kernel a strided copy or fill gets,
with what arguments (pure Python; tests/runtime/backends/cuda/test_device.py runs them on a GPU)."""

from __future__ import annotations

import pytest

from aotrt.errors import Unsupported
from aotrt.runtime.backends.cuda import copies as cuda_copies

BASE = 1 << 20                                    # a 16-byte aligned device address


def _ints(args: list) -> list[int]:
    return [int(a) for a in args]


def test_a_channel_slice_of_nhwc_moves_in_16_byte_units() -> None:
    """YOLOv8n's C2f: channels 32:64 of a (1, 80, 80, 64) fp16 NHWC concatenation, copied to
    packed memory: 6400 rows of 64 bytes, 4 units each, pitches 8 and 4 units."""
    sizes, src_st, dst_st = (1, 32, 80, 80), (409600, 1, 5120, 64), (204800, 1, 2560, 32)
    name, n, args = cuda_copies.plan(BASE, BASE + 64, sizes, dst_st, src_st, 2, None)
    assert name == "aot_rows16" and n == 6400 * 4
    assert _ints(args) == [BASE, BASE + 64, 6400 * 4, 4, 4, 8]


@pytest.mark.parametrize("offset,unit", [(8, 8), (4, 4), (2, None)])
def test_the_unit_is_the_largest_that_every_address_and_pitch_allow(offset: int,
                                                                     unit: int | None) -> None:
    sizes, src_st, dst_st = (1, 32, 4, 4), (1024, 1, 256, 64), (512, 1, 128, 32)
    name, n, args = cuda_copies.plan(BASE, BASE + offset, sizes, dst_st, src_st, 2, None)
    if unit is None:                              # 2-byte aligned: element by element
        assert name == "aot_copy2" and n == 32 * 16
    else:
        assert name == f"aot_rows{unit}" and n == 16 * 64 // unit
        assert _ints(args)[3:] == [64 // unit, 64 // unit, 128 // unit]


def test_a_packed_copy_is_one_row() -> None:
    name, n, args = cuda_copies.plan(BASE, BASE + 4096, (6, 7, 5), (35, 5, 1), (35, 5, 1), 4,
                                     None)
    assert name == "aot_rows8" and n == 105 and _ints(args)[3:] == [105, 0, 0]


def test_transposes_and_fills_take_the_element_wise_kernels() -> None:
    name, n, args = cuda_copies.plan(BASE, BASE, (6, 7, 5), (1, 6, 42), (35, 5, 1), 2, None)
    assert name == "aot_copy2" and n == 210
    assert _ints(args)[2:4] == [210, 3]           # n, then the merged dims' count
    name, n, args = cuda_copies.plan(BASE, None, (4, 6), (6, 1), (6, 1), 4, 0x01)
    assert name == "aot_fill4" and n == 24 and int(args[1]) == 0x01010101


def test_too_many_irreducible_dims_are_refused() -> None:
    sizes = (2,) * 9
    strides = tuple(3 ** i for i in range(9))
    with pytest.raises(Unsupported, match="irreducible dims"):
        cuda_copies.plan(BASE, BASE, sizes, strides, strides, 4, None)
