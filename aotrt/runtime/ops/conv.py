"""Convolution (aten.convolution): 1-D, 2-D and 3-D, strided/padded/dilated, grouped,
transposed with output padding, optional bias, into a caller-provided output view.

Input may be batched (N, C, *spatial) or unbatched (C, *spatial). On cpu the forward 1-D
and 2-D convolution runs through oneDNN (backends/cpu/dnnl.py) on the views' own strides where it
is installed and takes the call. Otherwise every convolution runs as a 3-D one in numpy (1-D
and 2-D get leading spatial dims of size 1, as views): im2col through stride tricks plus one
batched GEMM per chunk of samples, or for the transposed one a GEMM followed by a col2im
scatter-add over kernel taps. On cuda (backends/cuda/ops/conv.py), 3-D convolutions go through
cuDNN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import math

from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle


@dataclass(frozen=True)
class ConvParams:
    """Validated convolution geometry (spatial tuples have one entry per spatial dim)."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    transposed: bool
    groups: int
    batched: bool
    out_shape: tuple[int, ...]
    #: the fused epilogue: out = activation(conv + bias + residual)
    activation: str = "none"
    residual: bool = False


#: activations a convolution's epilogue applies (after the bias and the residual add)
ACTIVATIONS = ("none", "relu", "relu6", "silu")


