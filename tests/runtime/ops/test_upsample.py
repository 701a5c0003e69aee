"""upsample_nearest2d against torch (exact), by output size and by scale factors, every
layout, and refused inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aotrt.errors import InvalidArgument
from aotrt.runtime.ops import OPS, upsample_nearest2d

LAYOUTS = ("packed", "offset", "strided", "transposed")


def _run(kit, stream, x_np, size=None, factors=None, layout="packed", out_layout="packed"):
    # torch's cpu kernel has no integer/bool version: gather float32 copies (exact here).
    exact = x_np.dtype.name in ("float32", "float16")
    t = torch.from_numpy(x_np if exact else x_np.astype(np.float32))
    if size is not None and factors is not None:
        ref = torch.ops.aten.upsample_nearest2d.default(t, size, *factors)
    else:
        ref = torch.ops.aten.upsample_nearest2d.vec(t, size, factors)
    out = kit.out(tuple(ref.shape), str(x_np.dtype), out_layout)
    upsample_nearest2d(stream, out, kit.tensor(x_np, layout), size, factors)
    got = kit.read(out)
    np.testing.assert_array_equal(got.astype(ref.numpy().dtype), ref.numpy())
    assert got.dtype == x_np.dtype


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("factors", [[2.0, 2.0], [1.7, 0.6], [3.0, 1.0], [0.5, 2.5],
                                     [1.3333, 2.9]])
def test_upsample_by_scale_factors(kit, stream, dtype, factors):
    _run(kit, stream, kit.randn((2, 3, 7, 9), dtype), factors=factors)


@pytest.mark.parametrize("size", [[14, 18], [9, 5], [7, 9], [1, 1], [23, 31]])
def test_upsample_by_output_size(kit, stream, size):
    _run(kit, stream, kit.randn((1, 2, 7, 9), "float32"), size=size)


def test_upsample_with_both_uses_the_factors_for_indices(kit, stream):
    _run(kit, stream, kit.randn((1, 2, 5, 7), "float32"), size=[9, 13], factors=[1.5, 2.0])


@pytest.mark.parametrize("size,factors", [([1, 8], [0.5, 0.5]), ([6, 8], [1.5, 3.0]),
                                          ([10, 3], [0.7, 2.0]), ([5, 8], [1.0, 1.0])])
def test_upsample_with_both_at_twice_the_size_ignores_the_factor(kit, stream, size, factors):
    # torch's nearest_idx: an output exactly twice the input takes index >> 1, whatever the
    # factor says; other sizes use the factor.
    _run(kit, stream, kit.randn((1, 2, 5, 4), "float32"), size=size, factors=factors)


@pytest.mark.parametrize("factors", [[1e-300, 1.0], [1.0, 1e-39], [2.0, 1e-45]])
def test_upsample_factor_whose_inverse_overflows_float32_is_refused(kit, stream, factors):
    # 1 / factor is inf in float32: the source index would be NaN cast to int64.
    out = kit.out((1, 1, 4, 4), "float32")
    with pytest.raises(InvalidArgument, match="scale_factors"):
        upsample_nearest2d(stream, out, kit.tensor(kit.randn((1, 1, 2, 2), "float32")),
                           [4, 4], factors)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_upsample_views_in_place(kit, stream, layout):
    _run(kit, stream, kit.randn((2, 3, 4, 5), "float32"), factors=[2.0, 2.0], layout=layout,
         out_layout=layout)


@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_upsample_any_dtype(kit, stream, dtype):
    x = kit.rng.integers(0, 2, size=(1, 2, 3, 4)).astype(dtype)
    _run(kit, stream, x, factors=[2.0, 3.0])


def test_upsample_via_registry(kit, stream):
    x_np = kit.randn((1, 2, 3, 3), "float32")
    out = kit.out((1, 2, 6, 6), "float32")
    OPS["upsample_nearest2d"](stream, [out], [kit.tensor(x_np)], output_size=None,
                              scale_factors=[2.0, 2.0])
    ref = torch.nn.functional.interpolate(torch.from_numpy(x_np), scale_factor=2.0)
    np.testing.assert_array_equal(kit.read(out), ref.numpy())


def test_upsample_empty_batch_records_nothing(kit, stream):
    before = stream.recorded_seq
    upsample_nearest2d(stream, kit.out((0, 2, 6, 6), "float32"),
                       kit.tensor(np.zeros((0, 2, 3, 3), np.float32)), None, [2.0, 2.0])
    assert stream.recorded_seq == before


def test_upsample_input_inside_its_output_reads_old_values(kit, stream):
    x_np = kit.randn((1, 2, 3, 3), "float32")
    out = kit.out((1, 2, 6, 6), "float32")
    x = kit.view(out, [1, 2, 3, 3], [18, 9, 3, 1], 0)  # x lives in out's first bytes
    kit.dev.write(x, x_np)
    upsample_nearest2d(stream, out, x, None, [2.0, 2.0])
    ref = torch.nn.functional.interpolate(torch.from_numpy(x_np), scale_factor=2.0)
    np.testing.assert_array_equal(kit.read(out), ref.numpy())

# -- refused inputs -----------------------------------------------------------------------------

def _call(kit, stream, shape=(1, 2, 3, 3), out_shape=(1, 2, 6, 6), size=None, factors=None,
          out_dtype="float32"):
    upsample_nearest2d(stream, kit.out(out_shape, out_dtype),
                       kit.tensor(kit.randn(shape, "float32")), size, factors)


def test_refuses_neither_size_nor_factors(kit, stream):
    with pytest.raises(InvalidArgument, match="output_size or scale_factors"):
        _call(kit, stream)


def test_refuses_3d_input(kit, stream):
    with pytest.raises(InvalidArgument, match="x: expected a 4-D"):
        _call(kit, stream, shape=(2, 3, 3), factors=[2.0, 2.0])


def test_refuses_bad_factors(kit, stream):
    with pytest.raises(InvalidArgument, match="scale_factors"):
        _call(kit, stream, factors=[2.0])
    with pytest.raises(InvalidArgument, match="scale_factors"):
        _call(kit, stream, factors=[2.0, -1.0])
    with pytest.raises(InvalidArgument, match="scale_factors"):
        _call(kit, stream, factors=[2.0, float("nan")])


def test_refuses_zero_output(kit, stream):
    with pytest.raises(InvalidArgument, match="greater than 0"):
        _call(kit, stream, factors=[0.2, 2.0], out_shape=(1, 2, 0, 6))


def test_refuses_wrong_out_shape(kit, stream):
    with pytest.raises(InvalidArgument, match="out: expected sizes"):
        _call(kit, stream, size=[6, 5])


def test_refuses_out_dtype_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="out: dtype"):
        _call(kit, stream, factors=[2.0, 2.0], out_dtype="bfloat16")
