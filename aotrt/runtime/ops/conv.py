"""Convolution (aten.convolution): 1-D and 2-D, strided/padded/dilated, grouped, transposed
with output padding, optional bias, into a caller-provided output view.

Input may be batched (N, C, *spatial) or unbatched (C, *spatial). On cpu the forward
convolution runs through oneDNN (ops/cpu_dnnl.py) on the views' own strides where it is
installed and takes the call; otherwise, and for the transposed one, numpy: im2col through
stride tricks plus one batched GEMM per chunk of samples, or a GEMM followed by a col2im
scatter-add over kernel taps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.ops.cuda import conv as cuda_conv
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


def check_convolution(out: Any, x: Any, w: Any, bias: Any = None, stride: Any = (1,),
                      padding: Any = (0,), dilation: Any = (1,), transposed: Any = False,
                      output_padding: Any = (0,), groups: Any = 1
                      ) -> tuple[ConvParams, c.OpCost]:
    """Validate convolution's metadata and params like aten.convolution; return the
    geometry and the cost."""
    op = "convolution"
    c.check_output(op, out, "out")
    c.check_dtype(op, out, "out")
    for h, name in ((x, "x"), (w, "w")) + (((bias, "bias"),) if bias is not None else ()):
        c.check_same_dtype(op, out, "out", h, name)
    if w.ndim == 5:
        raise Unsupported(f"{op}: w: 3-D convolution is not supported (w is {list(w.sizes)})")
    c.check_rank(op, w, "w", (3, 4))
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
    p = ConvParams(stride, padding, dilation, output_padding, transposed, groups, batched,
                   out_shape)
    return p, conv_cost(out, x, w, bias, p)


def _lifted(x: Any, w: Any, p: ConvParams) -> tuple[tuple[int, ...], ...]:
    """(n, cin, h, w), (w0, w1, kh, kw), stride, padding, dilation, output_padding and
    (ho, wo) of the 2-D batched convolution the cpu code runs."""
    xs = tuple(x.sizes) if p.batched else (1,) + tuple(x.sizes)
    ws = tuple(w.sizes)
    outs = p.out_shape if p.batched else (1,) + p.out_shape
    if len(ws) == 3:
        return (xs[:2] + (1,) + xs[2:], ws[:2] + (1,) + ws[2:], (1,) + p.stride,
                (0,) + p.padding, (1,) + p.dilation, (0,) + p.output_padding, (1, outs[2]))
    return (xs, ws, p.stride, p.padding, p.dilation, p.output_padding, outs[2:])


def conv_cost(out: Any, x: Any, w: Any, bias: Any, p: ConvParams) -> c.OpCost:
    """Cost of the cpu convolution: its multiply-adds, element visits and loop steps; its
    scratch: float32 (and detached) input copies, the padded input, the im2col buffer or
    col2im accumulator of one chunk of samples, the chunk's result and its rounded copy."""
    (n, cin, h, wd), (w0, w1, kh, kw), (sh, sw), (ph, pw), (dh, dw), _, (ho, wo) = \
        _lifted(x, w, p)
    item = out.dtype.itemsize
    nb = bias.numel if bias is not None else 0
    work = x.numel + w.numel + nb + out.numel
    scratch = (4 + item) * (x.numel + w.numel + nb)
    cout = out.numel // max(n * ho * wo, 1)
    if not p.transposed:
        cg = w1
        step = c.rows_per_chunk(cin * kh * kw * ho * wo * 4, n)
        chunks = -(-n // step)
        work += n * cout * ho * wo * cg * kh * kw
        if ph or pw:
            scratch += 4 * n * cin * (h + 2 * ph) * (wd + 2 * pw)
        res = step * cout * ho * wo
        if cg == 1:
            scratch += 2 * 4 * res
            work += c.PY_STEP * chunks * kh * kw
        else:
            scratch += 4 * step * cin * kh * kw * ho * wo + 4 * res
            work += c.PY_STEP * chunks
        scratch += item * res
        return c.OpCost(work, scratch)
    og = w1
    full_h = max((h - 1) * sh + dh * (kh - 1) + 1, ph + ho)
    full_w = max((wd - 1) * sw + dw * (kw - 1) + 1, pw + wo)
    step = c.rows_per_chunk((og * p.groups * kh * kw * h * wd + cin * full_h * full_w) * 4, n)
    chunks = -(-n // step)
    taps = n * p.groups * og * kh * kw * h * wd
    work += taps * (cin // p.groups) + taps + n * cout * full_h * full_w
    work += c.PY_STEP * chunks * (1 + kh * kw)
    scratch += 4 * w.numel
    scratch += 4 * step * (p.groups * og * kh * kw * h * wd + p.groups * og * full_h * full_w)
    scratch += (4 + item) * step * cout * ho * wo
    return c.OpCost(work, scratch)


def convolution(stream: Stream, out: Handle, x: Handle, w: Handle, bias: Handle | None,
                stride: Sequence[int] = (1,), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), transposed: bool = False,
                output_padding: Sequence[int] = (0,), groups: int = 1) -> int:
    """out = conv(x, w) + bias, aten.convolution semantics (1-D and 2-D)."""
    op = "convolution"
    c.check_handles(op, stream, [(out, "out"), (x, "x"), (w, "w"), (bias, "bias")])
    p, _ = check_convolution(out, x, w, bias, stride, padding, dilation, transposed,
                             output_padding, groups)
    return c.launch(op, stream, [out], [x, w, bias], _CONV, out, x, w, bias, p)


# -- cpu ----------------------------------------------------------------------------------------

def _as_2d(xv: np.ndarray, wv: np.ndarray, p: ConvParams) -> tuple[np.ndarray, np.ndarray, tuple,
                                                                    tuple, tuple, tuple]:
    """Lift a 1-D convolution to 2-D with a height of 1 (views, no copies)."""
    if wv.ndim == 4:
        return xv, wv, p.stride, p.padding, p.dilation, p.output_padding
    return (xv[:, :, None, :], wv[:, :, None, :], (1,) + p.stride, (0,) + p.padding,
            (1,) + p.dilation, (0,) + p.output_padding)


def _forward(xv: np.ndarray, wv: np.ndarray, stride: tuple, padding: tuple, dilation: tuple,
             groups: int, out_hw: tuple, store: Callable[[int, int, np.ndarray], None]) -> None:
    n, cin, h, wd = xv.shape
    cout, cg, kh, kw = wv.shape
    og = cout // groups
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho, wo = out_hw
    # A stride over a single output, or a dilation of a single tap, moves nothing; 1 keeps
    # the byte strides below within int64 whatever the file said.
    sh, sw = (sh if ho > 1 else 1), (sw if wo > 1 else 1)
    dh, dw = (dh if kh > 1 else 1), (dw if kw > 1 else 1)
    if ph or pw:
        xv = np.pad(xv, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    wmat = wv.reshape(1, groups, og, cg * kh * kw)
    step = c.rows_per_chunk(cin * kh * kw * ho * wo * 4, n)
    for n0 in range(0, n, step):
        xs = xv[n0:n0 + step]
        nb = xs.shape[0]
        s_n, s_c, s_h, s_w = xs.strides
        win = as_strided(xs, shape=(nb, groups, cg, kh, kw, ho, wo),
                         strides=(s_n, cg * s_c, s_c, s_h * dh, s_w * dw, s_h * sh, s_w * sw),
                         writeable=False)
        if cg == 1:
            # Depthwise: a GEMM per channel would have K = kh*kw; multiply-add per tap instead.
            res = np.zeros((nb, groups, og, ho, wo), dtype=np.float32)
            taps = wv.reshape(groups, og, kh, kw)
            for i in range(kh):
                for j in range(kw):
                    res += taps[None, :, :, i, j, None, None] * win[:, :, :, i, j]
        else:
            cols = win.reshape(nb, groups, cg * kh * kw, ho * wo)  # the im2col copy, if needed
            res = np.matmul(wmat, cols)  # (nb, groups, og, ho*wo)
        store(n0, n0 + nb, res.reshape(nb, cout, ho, wo))


def _transposed(xv: np.ndarray, wv: np.ndarray, stride: tuple, padding: tuple,
                dilation: tuple, output_padding: tuple, groups: int,
                store: Callable[[int, int, np.ndarray], None]) -> None:
    n, cin, h, wd = xv.shape
    _, og, kh, kw = wv.shape
    cg = cin // groups
    (sh, sw), (ph, pw), (dh, dw), (oph, opw) = stride, padding, dilation, output_padding
    ho = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    wo = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    full_h = max((h - 1) * sh + dh * (kh - 1) + 1, ph + ho)
    full_w = max((wd - 1) * sw + dw * (kw - 1) + 1, pw + wo)
    # (groups, og*kh*kw, cg): each input pixel's contribution to every tap of every output.
    wmat = np.ascontiguousarray(wv.reshape(groups, cg, og * kh * kw).transpose(0, 2, 1))
    step = c.rows_per_chunk((og * groups * kh * kw * h * wd + cin * full_h * full_w) * 4, n)
    for n0 in range(0, n, step):
        xs = xv[n0:n0 + step]
        nb = xs.shape[0]
        cols = np.matmul(wmat[None], xs.reshape(nb, groups, cg, h * wd))
        cols = cols.reshape(nb, groups, og, kh, kw, h, wd)
        full = np.zeros((nb, groups, og, full_h, full_w), dtype=np.float32)
        for i in range(kh):
            for j in range(kw):
                full[:, :, :, i * dh:i * dh + (h - 1) * sh + 1:sh,
                     j * dw:j * dw + (wd - 1) * sw + 1:sw] += cols[:, :, :, i, j]
        res = full[:, :, :, ph:ph + ho, pw:pw + wo].reshape(nb, groups * og, ho, wo)
        store(n0, n0 + nb, res)


def _dnnl_geometry(h: Handle, batched: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Sizes and strides of an activation view as oneDNN gets it: (N, C, *spatial)."""
    sizes, strides = tuple(h.sizes), tuple(h.strides)
    if not batched:
        # A batch of one: its stride is never used; the view's extent keeps it plausible.
        extent = max([n * s for n, s in zip(sizes, strides)] + [1])
        sizes, strides = (1,) + sizes, (extent,) + strides
    return sizes, strides


def _dnnl_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None,
               p: ConvParams) -> Callable[[], None] | None:
    """The oneDNN work of a forward convolution, or None (logged) where it cannot serve."""
    dnnl = getattr(out.device, "dnnl", None)
    if dnnl is None or p.transposed:
        return None
    from aotrt.runtime.ops import cpu_dnnl

    if out.dtype.name not in cpu_dnnl.DATA_TYPES:
        return None
    wsizes, wstrides = tuple(w.sizes), tuple(w.strides)
    if p.groups > 1:
        og = wsizes[0] // p.groups
        wsizes = (p.groups, og) + wsizes[1:]
        wstrides = (og * wstrides[0],) + wstrides
    key = cpu_dnnl.ConvKey(out.dtype.name, _dnnl_geometry(x, p.batched), (wsizes, wstrides),
                           None if bias is None else tuple(bias.strides),
                           _dnnl_geometry(out, p.batched), p.stride, p.padding, p.dilation)
    prim = dnnl.convolution(key)
    if prim is None:
        dnnl.stats["numpy"] += 1
        return None
    if prim.impl.startswith("ref"):
        # oneDNN's reference loops (its answer for odd views and groups) are slower than numpy.
        log.debug("oneDNN has only %s for convolution %s; numpy runs it", prim.impl, key)
        dnnl.stats["numpy"] += 1
        return None
    detach = [h for h in (x, w, bias) if h is not None and c.overlaps(out, h)]
    extra = prim.extra_bytes() + sum(hi - lo + 128 for lo, hi in (h.byte_range() for h in detach))
    budget = conv_cost(out, x, w, bias, p).scratch_bytes
    if extra > budget:
        # check_convolution charged the numpy path's scratch: stay within it.
        log.debug("oneDNN convolution %s needs %d scratch bytes, over the %d charged; numpy "
                  "runs it", key, extra, budget)
        dnnl.stats["numpy"] += 1
        return None
    keep = w.alloc is not None and w.alloc.kind == "constants" and not c.overlaps(out, w)
    return dnnl.conv_work(prim, x, w, bias, out, detach, keep)


def _cpu_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None,
              p: ConvParams) -> Callable[[], None]:
    from aotrt.runtime.devices.cpu import host_array

    work = _dnnl_conv(out, x, w, bias, p)
    if work is not None:
        return work

    def work() -> None:
        o = host_array(out)
        xa, wa, ba = c.detach_inputs([out], [x, w, bias], [
            host_array(x), host_array(w), None if bias is None else host_array(bias)])
        xv, wv = c.load_f32(xa), c.load_f32(wa)
        bv = None if ba is None else c.load_f32(ba)
        if not p.batched:
            xv, o = xv[None], o[None]
        xv, wv, stride, padding, dilation, output_padding = _as_2d(xv, wv, p)
        o4 = o if o.ndim == 4 else o[:, :, None, :]

        def store(n0: int, n1: int, res: np.ndarray) -> None:
            if bv is not None:
                res += bv[:, None, None]
            c.store(o4[n0:n1], res)

        if p.transposed:
            _transposed(xv, wv, stride, padding, dilation, output_padding, p.groups, store)
        else:
            _forward(xv, wv, stride, padding, dilation, p.groups, o4.shape[2:], store)
    return work


_CONV: dict[str, Callable[..., Any]] = {"cpu": _cpu_conv, "cuda": cuda_conv.make_conv}
