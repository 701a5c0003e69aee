"""Matrix products: mm, bmm, addmm and linear, into caller-provided output views.

Inputs may be any views (transposed, strided, offset); outputs may be non-packed views and
are written in place. float32, float16 and bfloat16; half types compute in float32 and
round once on store. On cpu, float32 linear, mm and addmm (alpha 1, beta 0 or 1, a bias
row) run as a oneDNN matmul (ops/cpu_dnnl.py) where oneDNN has a FAST_MATMUL implementation
for them and the views fold into 2-D ones; everything else through numpy's BLAS, on one
thread where the device's GEMMs run on oneDNN's pool (`Dnnl.numpy_blas`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import numpy as np

from aotrt.errors import DeviceError, InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.ops.cuda import gemm as cuda_gemm
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)



def _dtypes(op: str, out: Any, named: list[tuple[Any, str]]) -> None:
    c.check_output(op, out, "out")
    c.check_dtype(op, out, "out")
    for h, name in named:
        c.check_same_dtype(op, out, "out", h, name)


#: scratch bytes a GEMM may take beside its operands' copies, for a library's own workspace:
#: oneDNN's brgemm matmul asked 9472 bytes for a 1x9 @ 9x48 product, where the copies are
#: 1.8 KB (and 263 KB for 128x768 @ 768x3072, where they are 9.8 MB)
GEMM_WORKSPACE = 64 << 10


def _gemm_cost(out: Any, ins: list[Any], steps: int, scratch_ins: int) -> c.OpCost:
    """A GEMM's cost on cpu: `steps` multiply-adds plus a visit of every element; scratch
    is the float32 copies of the inputs (matmul copies strided operands), the float32
    result and its rounded copy, and a library's workspace."""
    visits = out.numel + sum(h.numel for h in ins)
    scratch = 4 * scratch_ins + 4 * out.numel + out.dtype.itemsize * out.numel + \
        GEMM_WORKSPACE
    return c.OpCost(steps + visits, scratch)


def check_mm(out: Any, a: Any, b: Any) -> tuple[None, c.OpCost]:
    """Validate mm's metadata (dtype, sizes, strides); return its cost."""
    op = "mm"
    _dtypes(op, out, [(a, "a"), (b, "b")])
    c.check_rank(op, a, "a", (2,))
    c.check_rank(op, b, "b", (2,))
    if a.sizes[1] != b.sizes[0]:
        raise InvalidArgument(f"mm: b: K mismatch, a is {list(a.sizes)} and b {list(b.sizes)}")
    c.check_shape(op, out, "out", (a.sizes[0], b.sizes[1]))
    return None, _gemm_cost(out, [a, b], out.numel * a.sizes[1], a.numel + b.numel)


def mm(stream: Stream, out: Handle, a: Handle, b: Handle) -> int:
    """out[M,N] = a[M,K] @ b[K,N]."""
    c.check_handles("mm", stream, [(out, "out"), (a, "a"), (b, "b")])
    check_mm(out, a, b)
    return c.launch("mm", stream, [out], [a, b], _MATMUL, out, a, b, None, 1.0, 1.0,
                    _tf32(stream))


def check_bmm(out: Any, a: Any, b: Any) -> tuple[None, c.OpCost]:
    """Validate bmm's metadata; return its cost."""
    op = "bmm"
    _dtypes(op, out, [(a, "a"), (b, "b")])
    c.check_rank(op, a, "a", (3,))
    c.check_rank(op, b, "b", (3,))
    if a.sizes[0] != b.sizes[0]:
        raise InvalidArgument(f"bmm: b: batch mismatch, a is {list(a.sizes)} and b "
                              f"{list(b.sizes)}")
    if a.sizes[2] != b.sizes[1]:
        raise InvalidArgument(f"bmm: b: K mismatch, a is {list(a.sizes)} and b {list(b.sizes)}")
    c.check_shape(op, out, "out", (a.sizes[0], a.sizes[1], b.sizes[2]))
    return None, _gemm_cost(out, [a, b], out.numel * a.sizes[2], a.numel + b.numel)


def bmm(stream: Stream, out: Handle, a: Handle, b: Handle) -> int:
    """out[B,M,N] = a[B,M,K] @ b[B,K,N] (any strides)."""
    c.check_handles("bmm", stream, [(out, "out"), (a, "a"), (b, "b")])
    check_bmm(out, a, b)
    return c.launch("bmm", stream, [out], [a, b], _MATMUL, out, a, b, None, 1.0, 1.0,
                    _tf32(stream))


def check_addmm(out: Any, bias: Any, a: Any, b: Any, beta: Any = 1,
                alpha: Any = 1) -> tuple[tuple[float, float], c.OpCost]:
    """Validate addmm's metadata and params; return (beta, alpha) and its cost."""
    op = "addmm"
    _dtypes(op, out, [(bias, "bias"), (a, "a"), (b, "b")])
    c.check_rank(op, a, "a", (2,))
    c.check_rank(op, b, "b", (2,))
    c.check_rank(op, bias, "bias", (0, 1, 2))
    if a.sizes[1] != b.sizes[0]:
        raise InvalidArgument(f"addmm: b: K mismatch, a is {list(a.sizes)} and b "
                              f"{list(b.sizes)}")
    shape = (a.sizes[0], b.sizes[1])
    if c.broadcast_shape(op, [bias.sizes, shape], "bias") != shape:
        raise InvalidArgument(f"addmm: bias: sizes {list(bias.sizes)} do not broadcast to "
                              f"{list(shape)}")
    c.check_shape(op, out, "out", shape)
    beta = c.as_float(op, beta, "beta")
    alpha = c.as_float(op, alpha, "alpha")
    # bias: a float32 copy and its product with beta.
    cost = _gemm_cost(out, [bias, a, b], out.numel * a.sizes[1],
                      a.numel + b.numel + 2 * bias.numel)
    return (beta, alpha), cost


