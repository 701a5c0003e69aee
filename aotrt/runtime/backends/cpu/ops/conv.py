"""The cpu work of convolution: oneDNN, Winograd, or numpy im2col / col2im."""

from __future__ import annotations

import itertools
import logging
import math
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aotrt.runtime.ops import _common as c
from aotrt.runtime.backends.cpu.ops import activation as cpu_activation
from aotrt.runtime.backends.cpu.ops import winograd as cpu_winograd
from aotrt.runtime.ops.conv import (TAP_LOOP, ConvParams, _epilogue_bytes, _full_extent,
                                    _lifted, conv_cost)
from aotrt.runtime.options import Fp32Math
from aotrt.runtime.tensor import Handle, host_array

log = logging.getLogger(__name__)


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
    dnnl = out.device.libraries.dnnl
    if dnnl is None or p.transposed or w.ndim == 5:
        return None                     # transposed and 3-D: the numpy path
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

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


def make_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: ConvParams,
              residual: Handle | None = None, fp32: Fp32Math = Fp32Math()
              ) -> Callable[[], None]:
    """The cpu work of one convolution (with its epilogue)."""
    # The cpu has no TF32; its float32 trade is Winograd's (backends/cpu/ops/winograd.py).
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
    compiled = out.device.libraries.activation.after(work, out, activation)
    if compiled is not None:
        return compiled

    def run() -> None:
        work()
        apply_epilogue(host_array(out), None, activation)
    return run


def _winograd(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: ConvParams,
              residual: Handle | None, tile: int) -> Callable[[], None] | None:
    """The Winograd work of a convolution it takes, or None."""
    from aotrt.runtime.backends.cpu.dnnl import stream_threads

    if not cpu_winograd.takes(out, x, w, bias, p, residual, tile):
        return None
    tile = cpu_winograd.tile_for(out, tile)
    if not tile:
        return None
    budget = conv_cost(out, x, w, bias, p).scratch_bytes
    return out.device.libraries.winograd.work(out, x, w, bias, p, residual, tile,
                                    stream_threads(out.device), budget)


def _cpu_conv_only(out: Handle, x: Handle, w: Handle, bias: Handle | None,
                   p: ConvParams) -> Callable[[], None]:
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
