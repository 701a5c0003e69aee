"""convolution against torch (float64 reference): 1-D, 2-D and 3-D, strides, padding,
dilation, groups, transposed with output padding, bias, every layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.ops import OPS, convolution
from tests.runtime.ops.conftest import check_tf32, geometry

DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("packed", "offset", "strided", "transposed")


def _ref(kit, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    return torch.ops.aten.convolution(kit.t64(x), kit.t64(w), None if b is None else kit.t64(b),
                                      stride, padding, dilation, transposed, output_padding,
                                      groups)


def _run(kit, stream, dtype, x_shape, w_shape, bias, stride, padding, dilation,
         transposed=False, output_padding=None, groups=1, layouts=("packed",) * 4):
    nd = len(w_shape) - 2
    output_padding = output_padding or [0] * nd
    x_np, w_np = kit.randn(x_shape, dtype), kit.randn(w_shape, dtype, 0.5)
    cout = w_shape[1] * groups if transposed else w_shape[0]
    b_np = kit.randn((cout,), dtype) if bias else None
    ref = _ref(kit, x_np, w_np, b_np, stride, padding, dilation, transposed, output_padding,
               groups)
    x, w = kit.tensor(x_np, layouts[0]), kit.tensor(w_np, layouts[1])
    b = kit.tensor(b_np, layouts[2]) if bias else None
    out = kit.out(tuple(ref.shape), dtype, layouts[3])
    convolution(stream, out, x, w, b, stride, padding, dilation, transposed, output_padding,
                groups)
    kit.close(kit.read(out), ref, dtype)


CASES_2D = [
    # x, w, bias, stride, padding, dilation, groups
    ((2, 4, 9, 8), (6, 4, 3, 3), True, [1, 1], [1, 1], [1, 1], 1),
    ((1, 4, 9, 8), (6, 2, 3, 2), False, [2, 1], [0, 1], [1, 2], 2),
    ((3, 6, 7, 7), (6, 1, 3, 3), True, [2, 2], [1, 1], [1, 1], 6),   # depthwise
    ((2, 6, 7, 7), (12, 1, 3, 3), True, [1, 2], [1, 0], [2, 1], 6),  # depthwise, 2 per channel
    ((2, 8, 5, 6), (4, 8, 1, 1), True, [1, 1], [0, 0], [1, 1], 1),   # 1x1
    ((1, 3, 12, 11), (5, 3, 5, 5), True, [3, 2], [2, 2], [1, 1], 1),
    ((2, 4, 10, 10), (4, 2, 3, 3), False, [1, 1], [2, 2], [2, 2], 2),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES_2D)))
def test_conv2d_matches_torch(kit, stream, dtype, case):
    x, w, bias, s, p, d, g = CASES_2D[case]
    _run(kit, stream, dtype, x, w, bias, s, p, d, groups=g)


@pytest.mark.parametrize("layout", LAYOUTS + ("channel_slice",))
def test_conv2d_reads_and_writes_views_in_place(kit, stream, layout):
    _run(kit, stream, "float32", (2, 4, 7, 6), (6, 2, 3, 3), True, [1, 2], [1, 0], [1, 1],
         groups=2, layouts=(layout,) * 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["packed", "channels_last"])
@pytest.mark.parametrize("case", [
    # Inception's factored kernels: (7, 1) and (1, 7), (3, 1) and (1, 3)
    ((1, 128, 17, 17), (160, 128, 7, 1), [3, 0]),
    ((1, 128, 17, 17), (160, 128, 1, 7), [0, 3]),
    ((2, 24, 8, 8), (32, 24, 3, 1), [1, 0]),
    ((2, 24, 8, 8), (32, 24, 1, 3), [0, 1]),
])
def test_conv2d_factored_kernels(kit, stream, dtype, layout, case):
    """Size-1 kernel dims keep the strides of the packed layout they are in: a (7, 1) KCRS
    weight whose S got the largest stride gave an error of 1.4 at float32 on the H200
    (Inception-ResNet-v2's Block17, 2026-12-03)."""
    x, w, p = case
    _run(kit, stream, dtype, x, w, True, [1, 1], p, [1, 1], layouts=(layout,) * 4)


CASES_1D = [
    ((1, 8, 5), (6, 8, 3), False, [1], [1], [1], 1),     # §5 conv1d_nobias
    ((2, 6, 17), (4, 3, 4), True, [2], [3], [2], 2),
    ((3, 4, 9), (8, 1, 3), True, [1], [0], [3], 4),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES_1D)))