def addmm(stream: Stream, out: Handle, bias: Handle, a: Handle, b: Handle,
          beta: float = 1, alpha: float = 1) -> int:
    """out[M,N] = beta * bias + alpha * (a[M,K] @ b[K,N]); bias broadcasts from 0/1/2-D.

    As in torch, beta == 0 ignores bias's values (NaN in bias does not propagate).
    """
    c.check_handles("addmm", stream, [(out, "out"), (bias, "bias"), (a, "a"), (b, "b")])
    (beta, alpha), _ = check_addmm(out, bias, a, b, beta, alpha)
    return c.launch("addmm", stream, [out], [bias, a, b], _MATMUL, out, a, b, bias, beta,
                    alpha, _tf32(stream))


def check_linear(out: Any, x: Any, w: Any, bias: Any = None) -> tuple[None, c.OpCost]:
    """Validate linear's metadata; return its cost."""
    op = "linear"
    _dtypes(op, out, [(x, "x"), (w, "w")] + ([(bias, "bias")] if bias is not None else []))
    if x.ndim < 1:
        raise InvalidArgument("linear: x: expected a tensor of rank >= 1, got a 0-D tensor")
    c.check_rank(op, w, "w", (2,))
    n, k = w.sizes
    if x.sizes[-1] != k:
        raise InvalidArgument(f"linear: w: in-features {k} of w {list(w.sizes)} do not match "
                              f"x's last dim {x.sizes[-1]}")
    if bias is not None:
        c.check_rank(op, bias, "bias", (0, 1))
        if bias.ndim == 1 and bias.sizes[0] not in (n, 1):
            raise InvalidArgument(f"linear: bias: expected {n} elements, got {list(bias.sizes)}")
    c.check_shape(op, out, "out", tuple(x.sizes[:-1]) + (n,))
    ins = [x, w] + ([bias] if bias is not None else [])
    # x and w: float32 copies, then the reshape of x and matmul's copy of w.T.
    return None, _gemm_cost(out, ins, out.numel * k,
                            2 * x.numel + 2 * w.numel + (bias.numel if bias is not None else 0))


def linear(stream: Stream, out: Handle, x: Handle, w: Handle, bias: Handle | None = None) -> int:
    """out[..., N] = x[..., K] @ w[N, K].T (+ bias[N]), x of any rank >= 1."""
    c.check_handles("linear", stream, [(out, "out"), (x, "x"), (w, "w"), (bias, "bias")])
    check_linear(out, x, w, bias)
    return c.launch("linear", stream, [out], [x, w, bias], _LINEAR, out, x, w, bias,
                    _tf32(stream))


def _tf32(stream: Stream) -> bool:
    """Whether the stream lets a float32 matmul run as TF32 (cuda; the cpu has no TF32)."""
    return stream.options.fp32_math.matmul_tf32


# -- cpu ----------------------------------------------------------------------------------------

def _cpu_matmul(out: Handle, a: Handle, b: Handle, bias: Handle | None, beta: float,
                alpha: float, tf32: bool = False) -> Callable[[], None]:
    from aotrt.runtime.devices.cpu import host_array

    del tf32    # the cpu has no TF32: float32 stays float32

    if a.ndim == 2 and b.ndim == 2 and alpha == 1.0 and beta in (0.0, 1.0):
        # mm and addmm (bmm stays on numpy); beta == 0 ignores the bias, as torch does.
        use = bias if beta == 1.0 else None
        cost = (check_mm(out, a, b) if bias is None else
                check_addmm(out, bias, a, b, beta, alpha))[1]
        dnnl_work = _dnnl_gemm(out, a, b, (tuple(b.sizes), tuple(b.strides)), use,
                               cost.scratch_bytes)
        if dnnl_work is not None:
            return dnnl_work

    blas = c.blas_scope(out.device)

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
    dnnl = getattr(out.device, "dnnl", None)
    if dnnl is None or out.dtype.name != "float32":
        return None
    from aotrt.runtime.ops import cpu_dnnl

    xr, outr = _rows(x), _rows(out)
    ok, bias_stride = _bias_row(bias, w_kn[0][1])
    if xr is None or outr is None or not ok:
        return None
    keep = w.alloc is not None and w.alloc.kind == "constants" and not c.overlaps(out, w)
    # Weights only this instruction reads are re-laid into brgemm's blocked layout in place.
    in_place = keep and cpu_dnnl.sole_read(w)
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


def _cpu_linear(out: Handle, x: Handle, w: Handle, bias: Handle | None,
                tf32: bool = False) -> Callable[[], None]:
    from aotrt.runtime.devices.cpu import host_array

    del tf32    # the cpu has no TF32: float32 stays float32

    n, k = w.sizes
    # w[N, K] read as its transpose [K, N]: the same bytes, the strides swapped.
    dnnl_work = _dnnl_gemm(out, x, w, ((k, n), (w.strides[1], w.strides[0])), bias,
                           check_linear(out, x, w, bias)[1].scratch_bytes)
    if dnnl_work is not None:
        return dnnl_work

    blas = c.blas_scope(out.device)

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


_MATMUL: dict[str, Callable[..., Any]] = {"cpu": _cpu_matmul, "cuda": cuda_gemm.make_matmul}
_LINEAR: dict[str, Callable[..., Any]] = {"cpu": _cpu_linear, "cuda": cuda_gemm.make_linear}
