"""max_pool2d (with indices) against torch's max_pool2d_with_indices, every layout,
ceil_mode, dilation, padding, NaN/-inf windows, and refused inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.ops import OPS, max_pool2d

DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("packed", "offset", "strided", "transposed")

CASES = [
    # kernel, stride, padding, dilation, ceil_mode
    ([3, 3], [2, 2], [1, 1], [1, 1], False),   # ResNet stem
    ([5, 5], [1, 1], [2, 2], [1, 1], False),   # YOLO SPPF
    ([2, 2], [2, 2], [0, 0], [1, 1], True),
    ([3, 2], [2, 3], [1, 0], [2, 1], True),
    ([3, 3], [], [1, 1], [1, 1], True),        # empty stride = kernel
    ([2, 3], [1, 2], [1, 1], [3, 2], False),
]


def _run(kit, stream, x_np, kernel, stride, padding, dilation, ceil_mode, layout="packed",
         out_layout="packed", with_indices=True):
    ref_v, ref_i = torch.ops.aten.max_pool2d_with_indices(
        torch.from_numpy(x_np.astype(np.float32)), kernel, stride, padding, dilation,
        ceil_mode)
    dtype = str(x_np.dtype)
    out = kit.out(tuple(ref_v.shape), dtype, out_layout)
    idx = kit.out(tuple(ref_v.shape), "int64", out_layout) if with_indices else None
    max_pool2d(stream, out, kit.tensor(x_np, layout), kernel, stride, padding, dilation,
               ceil_mode, indices_out=idx)
    np.testing.assert_array_equal(kit.read(out).astype(np.float32), ref_v.numpy())
    if with_indices:
        np.testing.assert_array_equal(kit.read(idx), ref_i.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_max_pool2d_matches_torch(kit, stream, dtype, case):
    _run(kit, stream, kit.randn((2, 3, 11, 10), dtype), *CASES[case])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_max_pool2d_values_only_matches_torch(kit, stream, dtype, case):
    # Without indices the op takes another path (a running maximum over the taps).
    x = kit.randn((2, 3, 11, 10), dtype)
    x[0, 0, 0, :] = -np.inf
    x[1, 2, 4, 4] = np.nan
    _run(kit, stream, x, *CASES[case], with_indices=False)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_max_pool2d_views_in_place(kit, stream, layout):
    _run(kit, stream, kit.randn((2, 3, 9, 8), "float32"), *CASES[0], layout=layout,
         out_layout=layout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("channels", [16, 5])
def test_max_pool2d_nhwc_values_only(kit, stream, dtype, case, channels):
    """Dense NHWC views without indices (a channels-last network's pool): on cuda the
    vectorized kernel (16 channels: 16-byte lanes; 5: one channel a thread), with NaN and
    -inf among the values."""
    x_np = kit.randn((2, channels, 9, 10), dtype)
    x_np[0, 1, 2, 3], x_np[1, 3, 4, 4] = np.nan, -np.inf
    _run(kit, stream, x_np, *CASES[case], layout="channels_last", out_layout="channels_last",
         with_indices=False)


def test_max_pool2d_unbatched_and_without_indices(kit, stream):
    _run(kit, stream, kit.randn((3, 7, 7), "bfloat16"), *CASES[3], with_indices=False)
    _run(kit, stream, kit.randn((3, 7, 7), "float32"), *CASES[1])


def test_max_pool2d_ties_take_the_first(kit, stream):
    x = np.round(kit.randn((1, 2, 8, 8), "float32")).astype(np.float32)  # many ties
    _run(kit, stream, x, [3, 3], [1, 1], [1, 1], [1, 1], False)


def test_max_pool2d_nan_and_minus_inf_windows(kit, stream):
    x = kit.randn((1, 1, 6, 6), "float32")
    x[0, 0, 0, :] = -np.inf          # windows at the padded top edge: only -inf and padding
    x[0, 0, 1, :] = -np.inf
    x[0, 0, 3, 3] = np.nan
    x[0, 0, 4, 4] = np.nan           # two NaNs in one window: torch takes the last
    _run(kit, stream, x, [3, 3], [1, 1], [1, 1], [1, 1], False)


@pytest.mark.parametrize("case", [
    # x shape, kernel, stride, padding, dilation: dilated windows that hold only padding
    ((1, 2, 1, 1), [1, 2], [1, 2], [0, 1], [1, 2]),
    ((1, 1, 1, 3), [2, 2], [1, 1], [1, 1], [2, 3]),
    ((2, 1, 2, 3), [2, 3], [1, 1], [1, 1], [3, 1]),
])
def test_max_pool2d_windows_of_padding_only(kit, stream, case):
    # torch gives -inf and the window's first tap moved past the padding (maybe beyond the
    # plane) as the index; the op must agree on every device.
    shape, *geometry = case
    _run(kit, stream, kit.randn(shape, "float32"), *geometry, False)


def test_max_pool2d_chunked(kit, stream, monkeypatch):
    from aotrt.runtime.ops import _common
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)
    _run(kit, stream, kit.randn((3, 2, 7, 7), "float32"), *CASES[0])


def test_max_pool2d_via_registry(kit, stream):
    x_np = kit.randn((1, 2, 6, 6), "float32")
    ref_v, ref_i = torch.ops.aten.max_pool2d_with_indices(torch.from_numpy(x_np), [2, 2])
    out, idx = kit.out((1, 2, 3, 3), "float32"), kit.out((1, 2, 3, 3), "int64")
    OPS["max_pool2d"](stream, [out, idx], [kit.tensor(x_np)], kernel_size=[2, 2], stride=[],
                      padding=[0, 0], dilation=[1, 1], ceil_mode=False)
    np.testing.assert_array_equal(kit.read(out), ref_v.numpy())
    np.testing.assert_array_equal(kit.read(idx), ref_i.numpy())
    out1 = kit.out((1, 2, 3, 3), "float32")
    OPS["max_pool2d"](stream, [out1], [kit.tensor(x_np)], kernel_size=2)
    np.testing.assert_array_equal(kit.read(out1), ref_v.numpy())


def test_max_pool2d_output_over_its_input_reads_old_values(kit, stream, monkeypatch):
    from aotrt.runtime.ops import _common
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)  # one sample per step
    x_np = kit.randn((3, 2, 6, 6), "float32")
    x = kit.tensor(x_np)
    out = kit.view(x, [3, 2, 3, 3], [18, 9, 3, 1], 72)  # sample 0's result lands on x[1]
    max_pool2d(stream, out, x, [2, 2], [], [0, 0], [1, 1], False)
    ref = torch.nn.functional.max_pool2d(torch.from_numpy(x_np), 2)
    np.testing.assert_array_equal(kit.read(out), ref.numpy())

# -- refused inputs -----------------------------------------------------------------------------

def _call(kit, stream, shape=(1, 2, 6, 6), out_shape=(1, 2, 3, 3), kernel=(2, 2), stride=(),
          padding=(0, 0), dilation=(1, 1), dtype="float32", idx_dtype=None):
    x = kit.tensor(kit.randn(shape, dtype))
    idx = None if idx_dtype is None else kit.out(out_shape, idx_dtype)
    max_pool2d(stream, kit.out(out_shape, dtype), x, list(kernel), list(stride), list(padding),
               list(dilation), False, indices_out=idx)


def test_refuses_padding_over_half_the_kernel(kit, stream):
    with pytest.raises(InvalidArgument, match="padding"):
        _call(kit, stream, kernel=(3, 3), padding=(2, 2), out_shape=(1, 2, 4, 4))


def test_refuses_zero_kernel(kit, stream):
    with pytest.raises(InvalidArgument, match="kernel_size"):
        _call(kit, stream, kernel=(0, 2))


def test_refuses_zero_stride(kit, stream):
    with pytest.raises(InvalidArgument, match="stride"):
        _call(kit, stream, stride=(0, 1))


def test_refuses_output_too_small(kit, stream):
    with pytest.raises(InvalidArgument, match="too small"):
        _call(kit, stream, shape=(1, 2, 2, 2), kernel=(3, 3))


def test_refuses_wrong_rank(kit, stream):
    with pytest.raises(InvalidArgument, match="x: expected a 3 or 4-D"):
        _call(kit, stream, shape=(2, 6, 6, 1, 1))


def test_refuses_zero_channels(kit, stream):
    with pytest.raises(InvalidArgument, match="non-zero"):
        _call(kit, stream, shape=(1, 0, 6, 6), out_shape=(1, 0, 3, 3))


def test_refuses_wrong_out_shape(kit, stream):
    with pytest.raises(InvalidArgument, match="out: expected sizes"):
        _call(kit, stream, out_shape=(1, 2, 3, 4))


def test_refuses_int32_indices(kit, stream):
    with pytest.raises(InvalidArgument, match="indices_out: dtype must be int64"):
        _call(kit, stream, idx_dtype="int32")


def test_refuses_int_input(kit, stream):
    with pytest.raises(Unsupported, match="int64"):
        _call(kit, stream, dtype="int64")


def test_registry_requires_kernel_size(kit, stream):
    with pytest.raises(InvalidArgument, match="kernel_size"):
        OPS["max_pool2d"](stream, [kit.out((1, 2, 3, 3), "float32")],
                          [kit.tensor(kit.randn((1, 2, 6, 6), "float32"))])