def test_conv1d_matches_torch(kit, stream, dtype, case):
    x, w, bias, s, p, d, g = CASES_1D[case]
    _run(kit, stream, dtype, x, w, bias, s, p, d, groups=g, layouts=("strided", "transposed",
                                                                     "offset", "strided"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv1d_bias_whisper_shape(kit, stream, dtype):
    # behaviors.md §5 conv1d_bias: Conv1d 80 -> 384, k3 p1, on (1, 80, 3000).
    _run(kit, stream, dtype, (1, 80, 3000), (384, 80, 3), True, [1], [1], [1])


@pytest.mark.slow
def test_conv1d_voxtral_shape(kit, stream):
    if stream.options.deferred:
        pytest.skip("full size runs once, on the async stream")
    # behaviors.md §5 conv1d_voxtral: Conv1d 128 -> 1280, k3 p1, no bias, (10, 128, 3000);
    # batch 2 keeps it quick, the per-sample work is the full one.
    _run(kit, stream, "float32", (2, 128, 3000), (1280, 128, 3), False, [1], [1], [1])


CASES_T = [
    # x, w (Cin, Cout/g, k...), bias, stride, padding, dilation, output_padding, groups
    ((2, 4, 5, 6), (4, 3, 3, 3), True, [2, 2], [1, 1], [1, 1], [1, 1], 1),
    ((1, 6, 4, 4), (6, 2, 2, 2), False, [2, 2], [0, 0], [1, 1], [0, 0], 3),  # YOLO-like up
    ((1, 4, 3, 5), (4, 2, 3, 2), True, [3, 2], [2, 0], [2, 1], [2, 1], 2),
    ((2, 2, 4, 4), (2, 3, 4, 4), True, [1, 1], [3, 3], [1, 1], [0, 0], 1),   # p > op
    ((1, 4, 7), (4, 5, 3), True, [2], [1], [1], [1], 1),                     # 1-D
    ((2, 4, 6), (4, 1, 5), False, [3], [2], [2], [2], 4),                    # 1-D groups
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES_T)))
def test_transposed_conv_matches_torch(kit, stream, dtype, case):
    x, w, bias, s, p, d, op, g = CASES_T[case]
    _run(kit, stream, dtype, x, w, bias, s, p, d, True, op, g,
         layouts=("offset", "strided", "packed", "transposed"))


CASES_3D = [
    # x, w, bias, stride, padding, dilation, groups (r3d_18's stem and blocks, smaller)
    ((2, 3, 5, 9, 8), (4, 3, 3, 7, 7), False, [1, 2, 2], [1, 3, 3], [1, 1, 1], 1),
    ((1, 4, 6, 7, 7), (6, 4, 3, 3, 3), True, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1),
    ((2, 4, 4, 5, 6), (8, 4, 1, 1, 1), True, [2, 1, 2], [0, 0, 0], [1, 1, 1], 1),  # 1x1x1
    ((1, 4, 7, 6, 7), (6, 2, 3, 2, 3), True, [1, 2, 1], [2, 0, 1], [2, 1, 2], 2),  # dilated
    ((2, 6, 5, 5, 5), (6, 1, 3, 3, 3), False, [1, 1, 2], [1, 1, 1], [1, 2, 1], 6),  # depthwise
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES_3D)))
def test_conv3d_matches_torch(kit, stream, dtype, case):
    x, w, bias, s, p, d, g = CASES_3D[case]
    _run(kit, stream, dtype, x, w, bias, s, p, d, groups=g)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conv3d_reads_and_writes_views_in_place(kit, stream, layout):
    _run(kit, stream, "float32", (2, 4, 4, 5, 6), (6, 2, 2, 3, 3), True, [1, 2, 1],
         [1, 0, 1], [1, 1, 2], groups=2, layouts=(layout,) * 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    # R(2+1)D's factored kernels: temporal (3, 1, 1) and spatial (1, 3, 3), odd channels
    ((1, 45, 4, 6, 6), (64, 45, 3, 1, 1), [1, 1, 1], [1, 0, 0]),
    ((2, 16, 4, 6, 6), (45, 16, 1, 3, 3), [1, 2, 2], [0, 1, 1]),
])
def test_conv3d_factored_kernels_channels_last(kit, stream, dtype, case):
    # Size-1 kernel dims in NDHWC weights: their strides must not reorder the layout.
    x, w, s, p = case
    _run(kit, stream, dtype, x, w, True, s, p, [1, 1, 1], layouts=("channels_last",) * 4)


CASES_3D_T = [
    # x, w (Cin, Cout/g, k...), bias, stride, padding, dilation, output_padding, groups
    ((2, 4, 3, 4, 5), (4, 3, 3, 3, 3), True, [2, 2, 2], [1, 1, 1], [1, 1, 1], [1, 0, 1], 1),
    ((1, 6, 3, 3, 4), (6, 2, 2, 3, 2), False, [1, 2, 3], [0, 1, 0], [2, 1, 1], [1, 1, 2], 3),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", range(len(CASES_3D_T)))
def test_transposed_conv3d_matches_torch(kit, stream, dtype, case):
    x, w, bias, s, p, d, op, g = CASES_3D_T[case]
    if kit.dev.name == "cuda":
        # NOTE: cuda has no transposed 3-D convolution (cuDNN's 3-D dgrad refused these)
        with pytest.raises(Unsupported, match="transposed 3-D"):
            _run(kit, stream, dtype, x, w, bias, s, p, d, True, op, g)
        return
    _run(kit, stream, dtype, x, w, bias, s, p, d, True, op, g,
         layouts=("offset", "strided", "packed", "transposed"))


def test_conv3d_batch_chunks_give_the_same_result(kit, stream, monkeypatch):
    from aotrt.runtime.ops import _common
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)  # one sample per step
    _run(kit, stream, "float32", (3, 2, 4, 5, 5), (4, 2, 3, 3, 3), True, [1, 2, 1], [1, 1, 0],
         [1, 1, 1])
    if kit.dev.name == "cuda":
        return              # no transposed 3-D convolution on cuda
    _run(kit, stream, "float32", (3, 2, 3, 4, 4), (2, 4, 2, 3, 3), True, [2, 1, 2], [0, 1, 1],
         [1, 1, 1], True, [1, 0, 1])