def check_convolution(out: Any, x: Any, w: Any, bias: Any = None, stride: Any = (1,),
                      padding: Any = (0,), dilation: Any = (1,), transposed: Any = False,
                      output_padding: Any = (0,), groups: Any = 1, residual: Any = None,
                      activation: Any = "none") -> tuple[ConvParams, c.OpCost]:
    """Validate convolution's metadata and params like aten.convolution (plus the fused
    epilogue: a residual of the output's shape and an activation); return the geometry
    and the cost."""
    op = "convolution"
    c.check_output(op, out, "out")
    c.check_dtype(op, out, "out")
    for h, name in ((x, "x"), (w, "w")) + (((bias, "bias"),) if bias is not None else ()):
        c.check_same_dtype(op, out, "out", h, name)
    c.check_rank(op, w, "w", (3, 4, 5))
    nd = w.ndim - 2
    if x.ndim not in (nd + 1, nd + 2):
        raise InvalidArgument(f"{op}: x: expected a {nd + 2}-D (or unbatched {nd + 1}-D) input "
                              f"for {w.ndim}-D weight {list(w.sizes)}, got {list(x.sizes)}")
    batched = x.ndim == nd + 2
    xs = x.sizes if batched else (1,) + tuple(x.sizes)
    n, cin, spatial = xs[0], xs[1], xs[2:]
    transposed = c.as_bool(op, transposed, "transposed")
    groups = c.as_int(op, groups, "groups")
    if groups < 1:
        raise InvalidArgument(f"{op}: groups: must be >= 1, got {groups}")
    if groups > max(cin, 1):
        raise InvalidArgument(f"{op}: groups: {groups} is more than the input channels {cin}")
    stride = c.as_ints(op, stride, "stride", nd, default=1, minimum=1)
    padding = c.as_ints(op, padding, "padding", nd, default=0, minimum=0)
    dilation = c.as_ints(op, dilation, "dilation", nd, default=1, minimum=1)
    output_padding = c.as_ints(op, output_padding, "output_padding", nd, default=0, minimum=0)
    kernel = w.sizes[2:]
    if any(k < 1 for k in kernel):
        raise InvalidArgument(f"{op}: w: kernel sizes must be positive, got {list(w.sizes)}")
    if transposed:
        if w.sizes[0] != cin:
            raise InvalidArgument(f"{op}: w: transposed weight {list(w.sizes)} needs dim 0 == "
                                  f"input channels {cin}")
        if cin % groups:
            raise InvalidArgument(f"{op}: groups: {groups} does not divide input channels {cin}")
        cout = w.sizes[1] * groups
        for i in range(nd):
            if not (output_padding[i] < stride[i] or output_padding[i] < dilation[i]):
                raise InvalidArgument(f"{op}: output_padding: {list(output_padding)} must be "
                                      f"smaller than either stride {list(stride)} or dilation "
                                      f"{list(dilation)}")
        out_sp = tuple((spatial[i] - 1) * stride[i] - 2 * padding[i]
                       + dilation[i] * (kernel[i] - 1) + output_padding[i] + 1
                       for i in range(nd))
    else:
        cout = w.sizes[0]
        if w.sizes[1] * groups != cin:
            raise InvalidArgument(f"{op}: w: weight {list(w.sizes)} with groups={groups} needs "
                                  f"{w.sizes[1] * groups} input channels, x has {cin}")
        if cout % groups:
            raise InvalidArgument(f"{op}: groups: {groups} does not divide output channels "
                                  f"{cout}")
        out_sp = []
        for i in range(nd):
            eff = dilation[i] * (kernel[i] - 1) + 1
            if spatial[i] + 2 * padding[i] < eff:
                raise InvalidArgument(f"{op}: x: padded input size {spatial[i] + 2 * padding[i]}"
                                      f" in spatial dim {i} is smaller than the dilated kernel "
                                      f"{eff}")
            out_sp.append((spatial[i] + 2 * padding[i] - eff) // stride[i] + 1)
        out_sp = tuple(out_sp)
    if any(s < 1 for s in out_sp):
        raise InvalidArgument(f"{op}: x: input {list(x.sizes)} gives output size "
                              f"{list(out_sp)}, which is too small")
    if bias is not None:
        c.check_rank(op, bias, "bias", (1,))
        if bias.sizes[0] != cout:
            raise InvalidArgument(f"{op}: bias: expected {cout} elements, got {list(bias.sizes)}")
    out_shape = ((n,) if batched else ()) + (cout,) + out_sp
    c.check_shape(op, out, "out", out_shape)
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise InvalidArgument(f"{op}: activation: expected one of {list(ACTIVATIONS)}, got "
                              f"{activation!r}")
    if residual is not None:
        c.check_same_dtype(op, out, "out", residual, "residual")
        c.check_shape(op, residual, "residual", out_shape)
    p = ConvParams(stride, padding, dilation, output_padding, transposed, groups, batched,
                   out_shape, activation, residual is not None)
    cost = conv_cost(out, x, w, bias, p)
    if residual is not None or activation != "none":
        cost = c.OpCost(cost.work + out.numel, cost.scratch_bytes + _epilogue_bytes(out))
    return p, cost


def _epilogue_bytes(out: Any) -> int:
    """Scratch an epilogue may take: a copy of the residual, float32 temporaries."""
    return out.numel * (out.dtype.itemsize + 16)


def _lifted(x: Any, w: Any, p: ConvParams) -> tuple[tuple[int, ...], ...]:
    """(n, cin, d, h, w), (w0, w1, kd, kh, kw), stride, padding, dilation, output_padding and
    (do, ho, wo) of the 3-D batched convolution the cpu code runs."""
    xs = tuple(x.sizes) if p.batched else (1,) + tuple(x.sizes)
    ws = tuple(w.sizes)
    outs = p.out_shape if p.batched else (1,) + p.out_shape
    one, zero = (1,) * (5 - len(ws)), (0,) * (5 - len(ws))
    return (xs[:2] + one + xs[2:], ws[:2] + one + ws[2:], one + p.stride, zero + p.padding,
            one + p.dilation, zero + p.output_padding, one + tuple(outs[2:]))


#: depthwise kernels of at most this many taps are summed by a python loop over the taps
#: (a few whole-plane passes); larger ones go through the im2col GEMM, so that a file's
#: kernel size cannot buy python steps
TAP_LOOP = 64

#: scratch bytes a convolution may take for a library's own workspace beside the copies
#: charged below: oneDNN's AMX bfloat16 brgconv asked 62976 bytes for a 2x16x20 conv1d whose
#: copies come to 24 KB
LIBRARY_WORKSPACE = 64 << 10


def conv_cost(out: Any, x: Any, w: Any, bias: Any, p: ConvParams) -> c.OpCost:
    """Cost of the cpu convolution: its multiply-adds, element visits and loop steps; its
    scratch: float32 (and detached) input copies, the padded input, the im2col buffer or
    col2im accumulator of one chunk of samples, the chunk's result and its rounded copy."""
    xs, ws, stride, padding, dilation, _, out_sp = _lifted(x, w, p)
    n, cin, sp_in = xs[0], xs[1], xs[2:]
    w1, kernel = ws[1], ws[2:]
    taps, n_in, n_out = math.prod(kernel), math.prod(sp_in), math.prod(out_sp)
    item = out.dtype.itemsize
    nb = bias.numel if bias is not None else 0
    work = x.numel + w.numel + nb + out.numel
    scratch = (4 + item) * (x.numel + w.numel + nb) + LIBRARY_WORKSPACE
    cout = out.numel // max(n * n_out, 1)
    if not p.transposed:
        cg = w1
        step = c.rows_per_chunk(cin * taps * n_out * 4, n)
        chunks = -(-n // step)
        work += n * cout * n_out * cg * taps
        if any(padding):
            scratch += 4 * n * cin * math.prod(s + 2 * q for s, q in zip(sp_in, padding))
        res = step * cout * n_out
        if cg == 1 and taps <= TAP_LOOP:
            scratch += 2 * 4 * res
            work += c.PY_STEP * chunks * taps
        else:
            scratch += 4 * step * cin * taps * n_out + 4 * res
            work += c.PY_STEP * chunks
        scratch += item * res
        return c.OpCost(work, scratch)
    og = w1
    full = math.prod(_full_extent(sp_in, kernel, stride, padding, dilation, out_sp))
    step = c.rows_per_chunk((og * p.groups * taps * n_in + cin * full) * 4, n)
    chunks = -(-n // step)
    tap_work = n * p.groups * og * taps * n_in
    work += tap_work * (cin // p.groups) + tap_work + n * cout * full
    work += c.PY_STEP * chunks * (1 + min(taps, n_in))
    scratch += 4 * w.numel
    scratch += 4 * step * (p.groups * og * taps * n_in + p.groups * og * full)
    scratch += (4 + item) * step * cout * n_out
    return c.OpCost(work, scratch)


def _full_extent(sp_in: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int],
                 out_sp: Sequence[int]) -> tuple[int, ...]:
    """Per spatial dim, the col2im accumulator's extent: every tap, and the cropped output."""
    return tuple(max((i - 1) * s + d * (k - 1) + 1, q + o)
                 for i, k, s, q, d, o in zip(sp_in, kernel, stride, padding, dilation, out_sp))


def convolution(stream: Stream, out: Handle, x: Handle, w: Handle, bias: Handle | None,
                stride: Sequence[int] = (1,), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), transposed: bool = False,
                output_padding: Sequence[int] = (0,), groups: int = 1,
                residual: Handle | None = None, activation: str = "none") -> int:
    """out = activation(conv(x, w) + bias + residual), aten.convolution semantics (1-D, 2-D
    and 3-D) with an optional fused epilogue."""
    op = "convolution"
    c.check_handles(op, stream, [(out, "out"), (x, "x"), (w, "w"), (bias, "bias"),
                                 (residual, "residual")])
    p, _ = check_convolution(out, x, w, bias, stride, padding, dilation, transposed,
                             output_padding, groups, residual, activation)
    return c.launch(op, stream, [out], [x, w, bias, residual], "convolution", out, x, w, bias, p,
                    residual, stream.options.fp32_math)
