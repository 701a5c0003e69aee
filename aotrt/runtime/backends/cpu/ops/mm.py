"""The cpu work of the matrix products: oneDNN's brgemm matmul where it serves, else the
compiled few-row kernel (gemv.py) or oneDNN's sgemm split over the threads (gemm.py), else
numpy."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime import constants
from aotrt.runtime.ops import _common as c
from aotrt.runtime.backends.cpu.ops import gemm as cpu_gemm
from aotrt.runtime.backends.cpu.ops import gemv as cpu_gemv
from aotrt.runtime.ops.mm import check_addmm, check_linear, check_mm
from aotrt.runtime.tensor import Handle, host_array

log = logging.getLogger(__name__)


def make_matmul(out: Handle, a: Handle, b: Handle, bias: Handle | None, beta: float,
                alpha: float, tf32: bool = False) -> Callable[[], None]:
    """The cpu work of mm, bmm and addmm."""
    del tf32    # the cpu has no TF32: float32 stays float32

    if a.ndim == 2 and b.ndim == 2 and alpha == 1.0 and beta in (0.0, 1.0):
        # mm and addmm (bmm stays on numpy); beta == 0 ignores the bias, as torch does.
        use = bias if beta == 1.0 else None
        if _gemv_first(out.device, b):
            if b.sizes[0] < 2 or b.strides[0] == 1:
                # b [K, N] read as its transpose [N, K]: the exporter stores it column-major
                gemv = cpu_gemv.make_gemv(out, a, b, (b.sizes[1], b.sizes[0], b.strides[1]),
                                          use)
                if gemv is not None:
                    return gemv
            gemm = cpu_gemm.make_gemm(out, a, b, (b.sizes[1], b.sizes[0], b.strides[1],
                                                  b.strides[0]), use)
            if gemm is not None:
                return gemm
        cost = (check_mm(out, a, b) if bias is None else
                check_addmm(out, bias, a, b, beta, alpha))[1]
        dnnl_work = _dnnl_gemm(out, a, b, (tuple(b.sizes), tuple(b.strides)), use,
                               cost.scratch_bytes)
        if dnnl_work is not None:
            return dnnl_work

    blas = c.blas_scope(out.device.libraries.dnnl)

    def work() -> None:
        o = host_array(out)
        with blas():
            res = np.matmul(c.load_f32(host_array(a)), c.load_f32(host_array(b)))
        if alpha != 1.0:
            res *= np.float32(alpha)
        if bias is not None and beta != 0.0:
            bv = c.load_f32(host_array(bias))
            res += bv if beta == 1.0 else bv * np.float32(beta)
        # res is a fresh temporary, so an out that overlaps an input is still right.
        c.store(o, res)
    return work


def _gemv_first(device: Any, w: Handle) -> bool:
    """Whether a GEMM with weights `w` tries the compiled kernels first, gemv.py for a few
    rows and gemm.py for more: where oneDNN has no brgemm matmul for the CPU (then numpy's
    OpenBLAS ran it), and never for weights a oneDNN matmul re-laid in place (their bytes
    are in its blocked layout: only that matmul may read them, or the run is refused)."""
    dnnl = device.libraries.dnnl
    return dnnl is None or (not dnnl.gemm_pool and dnnl.relaid(w) is None)


def _rows(h: Handle) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A view of rank >= 1 as 2-D (rows, last dim) sizes and strides, without a copy; None
    where its leading dims do not fold into one."""
    sizes, strides = tuple(h.sizes), tuple(h.strides)
    if len(sizes) == 1:
        return (1, sizes[0]), (sizes[0] * strides[0] or 1, strides[0])
    lead = [(n, st) for n, st in zip(sizes[:-1], strides[:-1]) if n != 1]
    rows = 1
    for n, _ in lead:
        rows *= n
    row_stride = lead[-1][1] if lead else sizes[-1] * strides[-1] or 1
    for (n0, s0), (n1, s1) in zip(lead, lead[1:]):
        if s0 != n1 * s1:
            return None
    return (rows, sizes[-1]), (row_stride, strides[-1])


def _bias_row(bias: Handle | None, n: int) -> tuple[bool, int | None]:
    """(usable, stride) of a bias oneDNN adds as one row of `n`: None, or n dense elements
    along its last dim (leading dims of size 1). oneDNN 3.2's gemm matmul reads a strided
    bias as a dense one, so those stay on numpy."""
    if bias is None:
        return True, None
    if bias.ndim == 0 or bias.sizes[-1] != n or any(s != 1 for s in bias.sizes[:-1]) or (
            n > 1 and bias.strides[-1] != 1):
        return False, None
    return True, bias.strides[-1]