def test_unbatched_conv3d(kit, stream):
    x_np, w_np = kit.randn((3, 4, 5, 6), "float32"), kit.randn((2, 3, 2, 3, 3), "float32")
    out = kit.out((2, 3, 3, 4), "float32", "strided")
    convolution(stream, out, kit.tensor(x_np), kit.tensor(w_np), None, [1], [0], [1], False,
                [0], 1)
    ref = torch.nn.functional.conv3d(kit.t64(x_np), kit.t64(w_np))
    kit.close(kit.read(out), ref, "float32")


@pytest.mark.parametrize("bias_stride", [0, 2])
@pytest.mark.parametrize("shape", [((1, 1, 1), (2, 1, 1)), ((2, 3, 6, 5), (4, 3, 3, 3))])
def test_bias_of_any_stride(kit, stream, bias_stride, shape):
    """A broadcast (stride 0) or strided bias: oneDNN read a stride-0 bias as a dense one,
    past the view's end (hypothesis found a 1x1 conv1d: its channel 2 got 0)."""
    x_shape, w_shape = shape
    x_np, w_np = kit.randn(x_shape, "float32"), kit.randn(w_shape, "float32")
    cout = w_shape[0]
    b_np = (np.full((cout,), 3.25, np.float32) if bias_stride == 0
            else kit.randn((cout,), "float32"))
    nd = len(w_shape) - 2
    ref = _ref(kit, x_np, w_np, b_np, [1] * nd, [0] * nd, [1] * nd, False, [0] * nd, 1)
    out = kit.out(tuple(ref.shape), "float32")
    convolution(stream, out, kit.tensor(x_np), kit.tensor(w_np),
                kit.tensor(b_np, strides=(bias_stride,), offset=1), [1] * nd, [0] * nd,
                [1] * nd, False, [0] * nd, 1)
    kit.close(kit.read(out), ref, "float32")


def test_unbatched_input(kit, stream):
    x_np, w_np = kit.randn((4, 6, 5), "float32"), kit.randn((3, 4, 3, 3), "float32")
    out = kit.out((3, 4, 3), "float32", "strided")
    convolution(stream, out, kit.tensor(x_np), kit.tensor(w_np), None, [1, 1], [0, 0], [1, 1],
                False, [0, 0], 1)
    ref = torch.nn.functional.conv2d(kit.t64(x_np), kit.t64(w_np))
    kit.close(kit.read(out), ref, "float32")


def test_empty_batch_records_nothing(kit, stream):
    before = stream.recorded_seq
    out = kit.out((0, 3, 4, 4), "float32")
    convolution(stream, out, kit.tensor(kit.randn((0, 2, 4, 4), "float32")),
                kit.tensor(kit.randn((3, 2, 1, 1), "float32")), None, [1], [0], [1], False,
                [0], 1)
    assert stream.recorded_seq == before


def test_defaults_and_broadcast_params_via_registry(kit, stream):
    # aten lists may be shorter: a 1-element list repeats, an empty one takes the default.
    x_np, w_np = kit.randn((1, 2, 6, 5), "float32"), kit.randn((3, 2, 3, 3), "float32")
    out = kit.out((1, 3, 4, 3), "float32")
    OPS["convolution"](stream, [out], [kit.tensor(x_np), kit.tensor(w_np), None], stride=[1],
                       padding=[], dilation=1, transposed=False, output_padding=[], groups=1)
    kit.close(kit.read(out), torch.nn.functional.conv2d(kit.t64(x_np), kit.t64(w_np)),
              "float32")


def test_non_transposed_ignores_output_padding_like_aten(kit, stream):
    _run(kit, stream, "float32", (1, 2, 6, 6), (3, 2, 3, 3), True, [1, 1], [1, 1], [1, 1],
         False, [1, 1])


def test_batch_chunks_give_the_same_result(kit, stream, monkeypatch):
    from aotrt.runtime.ops import _common
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)  # one sample per step
    _run(kit, stream, "float32", (3, 2, 5, 5), (4, 2, 3, 3), True, [1, 1], [1, 1], [1, 1])
    _run(kit, stream, "float32", (3, 2, 5, 5), (2, 4, 3, 3), True, [2, 2], [1, 1], [1, 1],
         True, [1, 1])


