"""Convolution (aten.convolution): 1-D, 2-D and 3-D, strided/padded/dilated, grouped,
transposed with output padding, optional bias, into a caller-provided output view.

Input may be batched (N, C, *spatial) or unbatched (C, *spatial). On cpu the forward 1-D
and 2-D convolution runs through oneDNN (ops/cpu_dnnl.py) on the views' own strides where it
is installed and takes the call. Otherwise every convolution runs as a 3-D one in numpy (1-D
and 2-D get leading spatial dims of size 1, as views): im2col through stride tricks plus one
batched GEMM per chunk of samples, or for the transposed one a GEMM followed by a col2im
scatter-add over kernel taps. On cuda (ops/cuda/conv.py), 3-D convolutions go through
cuDNN.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import itertools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c, cpu_activation, cpu_winograd
from aotrt.runtime.ops.cuda import conv as cuda_conv
from aotrt.runtime.options import Fp32Math
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)

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
    return c.launch(op, stream, [out], [x, w, bias, residual], _CONV, out, x, w, bias, p,
                    residual, stream.options.fp32_math)


# -- cpu ----------------------------------------------------------------------------------------

def _forward(xv: np.ndarray, wv: np.ndarray, stride: tuple, padding: tuple, dilation: tuple,
             groups: int, out_sp: tuple, store: Callable[[int, int, np.ndarray], None]) -> None:
    n, cin = xv.shape[:2]
    cout, cg, kd, kh, kw = wv.shape
    og = cout // groups
    taps = kd * kh * kw
    n_out = math.prod(out_sp)
    # A stride over a single output, or a dilation of a single tap, moves nothing; 1 keeps
    # the byte strides below within int64 whatever the file said.
    stride = tuple(s if o > 1 else 1 for s, o in zip(stride, out_sp))
    dilation = tuple(d if k > 1 else 1 for d, k in zip(dilation, (kd, kh, kw)))
    if any(padding):
        xv = np.pad(xv, ((0, 0), (0, 0)) + tuple((q, q) for q in padding))
    wmat = wv.reshape(1, groups, og, cg * taps)
    step = c.rows_per_chunk(cin * taps * n_out * 4, n)
    for n0 in range(0, n, step):
        xs = xv[n0:n0 + step]
        nb = xs.shape[0]
        s_n, s_c, *s_sp = xs.strides
        win = as_strided(xs, shape=(nb, groups, cg, kd, kh, kw) + tuple(out_sp),
                         strides=(s_n, cg * s_c, s_c)
                         + tuple(s * d for s, d in zip(s_sp, dilation))
                         + tuple(s * t for s, t in zip(s_sp, stride)),
                         writeable=False)
        if cg == 1 and taps <= TAP_LOOP:
            # Depthwise: a GEMM per channel would have K = taps; multiply-add per tap instead.
            res = np.zeros((nb, groups, og) + tuple(out_sp), dtype=np.float32)
            tw = wv.reshape(groups, og, kd, kh, kw)
            for a, i, j in itertools.product(range(kd), range(kh), range(kw)):
                res += tw[None, :, :, a, i, j, None, None, None] * win[:, :, :, a, i, j]
        else:
            cols = win.reshape(nb, groups, cg * taps, n_out)  # the im2col copy, if needed
            res = np.matmul(wmat, cols)  # (nb, groups, og, n_out)
        store(n0, n0 + nb, res.reshape((nb, cout) + tuple(out_sp)))


def _transposed(xv: np.ndarray, wv: np.ndarray, stride: tuple, padding: tuple,
                dilation: tuple, out_sp: tuple, groups: int,
                store: Callable[[int, int, np.ndarray], None]) -> None:
    n, cin, *sp_in = xv.shape
    _, og, *kernel = wv.shape
    cg = cin // groups
    taps, n_in = math.prod(kernel), math.prod(sp_in)
    full = _full_extent(sp_in, kernel, stride, padding, dilation, out_sp)
    # (groups, og*taps, cg): each input pixel's contribution to every tap of every output.
    wmat = np.ascontiguousarray(wv.reshape(groups, cg, og * taps).transpose(0, 2, 1))
    step = c.rows_per_chunk((og * groups * taps * n_in + cin * math.prod(full)) * 4, n)
    crop = tuple(slice(q, q + o) for q, o in zip(padding, out_sp))
    for n0 in range(0, n, step):
        xs = xv[n0:n0 + step]
        nb = xs.shape[0]
        cols = np.matmul(wmat[None], xs.reshape(nb, groups, cg, n_in))
        cols = cols.reshape((nb, groups, og) + tuple(kernel) + tuple(sp_in))
        acc = np.zeros((nb, groups, og) + full, dtype=np.float32)
        if taps <= n_in:
            for tap in itertools.product(*(range(k) for k in kernel)):
                dst = tuple(slice(t * d, t * d + (i - 1) * s + 1, s)
                            for t, d, i, s in zip(tap, dilation, sp_in, stride))
                acc[(slice(None),) * 3 + dst] += cols[(slice(None),) * 3 + tap]
        else:
            # More taps than input pixels (a file chooses the kernel's size): the same sums
            # by input pixel, each adding its whole dilated window, so the python steps
            # are min(taps, n_in), at most the square root of the multiply-adds.
            lead = (slice(None),) * (3 + len(kernel))
            for pix in itertools.product(*(range(i) for i in sp_in)):
                dst = tuple(slice(q * s, q * s + d * (k - 1) + 1, d)
                            for q, s, d, k in zip(pix, stride, dilation, kernel))
                acc[(slice(None),) * 3 + dst] += cols[lead + pix]
        res = acc[(slice(None),) * 3 + crop].reshape((nb, groups * og) + tuple(out_sp))
        store(n0, n0 + nb, res)


def _dnnl_geometry(h: Handle, batched: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Sizes and strides of an activation view as oneDNN gets it: (N, C, *spatial)."""
    sizes, strides = tuple(h.sizes), tuple(h.strides)
    if not batched:
        # A batch of one: its stride is never used; the view's extent keeps it plausible.
        extent = max([n * s for n, s in zip(sizes, strides)] + [1])
        sizes, strides = (1,) + sizes, (extent,) + strides
    return sizes, strides