def _dnnl_gemm(out: Handle, x: Handle, w: Handle, w_kn: tuple[tuple[int, ...], tuple[int, ...]],
               bias: Handle | None, budget: int) -> Callable[[], None] | None:
    """The oneDNN work of out = x @ w (+ bias), float32, `w` seen as [K, N] through `w_kn`;
    None (logged) where it cannot serve."""
    dnnl = out.device.libraries.dnnl
    if dnnl is None or out.dtype.name != "float32":
        return None
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    xr, outr = _rows(x), _rows(out)
    ok, bias_stride = _bias_row(bias, w_kn[0][1])
    if xr is None or outr is None or not ok:
        return None
    keep = w.alloc is not None and w.alloc.kind == "constants" and not c.overlaps(out, w)
    # Weights only this instruction reads (its program says, at load: runtime/constants.py)
    # are re-laid into brgemm's blocked layout in place.
    program = constants.current()
    in_place = keep and program is not None and program.sole_read(w)
    key = cpu_dnnl.MatmulKey("float32", xr, w_kn, bias_stride, outr,
                             cpu_dnnl.stream_threads(out.device), packed=in_place)
    prim = dnnl.matmul(key)
    if in_place and (prim is None or prim.w.bytes not in (0, w.numel * w.dtype.itemsize)):
        key = dataclasses.replace(key, packed=False)
        prim, in_place = dnnl.matmul(key), False
    relaid = dnnl.relaid(w)

    def numpy_instead(why: str) -> None:
        if relaid is not None:
            # Its bytes are in another layout now: nothing may read them as a view.
            raise DeviceError(f"linear: weights re-laid in place for {relaid}, but {why}")
        log.debug("oneDNN matmul %s: %s; numpy runs it", key, why)
        dnnl.stats["numpy"] += 1

    if relaid is not None and relaid != key:
        return numpy_instead(f"{key} asks for them")
    if prim is None or not prim.impl.startswith(cpu_dnnl.FAST_MATMUL):
        return numpy_instead("no brgemm implementation")
    detach = [h for h in (x, w, bias) if h is not None and c.overlaps(out, h)]
    extra = prim.extra_bytes() + sum(hi - lo + 128 for lo, hi in (h.byte_range() for h in detach))
    if in_place:
        extra -= prim.w.extra_bytes()       # re-laid where they lie: no copy is kept
    if extra > budget:
        # The check charged the numpy path's scratch: stay within it.
        return numpy_instead(f"{extra} scratch bytes are over the {budget} charged")
    return dnnl.work(prim, x, w, bias, out, detach, keep, in_place=in_place)


def make_linear(out: Handle, x: Handle, w: Handle, bias: Handle | None,
                tf32: bool = False) -> Callable[[], None]:
    """The cpu work of linear."""
    del tf32    # the cpu has no TF32: float32 stays float32

    n, k = w.sizes
    if _gemv_first(out.device, w):
        if k < 2 or w.strides[1] == 1:
            gemv = cpu_gemv.make_gemv(out, x, w, (n, k, w.strides[0]), bias)
            if gemv is not None:
                return gemv
        gemm = cpu_gemm.make_gemm(out, x, w, (n, k, w.strides[0], w.strides[1]), bias)
        if gemm is not None:
            return gemm
    # w[N, K] read as its transpose [K, N]: the same bytes, the strides swapped.
    dnnl_work = _dnnl_gemm(out, x, w, ((k, n), (w.strides[1], w.strides[0])), bias,
                           check_linear(out, x, w, bias)[1].scratch_bytes)
    if dnnl_work is not None:
        return dnnl_work

    blas = c.blas_scope(out.device.libraries.dnnl)

    def work() -> None:
        xv = c.load_f32(host_array(x))
        wv = c.load_f32(host_array(w))
        lead = xv.shape[:-1]
        rows = int(np.prod(lead, dtype=np.int64))
        # One 2-D GEMM instead of a stack of small ones (reshape copies only if it must).
        with blas():
            res = np.matmul(xv.reshape(rows, xv.shape[-1]), wv.T)
        if bias is not None:
            res += c.load_f32(host_array(bias))
        c.store(host_array(out), res.reshape(lead + (wv.shape[0],)))
    return work