def test_output_overlapping_the_input_reads_old_values(kit, stream, monkeypatch):
    # A 1x1 conv whose output is its input's memory shifted by one sample, one sample per
    # step: without reading through a temporary, sample 0's result would clobber x[1].
    from aotrt.runtime.ops import _common
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)
    x_np, w_np = kit.randn((3, 4, 5, 5), "float32"), kit.randn((4, 4, 1, 1), "float32")
    buf = kit.out((4, 4, 5, 5), "float32")
    x = kit.view(buf, [3, 4, 5, 5], [100, 25, 5, 1], 0)
    kit.dev.write(x, x_np)
    out = kit.view(buf, [3, 4, 5, 5], [100, 25, 5, 1], 100)
    convolution(stream, out, x, kit.tensor(w_np), None, [1, 1], [0, 0], [1, 1], False, [0, 0],
                1)
    ref = torch.nn.functional.conv2d(kit.t64(x_np), kit.t64(w_np))
    kit.close(kit.read(out), ref, "float32")


# -- refused inputs -----------------------------------------------------------------------------

def _conv(kit, stream, x_shape, w_shape, out_shape, bias=None, stride=(1, 1), padding=(0, 0),
          dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1,
          dtype="float32"):
    x = kit.tensor(kit.randn(x_shape, dtype))
    w = kit.tensor(kit.randn(w_shape, dtype))
    b = None if bias is None else kit.tensor(kit.randn(bias, dtype))
    convolution(stream, kit.out(out_shape, dtype), x, w, b, list(stride), list(padding),
                list(dilation), transposed, list(output_padding), groups)


def test_refuses_4d_weight_for_5d_input(kit, stream):
    with pytest.raises(InvalidArgument, match="x: expected a 4-D"):
        _conv(kit, stream, (1, 2, 3, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4))


def test_refuses_6d_weight(kit, stream):
    with pytest.raises(InvalidArgument, match="w: expected a 3 or 4 or 5-D"):
        _conv(kit, stream, (1, 2, 2, 3, 4, 4), (2, 2, 1, 1, 1, 1), (1, 2, 2, 3, 4, 4))


def test_refuses_input_rank_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="x: expected a 4-D"):
        _conv(kit, stream, (1, 1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4))


def test_refuses_channel_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="input channels"):
        _conv(kit, stream, (1, 3, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4))


def test_refuses_groups_not_dividing_outputs(kit, stream):
    with pytest.raises(InvalidArgument, match="groups"):
        _conv(kit, stream, (1, 4, 4, 4), (3, 2, 1, 1), (1, 3, 4, 4), groups=2)


def test_refuses_zero_groups(kit, stream):
    with pytest.raises(InvalidArgument, match="groups: must be >= 1"):
        _conv(kit, stream, (1, 4, 4, 4), (3, 2, 1, 1), (1, 3, 4, 4), groups=0)


def test_refuses_negative_padding(kit, stream):
    with pytest.raises(InvalidArgument, match="padding"):
        _conv(kit, stream, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4), padding=(-1, 0))


def test_refuses_zero_stride(kit, stream):
    with pytest.raises(InvalidArgument, match="stride"):
        _conv(kit, stream, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4), stride=(0, 1))


def test_refuses_kernel_larger_than_input(kit, stream):
    with pytest.raises(InvalidArgument, match="smaller than the dilated kernel"):
        _conv(kit, stream, (1, 2, 2, 2), (2, 2, 3, 3), (1, 2, 1, 1))


def test_refuses_big_output_padding(kit, stream):
    with pytest.raises(InvalidArgument, match="output_padding"):
        _conv(kit, stream, (1, 2, 3, 3), (2, 2, 3, 3), (1, 2, 7, 7), stride=(2, 2),
              transposed=True, output_padding=(2, 0))


def test_refuses_transposed_output_too_small(kit, stream):
    with pytest.raises(InvalidArgument, match="too small"):
        _conv(kit, stream, (1, 4, 1, 1), (4, 2, 3, 3), (1, 2, 1, 1), padding=(2, 2),
              transposed=True)


def test_refuses_wrong_bias(kit, stream):
    with pytest.raises(InvalidArgument, match="bias: expected 2"):
        _conv(kit, stream, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4), bias=(3,))


def test_refuses_wrong_out_shape(kit, stream):
    with pytest.raises(InvalidArgument, match="out: expected sizes"):
        _conv(kit, stream, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 5))


def test_refuses_wrong_param_length(kit, stream):
    with pytest.raises(InvalidArgument, match="dilation"):
        _conv(kit, stream, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4), dilation=(1, 1, 1))


def test_refuses_non_bool_transposed(kit, stream):
    with pytest.raises(InvalidArgument, match="transposed"):
        _conv(kit, stream, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4), transposed="yes")


def test_refuses_int_dtype(kit, stream):
    with pytest.raises(Unsupported, match="int64"):
        _conv(kit, stream, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4), dtype="int64")


# -- the cpu device's oneDNN path ---------------------------------------------------------------

def _dnnl(kit):
    """The cpu device's oneDNN state; skips off cpu or where the package is not installed."""
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    if kit.dev.name != "cpu":
        pytest.skip("oneDNN serves the cpu device")
    if cpu_dnnl.find_library() is None:
        pytest.skip(f"{cpu_dnnl.DIST} is not installed")
    dnnl = kit.dev.libraries.dnnl
    assert dnnl is not None, "onednn-cpu-gomp is installed but the device did not load it"
    return dnnl