def _dnnl_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: ConvParams,
               activation: str = "none", residual: Handle | None = None
               ) -> Callable[[], None] | None:
    """The oneDNN work of a forward convolution (with its epilogue, as post-ops, when
    `activation` or `residual` is given), or None (logged) where it cannot serve. Only
    a plain convolution left to numpy counts in `stats["numpy"]`: a refused epilogue
    still has the plain convolution to try."""
    dnnl = getattr(out.device, "dnnl", None)
    if dnnl is None or p.transposed or w.ndim == 5:
        return None                     # transposed and 3-D: the numpy path
    from aotrt.runtime.ops import cpu_dnnl

    if out.dtype.name not in cpu_dnnl.DATA_TYPES:
        return None
    if bias is not None and bias.sizes[0] > 1 and bias.strides[0] != 1:
        # oneDNN 3.2 read a broadcast (stride 0) bias as a dense one, past the view's end:
        # the second channel of a 2-channel conv1d got the byte after it (hypothesis,
        # tests/runtime/ops/test_check_fuzz.py). numpy runs those.
        dnnl.stats["numpy"] += 1
        return None
    wsizes, wstrides = tuple(w.sizes), tuple(w.strides)
    if p.groups > 1:
        og = wsizes[0] // p.groups
        wsizes = (p.groups, og) + wsizes[1:]
        wstrides = (og * wstrides[0],) + wstrides
    plain = activation == "none" and residual is None
    key = cpu_dnnl.ConvKey(out.dtype.name, _dnnl_geometry(x, p.batched), (wsizes, wstrides),
                           None if bias is None else tuple(bias.strides),
                           _dnnl_geometry(out, p.batched), p.stride, p.padding, p.dilation,
                           activation,
                           None if residual is None else _dnnl_geometry(residual, p.batched),
                           cpu_dnnl.stream_threads(out.device))
    prim = dnnl.convolution(key)
    if prim is None:
        dnnl.stats["numpy"] += plain
        return None
    if prim.impl.startswith("ref"):
        # oneDNN's reference loops (its answer for odd views and groups) are slower than numpy.
        log.debug("oneDNN has only %s for convolution %s; numpy runs it", prim.impl, key)
        dnnl.stats["numpy"] += plain
        return None
    # A residual that shares bytes with the output is read from a copy: oneDNN may write
    # parts of the output (partial sums) before it reads the residual there.
    detach = [h for h in (x, w, bias, residual) if h is not None and c.overlaps(out, h)]
    extra = prim.extra_bytes() + sum(hi - lo + 128 for lo, hi in (h.byte_range() for h in detach))
    budget = conv_cost(out, x, w, bias, p).scratch_bytes + (0 if plain else _epilogue_bytes(out))
    if extra > budget:
        # check_convolution charged the numpy path's scratch: stay within it.
        log.debug("oneDNN convolution %s needs %d scratch bytes, over the %d charged; numpy "
                  "runs it", key, extra, budget)
        dnnl.stats["numpy"] += plain
        return None
    keep = w.alloc is not None and w.alloc.kind == "constants" and not c.overlaps(out, w)
    return dnnl.work(prim, x, w, bias, out, detach, keep, residual)


