"""Tests for aotrt/runtime/arguments.py: how caller tensors are checked and classified."""

from __future__ import annotations

import numpy as np
import pytest

from aotrt.errors import InvalidArgument
from aotrt.dtypes import float32
from aotrt.program.records import SpecRecord
from aotrt.runtime.arguments import Arguments, overlap
from aotrt.runtime.device import get_device

SPEC = SpecRecord("x", float32, (3, 4), (4, 1), 48)


def _args() -> Arguments:
    dev = get_device("cpu")
    y = SpecRecord("y", SPEC.dtype, SPEC.shape, SPEC.strides, SPEC.nbytes)
    return Arguments(dev, dev.default_stream(), [SPEC], [y], "T")


def test_a_dense_aligned_host_array_is_bound_in_place() -> None:
    a = _args()
    x = np.ones((3, 4), np.float32)
    arg = a.classify(x, a.inputs[0], "input 0 'x'", False)
    assert arg.kind == "blob" and arg.ptr == x.ctypes.data and arg.span[1] - arg.span[0] == 48


def test_a_transposed_array_is_staged() -> None:
    a = _args()
    arg = a.classify(np.ones((4, 3), np.float32).T, a.inputs[0], "input 0 'x'", False)
    assert arg.kind == "stage"


@pytest.mark.parametrize("x,match", [
    (np.ones((3, 4), np.float64), "expected dtype float32, got unsupported float64"),
    (np.ones((3, 4), np.int32), "expected dtype float32, got int32"),
    (np.ones((4, 3), np.float32), r"expected shape \[3, 4\], got \[4, 3\]"),
    ([1, 2], "expected a numpy array, an aotrt.Tensor or a __dlpack__ tensor, got list"),
])
def test_wrong_inputs_name_the_problem(x, match) -> None:
    a = _args()
    with pytest.raises(InvalidArgument, match=match):
        a.classify(x, a.inputs[0], "input 0 'x'", False)


def test_out_tensors_read_only_sharing_or_overlapping_an_input() -> None:
    a = _args()
    x = np.ones((3, 4), np.float32)
    args = [a.classify(x, a.inputs[0], "input 0 'x'", False)]
    ro = np.ones((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgument, match="the array is read-only"):
        a.classify_out(ro, args)
    with pytest.raises(InvalidArgument, match="expected a tuple of 1 tensors|has 1 outputs"):
        a.classify_out((x, x), args)
    (o,) = a.classify_out(x, args)          # written while x is still read: computed apart
    assert o.kind == "stage"
    assert a.classify_out(None, args) is None


def test_overlap_of_byte_spans() -> None:
    assert overlap((0, 8), (4, 12)) and not overlap((0, 8), (8, 12))