DNNL_CASES = {
    # x, w, bias, stride, padding, dilation, groups, layout
    "depthwise": ((2, 32, 9, 9), (32, 1, 3, 3), True, [2, 2], [1, 1], [1, 1], 32, "packed"),
    "depthwise_nhwc": ((1, 32, 24, 20), (64, 1, 3, 3), True, [1, 1], [1, 1], [1, 1], 32,
                       "channels_last"),
    "grouped": ((2, 32, 9, 9), (32, 16, 3, 3), True, [1, 1], [1, 1], [1, 1], 2, "packed"),
    "dilated": ((1, 16, 12, 12), (16, 16, 3, 3), False, [1, 1], [2, 2], [2, 2], 1, "offset"),
    "channels_last": ((2, 16, 8, 8), (24, 16, 3, 3), True, [1, 2], [1, 1], [1, 1], 1,
                      "channels_last"),
    "conv1d": ((2, 16, 20), (32, 16, 3), True, [2], [1], [1], 1, "packed"),
}


def _cpu_has_bf16_isa() -> bool:
    """oneDNN 3.2 runs bfloat16 convolutions from AVX-512 (avx512_core) up; an AVX2 CPU has
    none, and oneDNN refuses them there."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx512bw" in flags and " avx512vl" in flags


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(DNNL_CASES))
def test_cpu_convolution_runs_through_onednn(kit, stream, case, dtype):
    dnnl = _dnnl(kit)
    x, w, bias, s, p, d, g, layout = DNNL_CASES[case]
    before = dict(dnnl.stats)
    _run(kit, stream, dtype, x, w, bias, s, p, d, groups=g, layouts=(layout,) * 4)
    if dtype == "bfloat16" and not _cpu_has_bf16_isa():
        # refused at plan time (or found refused in the cache), and the numpy path gave
        # the (checked) answer
        assert dnnl.stats["refused"] >= 1 and dnnl.stats["runs"] == before["runs"]
        assert dnnl.stats["numpy"] == before["numpy"] + 1, (case, dnnl.stats)
        return
    assert dnnl.stats["runs"] == before["runs"] + 1, (case, dnnl.stats)
    assert dnnl.stats["numpy"] == before["numpy"]


def test_onednn_primitives_are_cached_on_the_device(kit, stream):
    dnnl = _dnnl(kit)
    case = ((1, 16, 6, 6), (16, 16, 3, 3), True, [1, 1], [1, 1], [1, 1])
    _run(kit, stream, "float32", *case)
    before = dict(dnnl.stats)
    _run(kit, stream, "float32", *case)
    assert dnnl.stats["hits"] == before["hits"] + 1
    assert dnnl.stats["created"] == before["created"]


@pytest.mark.parametrize("layout", ["packed", "channels_last"])
def test_onednn_output_overlapping_the_input_reads_old_values(kit, stream, layout):
    # Output = the input's memory one sample on: NCHW goes through oneDNN's blocked copies,
    # NHWC runs on the views themselves and must read a copy of the input.
    dnnl = _dnnl(kit)
    x_np, w_np = kit.randn((3, 16, 12, 12), "float32"), kit.randn((16, 16, 1, 1), "float32")
    b_np = kit.randn((16,), "float32")
    buf = kit.out((4, 16, 12, 12), "float32")
    strides = [2304, 144, 12, 1] if layout == "packed" else [2304, 1, 192, 16]
    x = kit.view(buf, [3, 16, 12, 12], strides, 0)
    kit.dev.write(x, x_np)
    out = kit.view(buf, [3, 16, 12, 12], strides, 2304)
    runs = dnnl.stats["runs"]
    convolution(stream, out, x, kit.tensor(w_np), kit.tensor(b_np), [1, 1], [0, 0], [1, 1],
                False, [0, 0], 1)
    ref = torch.nn.functional.conv2d(kit.t64(x_np), kit.t64(w_np), kit.t64(b_np))
    kit.close(kit.read(out), ref, "float32")
    assert dnnl.stats["runs"] == runs + 1


def test_onednn_weights_overlapping_the_output_read_old_values(kit, stream):
    # The weights live in the bytes the output overwrites (a hostile but legal program).
    dnnl = _dnnl(kit)
    x_np, w_np = kit.randn((1, 16, 12, 12), "float32"), kit.randn((16, 16, 1, 1), "float32")
    buf = kit.out((16 * 144,), "float32")
    w = kit.view(buf, [16, 16, 1, 1], [16, 1, 1, 1], 0)
    kit.dev.write(w, w_np)
    out = kit.view(buf, [1, 16, 12, 12], [2304, 1, 192, 16], 0)
    runs = dnnl.stats["runs"]
    convolution(stream, out, kit.tensor(x_np, "channels_last"), w, None, [1, 1], [0, 0],
                [1, 1], False, [0, 0], 1)
    ref = torch.nn.functional.conv2d(kit.t64(x_np), kit.t64(w_np))
    kit.close(kit.read(out), ref, "float32")
    assert dnnl.stats["runs"] == runs + 1


def test_onednn_cache_evicts_least_recently_used(kit, stream, monkeypatch):
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    dnnl = _dnnl(kit)
    monkeypatch.setattr(cpu_dnnl, "MAX_CACHED", 1)
    a = ((1, 16, 7, 7), (16, 16, 3, 3), True, [1, 1], [1, 1], [1, 1])
    b = ((1, 16, 7, 7), (32, 16, 3, 3), True, [1, 1], [1, 1], [1, 1])
    _run(kit, stream, "float32", *a)
    _run(kit, stream, "float32", *b)     # evicts a (its work, already run, lets it go)
    before = dict(dnnl.stats)
    _run(kit, stream, "float32", *a)
    assert dnnl.stats["created"] == before["created"] + 1, (before, dnnl.stats)
    assert dnnl.stats["hits"] == before["hits"]


EPILOGUE_CASES = [
    # x, w, stride, padding, groups, transposed
    ((2, 8, 9, 8), (16, 8, 3, 3), [1, 1], [1, 1], 1, False),
    ((1, 16, 8, 8), (16, 1, 3, 3), [1, 1], [1, 1], 16, False),    # depthwise
    ((2, 8, 6, 6), (8, 8, 1, 1), [1, 1], [0, 0], 1, False),       # 1x1
    ((1, 8, 5, 5), (8, 4, 3, 3), [2, 2], [1, 1], 1, True),        # transposed: kernel after
]


def _act(ref, activation: str):
    """torch's activation of a float64 reference (conv.ACTIVATIONS)."""
    return {"none": lambda t: t, "relu": torch.relu, "relu6": torch.nn.functional.relu6,
            "silu": torch.nn.functional.silu}[activation](ref)