def apply_epilogue(o: np.ndarray, res: np.ndarray | None, activation: str) -> None:
    """o = act(o + res) in place, in float32 when o is float32 (else through a float32
    copy stored back): the cpu epilogue, two passes over memory and no allocation on
    float32 outputs."""
    v = o if o.dtype == np.float32 else c.load_f32(o)
    if res is not None:
        np.add(v, c.load_f32(res), out=v)
    if activation == "relu":
        np.maximum(v, 0.0, out=v)
    elif activation == "relu6":
        np.clip(v, 0.0, 6.0, out=v)         # NaN stays NaN, as in torch's hardtanh
    elif activation == "silu":
        # x / (1 + exp(-x)): exp overflows to inf for x < -88, and x / inf is the -0.0
        # torch gives
        with np.errstate(over="ignore"):
            v /= 1.0 + np.exp(-v)
    if v is not o:
        c.store(o, v)


def _cpu_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: ConvParams,
              residual: Handle | None = None, fp32: Fp32Math = Fp32Math()
              ) -> Callable[[], None]:
    from aotrt.runtime.devices.cpu import host_array

    # The cpu has no TF32; its float32 trade is Winograd's (ops/cpu_winograd.py).
    wino = _winograd(out, x, w, bias, p, residual, fp32.conv_winograd)
    if wino is not None:
        return wino
    if residual is not None or p.activation != "none":
        # oneDNN applies the epilogue as post-ops of the convolution itself: one pass over
        # the output instead of three (ResNet's residual adds, YOLO's SiLUs). Not relu and
        # relu6: its max maps a NaN to 0, so they follow in a pass of their own.
        after = p.activation in cpu_activation.CODES
        fused = _dnnl_conv(out, x, w, bias, p, "none" if after else p.activation, residual)
        if fused is not None and after:
            fused = _then_activation(fused, out, p.activation)
        if fused is not None:
            return fused
    base = _cpu_conv_only(out, x, w, bias, p)
    if residual is None and p.activation == "none":
        return base

    # A residual the output overlaps is copied before the convolution writes over it;
    # one apart from it is read in place (decided once, here).
    copy_res = residual is not None and c.overlaps(out, residual)

    def work() -> None:
        res = None if residual is None else (
            np.array(host_array(residual), copy=True) if copy_res else host_array(residual))
        base()
        apply_epilogue(host_array(out), res, p.activation)
    return work


def _then_activation(work: Callable[[], None], out: Handle,
                     activation: str) -> Callable[[], None]:
    """`work`, then relu or relu6 over `out` in place: the compiled pass, or numpy's."""
    from aotrt.runtime.devices.cpu import host_array

    compiled = out.device.activation.after(work, out, activation)
    if compiled is not None:
        return compiled

    def run() -> None:
        work()
        apply_epilogue(host_array(out), None, activation)
    return run


def _winograd(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: ConvParams,
              residual: Handle | None, tile: int) -> Callable[[], None] | None:
    """The Winograd work of a convolution it takes, or None."""
    from aotrt.runtime.ops.cpu_dnnl import stream_threads

    if not cpu_winograd.takes(out, x, w, bias, p, residual, tile):
        return None
    tile = cpu_winograd.tile_for(out, tile)
    if not tile:
        return None
    budget = conv_cost(out, x, w, bias, p).scratch_bytes
    return out.device.winograd.work(out, x, w, bias, p, residual, tile,
                                    stream_threads(out.device), budget)


def _cuda_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: ConvParams,
               residual: Handle | None, fp32: Fp32Math) -> Any:
    return cuda_conv.make_conv(out, x, w, bias, p, residual, fp32.conv_tf32)


def _cpu_conv_only(out: Handle, x: Handle, w: Handle, bias: Handle | None,
                   p: ConvParams) -> Callable[[], None]:
    from aotrt.runtime.devices.cpu import host_array

    dnnl_work = _dnnl_conv(out, x, w, bias, p)
    if dnnl_work is not None:
        return dnnl_work
    _, _, stride, padding, dilation, _, out_sp = _lifted(x, w, p)

    def work() -> None:
        o = host_array(out)
        xa, wa, ba = c.detach_inputs([out], [x, w, bias], [
            host_array(x), host_array(w), None if bias is None else host_array(bias)])
        xv, wv = c.load_f32(xa), c.load_f32(wa)
        bv = None if ba is None else c.load_f32(ba)
        if not p.batched:
            xv, o = xv[None], o[None]
        # 1-D and 2-D as 3-D: leading spatial dims of size 1 (views, no copies).
        lift = (slice(None), slice(None)) + (None,) * (5 - wv.ndim)
        xv, wv, o5 = xv[lift], wv[lift], o[lift]

        def store(n0: int, n1: int, res: np.ndarray) -> None:
            if bv is not None:
                res += bv[:, None, None, None]
            c.store(o5[n0:n1], res)

        if p.transposed:
            _transposed(xv, wv, stride, padding, dilation, out_sp, p.groups, store)
        else:
            _forward(xv, wv, stride, padding, dilation, p.groups, out_sp, store)
    return work


_CONV: dict[str, Callable[..., Any]] = {"cpu": _cpu_conv, "cuda": _cuda_conv}