EPILOGUE_LAYOUTS = [("packed", "packed"), ("offset", "packed"), ("channels_last", "packed"),
                    ("channels_last", "channels_last"), ("channel_slice", "channels_last"),
                    ("channel_slice", "packed")]
EPILOGUE_ACTIVATIONS = ["none", "relu", "relu6", "silu"]


def _epilogue_params() -> list:
    """(case, layout, w_layout, activation): 96 a dtype and stream. The CI slice keeps a Latin
    square, activation (layouts + case) % 4, in which every layout pair meets every
    activation and so does every case; the other 72 (about 20 s on 2 cores) are slow."""
    return [pytest.param(c, lay, w_lay, act, id=f"{lay}-{w_lay}-{c}-{act}",
                         marks=[] if a == (i + c) % 4 else [pytest.mark.slow])
            for i, (lay, w_lay) in enumerate(EPILOGUE_LAYOUTS)
            for c in range(len(EPILOGUE_CASES))
            for a, act in enumerate(EPILOGUE_ACTIVATIONS)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case,layout,w_layout,activation", _epilogue_params())
def test_conv_epilogue_matches_torch(kit, stream, dtype, activation, case, layout, w_layout):
    """out = act(conv + bias + residual) in one library call, against float64 torch; the
    residual and output are views of any layout, the weights KCRS or KRSC (channels-last
    activations with KRSC weights are what the exporter makes; on cuda that runs as one
    cuDNN graph, the mixed layouts as the convolution and then one epilogue kernel)."""
    x_shape, w_shape, stride, padding, groups, transposed = EPILOGUE_CASES[case]
    x_np, w_np = kit.randn(x_shape, dtype), kit.randn(w_shape, dtype, 0.5)
    cout = w_shape[1] * groups if transposed else w_shape[0]
    b_np = kit.randn((cout,), dtype)
    ref = _ref(kit, x_np, w_np, b_np, stride, padding, [1, 1], transposed, [0, 0], groups)
    r_np = kit.randn(tuple(ref.shape), dtype)
    ref = _act(ref + kit.t64(r_np), activation)
    x, w, b = kit.tensor(x_np, layout), kit.tensor(w_np, w_layout), kit.tensor(b_np, "packed")
    r = kit.tensor(r_np, layout)
    out = kit.out(tuple(ref.shape), dtype, layout)
    convolution(stream, out, x, w, b, stride, padding, [1, 1], transposed, [0, 0], groups,
                residual=r, activation=activation)
    kit.close(kit.read(out), ref, dtype)


@pytest.mark.parametrize("activation", ["relu", "relu6", "silu"])
@pytest.mark.parametrize("layout", ["packed", "channels_last"])
def test_conv_epilogue_without_residual(kit, stream, activation, layout):
    """A lone activation: on cpu a oneDNN post-op of the convolution itself."""
    x_np, w_np = kit.randn((2, 4, 7, 7), "float32", 3.0), kit.randn((6, 4, 3, 3), "float32")
    b_np = kit.randn((6,), "float32")
    ref = _ref(kit, x_np, w_np, b_np, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    ref = _act(ref, activation)
    assert activation != "relu6" or float(ref.max()) == 6.0     # some values are clipped
    out = kit.out(tuple(ref.shape), "float32", layout)
    dnnl = kit.dev.libraries.dnnl if kit.dev.name == "cpu" else None
    before = dict(dnnl.stats) if dnnl is not None else None
    convolution(stream, out, kit.tensor(x_np, layout), kit.tensor(w_np, layout),
                kit.tensor(b_np), [1, 1], [1, 1], [1, 1], activation=activation)
    kit.close(kit.read(out), ref, "float32")
    if dnnl is not None:
        assert dnnl.stats["runs"] == before["runs"] + 1, dnnl.stats
        assert dnnl.stats["numpy"] == before["numpy"]


@pytest.mark.parametrize("activation", ["none", "relu", "relu6", "silu"])
@pytest.mark.parametrize("layout", ["packed", "channels_last", "channel_slice"])
@pytest.mark.parametrize("in_place", [False, True])
def test_cpu_residual_is_a_onednn_post_op(kit, stream, activation, layout, in_place):
    """On cpu, act(conv + bias + residual) over dense NHWC views (what the exporter makes)
    is one oneDNN run with post-ops (binary add, then the activation), the residual read
    in place, or from a copy when the output is over it. oneDNN 3.2 has only its reference
    loops for that over NCHW or channel-sliced views: those run the convolution, then the
    numpy epilogue."""
    dnnl = _dnnl(kit)
    x_np, w_np = kit.randn((1, 8, 7, 7), "float32"), kit.randn((8, 8, 3, 3), "float32", 0.5)
    b_np, r_np = kit.randn((8,), "float32"), kit.randn((1, 8, 7, 7), "float32")
    ref = _act(_ref(kit, x_np, w_np, b_np, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
               + kit.t64(r_np), activation)
    r = kit.tensor(r_np, layout)
    out = r if in_place else kit.out((1, 8, 7, 7), "float32", layout)
    w_layout = "packed" if layout == "packed" else "channels_last"
    before = dict(dnnl.stats)
    convolution(stream, out, kit.tensor(x_np, layout), kit.tensor(w_np, w_layout),
                kit.tensor(b_np), [1, 1], [1, 1], [1, 1], False, [0, 0], 1, residual=r,
                activation=activation)
    kit.close(kit.read(out), ref, "float32")
    assert dnnl.stats["runs"] == before["runs"] + 1, dnnl.stats
    fused = 1 if layout == "channels_last" else 0
    assert dnnl.stats["epilogues"] == before["epilogues"] + fused, dnnl.stats
    assert dnnl.stats["numpy"] == before["numpy"]


@pytest.mark.parametrize("activation", ["relu", "relu6", "silu"])
@pytest.mark.parametrize("layout", ["packed", "channels_last", "channel_slice"])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("kernel", [1, 3])
def test_a_nan_stays_nan_through_the_epilogue(kit, stream, activation, layout, with_residual,
                                              kernel):
    """act(conv + bias (+ residual)) is NaN where torch's is: oneDNN's relu and clip
    post-ops map a NaN to 0, so on cpu those two follow the convolution
    (backends/cpu/ops/activation.py). The NaNs come from the input and from the residual."""
    x_np = kit.randn((1, 16, 6, 7), "float32")
    x_np[0, 3, 2, 4] = np.nan
    w_np = kit.randn((16, 16, kernel, kernel), "float32", 0.5)
    b_np, r_np = kit.randn((16,), "float32"), kit.randn((1, 16, 6, 7), "float32")
    r_np[0, 9, 5, 1] = np.nan
    pad = kernel // 2
    ref = _ref(kit, x_np, w_np, b_np, [1, 1], [pad, pad], [1, 1], False, [0, 0], 1)
    if with_residual:
        ref = ref + kit.t64(r_np)
    ref = _act(ref, activation).numpy()
    assert np.isnan(ref).any() and (np.isfinite(ref) & (ref > 0)).any()
    w_layout = "packed" if layout == "packed" else "channels_last"
    out = kit.out((1, 16, 6, 7), "float32", layout)
    convolution(stream, out, kit.tensor(x_np, layout), kit.tensor(w_np, w_layout),
                kit.tensor(b_np), [1, 1], [pad, pad], [1, 1],
                residual=kit.tensor(r_np, layout) if with_residual else None,
                activation=activation)
    got = kit.read(out)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    fin = ~np.isnan(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-4, atol=1e-4 * np.abs(ref[fin]).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batched", [True, False])
def test_onednn_channel_slices_are_numpy_copies_not_reorders(kit, stream, dtype, batched):
    """A convolution reading and writing channel slices of wider NHWC buffers (YOLO's C2f):
    oneDNN runs it on dense NHWC copies, made with numpy (a oneDNN 3.2 reorder took 40-70
    us each), and the result lands in the slice only."""
    dnnl = _dnnl(kit)
    x_np, w_np = kit.randn((1, 8, 6, 7), dtype), kit.randn((8, 8, 3, 3), dtype, 0.5)
    ref = torch.relu(_ref(kit, x_np, w_np, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    strides, off = geometry((1, 8, 6, 7), "channel_slice")
    nan = np.full((1, 8, 6, 7), np.nan).astype(x_np.dtype)
    if not batched:                 # (C, H, W) views: the primitive adds the batch dim
        x_np, nan, ref, strides = x_np[0], nan[0], ref[0], strides[1:]
    x = kit.tensor(x_np, strides=strides, offset=off)
    out = kit.tensor(nan, strides=strides, offset=off)
    before = dict(dnnl.stats)
    convolution(stream, out, x, kit.tensor(w_np, "channels_last"), None, [1, 1], [1, 1],
                [1, 1], False, [0, 0], 1, activation="relu")
    kit.close(kit.read(out), ref, dtype)
    if dnnl.stats["numpy"] > before["numpy"]:
        pytest.skip(f"oneDNN has no {dtype} convolution on this CPU (numpy ran it)")
    assert dnnl.stats["runs"] == before["runs"] + 1, dnnl.stats
    assert dnnl.stats["copies"] == before["copies"] + 2, dnnl.stats


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["packed", "offset"])
def test_conv3d_epilogue_matches_torch(kit, stream, dtype, layout):
    """A 3-D convolution with bias, residual and SiLU (video models' blocks)."""
    x_np, w_np = kit.randn((2, 4, 3, 5, 6), dtype), kit.randn((6, 4, 3, 3, 3), dtype, 0.5)
    b_np = kit.randn((6,), dtype)
    ref = _ref(kit, x_np, w_np, b_np, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    r_np = kit.randn(tuple(ref.shape), dtype)
    ref = torch.nn.functional.silu(ref + kit.t64(r_np))
    out = kit.out(tuple(ref.shape), dtype, layout)
    convolution(stream, out, kit.tensor(x_np, layout), kit.tensor(w_np), kit.tensor(b_np),
                [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1,
                residual=kit.tensor(r_np, layout), activation="silu")
    kit.close(kit.read(out), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["packed", "channels_last", "channel_slice"])
def test_conv_epilogue_over_its_own_residual_reads_the_old_values(kit, stream, dtype, layout):
    """The exporter may place the output over the residual's memory once the residual dies;
    the residual's copy keeps the layout the library is told it has (an NHWC residual copied
    row-major was read with NHWC strides before)."""
    x_np, w_np = kit.randn((1, 4, 6, 6), dtype), kit.randn((4, 4, 3, 3), dtype, 0.5)
    r_np = kit.randn((1, 4, 6, 6), dtype)
    ref = torch.relu(_ref(kit, x_np, w_np, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
                     + kit.t64(r_np))
    w_layout = "packed" if layout == "packed" else "channels_last"
    r = kit.tensor(r_np, layout)
    convolution(stream, r, kit.tensor(x_np, layout), kit.tensor(w_np, w_layout), None, [1, 1],
                [1, 1], [1, 1], residual=r, activation="relu")
    kit.close(kit.read(r), ref, dtype)


@pytest.mark.parametrize("bad", [{"activation": "gelu"}, {"activation": 1},
                                 {"residual_shape": (1, 4, 5, 6)}])
def test_conv_epilogue_refusals(kit, stream, bad):
    x, w = kit.tensor(kit.randn((1, 4, 6, 6), "float32")), kit.tensor(
        kit.randn((4, 4, 3, 3), "float32"))
    out = kit.out((1, 4, 6, 6), "float32")
    r = kit.tensor(kit.randn(bad.get("residual_shape", (1, 4, 6, 6)), "float32"))
    with pytest.raises(InvalidArgument) as info:
        convolution(stream, out, x, w, None, [1, 1], [1, 1], [1, 1], residual=r,
                    activation=bad.get("activation", "relu"))
    assert "activation" in str(info.value) or "residual" in str(info.value)


@pytest.mark.parametrize("layout", ["packed", "channels_last"])
def test_conv_tf32_only_where_the_stream_allows_it(kit, stream, layout):
    """Fp32Math(conv_tf32=True) lets a float32 convolution take TF32 tensor-core engines on
    cuda (an error near 1e-4 here, as torch's default cudnn.allow_tf32 gives), and the
    default stream keeps float32 (1e-6). The convolution is large enough that TF32 pays
    (backends/cuda/ops/tf32.py keeps float32 where it does not). The cpu has no TF32: the same bits
    either way."""
    from aotrt.runtime.options import Fp32Math, StreamOptions

    x_np, w_np = kit.randn((4, 256, 28, 28), "float32"), kit.randn((256, 256, 3, 3), "float32")
    ref = _ref(kit, x_np, w_np, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    x, w = kit.tensor(x_np, layout), kit.tensor(w_np, layout)
    tf32 = kit.dev.create_stream(StreamOptions(fp32_math=Fp32Math(conv_tf32=True)))
    try:
        got = {}
        for name, s in (("ieee", stream), ("tf32", tf32)):
            out = kit.out(tuple(ref.shape), "float32", layout)
            convolution(s, out, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
            got[name] = kit.read(out)
    finally:
        tf32.close()
    check_tf32(kit.dev.name, got, ref)
