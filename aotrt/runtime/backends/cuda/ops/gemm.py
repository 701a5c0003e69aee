"""cuBLASLt GEMMs on cuda: plans cached per shape, make_matmul (mm, bmm, addmm) and
make_linear, and the plain plans that sdpa and conv run their GEMMs through."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from aotrt.errors import Unsupported
from aotrt.program.strides import contiguous_strides
from aotrt.runtime.backends.cuda.ops.common import (CUDA_TYPE, Scratch, Work, align,
                                                    broadcast_strides, copy_packed, copy_unpacked,
                                                    stream_workspace)
from aotrt.runtime.tensor import Handle

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaDevice, CudaStream

# cublasComputeType_t CUBLAS_COMPUTE_32F: every GEMM accumulates in float32
_COMPUTE_32F = 68
# CUBLAS_COMPUTE_32F_FAST_TF32: float32 operands rounded to TF32 on the tensor cores, only
# where the stream's Fp32Math allows it (torch's matmul.allow_tf32)
_COMPUTE_32F_FAST_TF32 = 77
# bias descriptors a GEMM plan keeps (one per linear layer of its shape that has a bias)
_BIAS_DESCS = 64


# ---------------------------------------------------------------------------------------------
# cuBLASLt


def _lt() -> Any:
    try:
        from nvmath.bindings import cublasLt
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"cuda: GEMMs need nvmath-python (cuBLASLt): {e!r}") from None
    return cublasLt


class Blas:
    """The device's cuBLASLt handle and its cache of matmul plans (device.libraries state)."""

    def __init__(self, device: "CudaDevice") -> None:
        L = _lt()
        self.L = L
        self.handle = L.create()
        self.plans: dict[tuple, "_GemmPlan"] = {}
        self.lock = threading.Lock()


@dataclass(frozen=True)
class _Operand:
    """A matrix operand as cuBLASLt sees it (column-major storage)."""

    ptr: int
    trans: bool      # op(stored) is what the product needs
    rows: int        # rows of the stored column-major matrix
    cols: int
    ld: int
    batch: int
    bstride: int     # elements between batches


def _stored(sizes: Sequence[int], strides: Sequence[int]) -> tuple[str, int] | None:
    """How a logical [R, C] view lies in memory: ('row', ld) or ('col', ld), else None."""
    r, c = sizes
    sr, sc = strides
    if (c == 1 or sc == 1) and (r == 1 or sr >= max(c, 1)):
        return "row", max(sr if r > 1 else c, c, 1)
    if (r == 1 or sr == 1) and (c == 1 or sc >= max(r, 1)):
        return "col", max(sc if c > 1 else r, r, 1)
    return None


def operand(h: Handle, want_t: bool) -> _Operand | None:
    """`h` ([R, C] or [B, R, C]) as a cuBLASLt operand whose op gives X (or X^T if want_t)."""
    if h.ndim == 3:
        batch, bstride = h.sizes[0], (h.strides[0] if h.sizes[0] > 1 else 0)
        sizes, strides = h.sizes[1:], h.strides[1:]
    else:
        batch, bstride, sizes, strides = 1, 0, h.sizes, h.strides
    st = _stored(sizes, strides)
    if st is None:
        return None
    kind, ld = st
    r, c = sizes
    if kind == "row":  # memory holds X^T as a column-major C x R matrix
        return _Operand(h.address, not want_t, c, r, ld, batch, bstride)
    return _Operand(h.address, want_t, r, c, ld, batch, bstride)


class _GemmPlan:
    """Descriptors, layouts and the chosen algorithm of one GEMM shape."""

    def __init__(self, blas: Blas, dtype: str, a: _Operand, b: _Operand, d: _Operand,
                 m: int, n: int, k: int, bias_epilogue: bool, has_c: bool,
                 aligns: tuple[int, int, int], tf32: bool = False) -> None:
        L = blas.L
        self.L = L
        self.blas = blas
        dt = CUDA_TYPE[dtype]
        self._compute = _COMPUTE_32F_FAST_TF32 if tf32 and dtype == "float32" else _COMPUTE_32F
        self._dt, self._trans, self._bias_epilogue = dt, (a.trans, b.trans), bias_epilogue
        self.desc = self._new_desc(0)
        # One descriptor per bias pointer (least recently used dropped past _BIAS_DESCS):
        # setting the pointer on a shared one cost a numpy array and a call on every run.
        self._bias_descs: OrderedDict[int, int] = OrderedDict()
        self.layouts = []
        self.adesc = self._layout(dt, a)
        self.bdesc = self._layout(dt, b)
        self.ddesc = self._layout(dt, d)
        self.cdesc = self.ddesc
        pref = L.matmul_preference_create()
        try:
            self._set(L.matmul_preference_set_attribute, L.get_matmul_preference_attribute_dtype,
                      pref, L.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, 32 << 20)
            for attr, al in zip(("A", "B", "D"), aligns):
                self._set(L.matmul_preference_set_attribute,
                          L.get_matmul_preference_attribute_dtype, pref,
                          getattr(L.MatmulPreferenceAttribute, f"MIN_ALIGNMENT_{attr}_BYTES"), al)
            self._set(L.matmul_preference_set_attribute, L.get_matmul_preference_attribute_dtype,
                      pref, L.MatmulPreferenceAttribute.MIN_ALIGNMENT_C_BYTES, aligns[2])
            results = np.zeros(8, dtype=L.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            L.matmul_algo_get_heuristic(blas.handle, self.desc, self.adesc, self.bdesc,
                                        self.cdesc, self.ddesc, pref, 8, results.ctypes.data,
                                        count.ctypes.data)
        finally:
            L.matmul_preference_destroy(pref)
        ok = [i for i in range(int(count[0])) if results[i]["state"] == 0]
        if not ok:
            raise Unsupported(f"cuda: cuBLASLt has no algorithm for a {dtype} GEMM "
                              f"m={m} n={n} k={k}")
        self.results = results
        self.algo = results.ctypes.data + ok[0] * results.dtype.itemsize
        self.workspace = int(results[ok[0]]["workspace_size"])
        self.alpha = np.zeros(1, np.float32)
        self.beta = np.zeros(1, np.float32)

    def _new_desc(self, bias: int) -> int:
        """A matmul descriptor of this shape, reading the bias at `bias` (0: none yet)."""
        L = self.L
        desc = L.matmul_desc_create(self._compute, 0)
        attrs = [(L.MatmulDescAttribute.TRANSA, 1 if self._trans[0] else 0),
                 (L.MatmulDescAttribute.TRANSB, 1 if self._trans[1] else 0)]
        if self._bias_epilogue:
            attrs += [(L.MatmulDescAttribute.EPILOGUE, int(L.Epilogue.BIAS)),
                      (L.MatmulDescAttribute.BIAS_DATA_TYPE, self._dt)]
            if bias:
                attrs.append((L.MatmulDescAttribute.BIAS_POINTER, bias))
        for attr, value in attrs:
            self._set(L.matmul_desc_set_attribute, L.get_matmul_desc_attribute_dtype, desc,
                      attr, value)
        return desc

    def _desc_for(self, bias: int) -> int:
        """The descriptor reading the bias at `bias`, made on its first use."""
        desc = self._bias_descs.get(bias)
        if desc is not None:
            self._bias_descs.move_to_end(bias)
            return desc
        desc = self._bias_descs[bias] = self._new_desc(bias)
        if len(self._bias_descs) > _BIAS_DESCS:
            _, old = self._bias_descs.popitem(last=False)
            self.L.matmul_desc_destroy(old)     # read at enqueue time only: safe to drop
        return desc

    def _set(self, fn: Any, dtype_of: Any, obj: int, attr: Any, value: int) -> None:
        arr = np.array([value], dtype=dtype_of(attr))
        fn(obj, attr, arr.ctypes.data, arr.itemsize)

    def _layout(self, dt: int, op: _Operand) -> int:
        L = self.L
        lay = L.matrix_layout_create(dt, op.rows, op.cols, op.ld)
        self.layouts.append(lay)
        if op.batch > 1:
            self._set(L.matrix_layout_set_attribute, L.get_matrix_layout_attribute_dtype, lay,
                      L.MatrixLayoutAttribute.BATCH_COUNT, op.batch)
            self._set(L.matrix_layout_set_attribute, L.get_matrix_layout_attribute_dtype, lay,
                      L.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, op.bstride)
        return lay

    def run(self, stream: "CudaStream", a: int, b: int, c: int, d: int, bias: int,
            alpha: float, beta: float) -> None:
        """Enqueue D = alpha * op(A) op(B) + beta * C (+ bias) on `stream`."""
        L = self.L
        with self.blas.lock:
            # Host scalars and the bias pointer are read at enqueue time, so sharing the plan
            # between calls (under the lock) is safe.
            self.alpha[0] = alpha
            self.beta[0] = beta
            desc = self._desc_for(bias) if bias else self.desc
            ws = stream_workspace(stream, self.workspace) if self.workspace else 0
            L.matmul(self.blas.handle, desc, self.alpha.ctypes.data, a, self.adesc, b,
                     self.bdesc, self.beta.ctypes.data, c, self.cdesc, d, self.ddesc,
                     self.algo, ws, self.workspace, stream.handle)


def _dense_like(h: Handle) -> Handle:
    """A row-major description of `h`'s sizes without memory (scratch supplies it later)."""
    return Handle(None, 0, h.sizes, contiguous_strides(h.sizes), h.dtype, h.device, h.owner)


@dataclass
class _Source:
    """Where one GEMM operand's bytes come from: the view itself, or a packed scratch copy
    of `full` (any rank; its row-major order is the packed 2-D/3-D operand's order)."""

    view: Handle
    packed: Handle | None = None
    full: Handle | None = None

    @property
    def desc(self) -> Handle:
        """The view cuBLASLt reads."""
        return self.packed if self.packed is not None else self.view

    @property
    def origin(self) -> Handle:
        """The caller's view the packed copy is made from."""
        return self.full if self.full is not None else self.view


def _source(h: Handle, want_t: bool, full: Handle | None = None) -> tuple[_Source, _Operand]:
    op = operand(h, want_t) if full is None else None
    if op is not None:
        return _Source(h), op
    t = _dense_like(h)
    return _Source(h, t, full), operand(t, want_t)


def make_matmul(out: Handle, a: Handle, b: Handle, bias: Handle | None, beta: float,
                alpha: float, tf32: bool = False, a_full: Handle | None = None,
                out_full: Handle | None = None) -> Work:
    """out = alpha * a @ b (+ beta * bias broadcast), a/b 2-D or batched 3-D, any strides.

    `tf32`: a float32 product may run as TF32 (Fp32Math.matmul_tf32). `a_full`/`out_full`
    (linear): the caller's N-D views that `a`/`out` describe as 2-D when their leading dims
    do not fold; they go through packed scratch.
    """
    dev = out.device
    blas = dev.libraries.state(Blas)
    dtype = out.dtype.name
    if dtype not in CUDA_TYPE:
        raise Unsupported(f"cuda matmul: dtype {dtype}")
    if a.sizes[-1] == 0:
        return _empty_product(out_full or out, bias, beta)
    # Output row-major (per batch) -> compute out^T = b^T a^T in column-major terms;
    # column-major -> out = a b directly; any other layout -> through packed scratch.
    d_op = operand(out, want_t=True) if out_full is None else None
    scatter = None
    if d_op is None:
        scatter = out_full if out_full is not None else out
        d_op = operand(_dense_like(out), want_t=True)
    row_out = not d_op.trans
    if row_out:
        (src_a, A), (src_b, B) = _source(b, True), _source(a, True, a_full)
        m, n = out.sizes[-1], out.sizes[-2]
    else:
        (src_a, A), (src_b, B) = _source(a, False, a_full), _source(b, False)
        m, n = out.sizes[-2], out.sizes[-1]
    k = a.sizes[-1]
    D = _Operand(d_op.ptr, False, d_op.rows, d_op.cols, d_op.ld, d_op.batch, d_op.bstride)
    batch = max(A.batch, B.batch, D.batch)
    if A.batch != batch:
        A = _Operand(A.ptr, A.trans, A.rows, A.cols, A.ld, batch, 0)
    if B.batch != batch:
        B = _Operand(B.ptr, B.trans, B.rows, B.cols, B.ld, batch, 0)
    # Bias: an aligned contiguous vector along D's rows goes to the epilogue; anything else
    # is broadcast into the output first and accumulated through C = D (beta).
    bias_vec = pre_bias = None
    if bias is not None and beta != 0.0:
        along = out.sizes[-1] if row_out else out.sizes[-2]
        want = ((along,), (1, along)) if row_out else ((along, 1),)
        unit = (bias.strides[-1] if row_out else bias.strides[-2]) if bias.ndim >= 2 or (
            row_out and bias.ndim == 1) else 0
        if (tuple(bias.sizes) in want and along > 1 and unit == 1 and beta == 1.0
                and out.ndim == 2 and bias.address % 16 == 0):
            bias_vec = bias
        else:
            pre_bias = bias
    aligns = tuple(min(16, align(p)) for p in (
        src_a.desc.address or 256, src_b.desc.address or 256,
        (D.ptr if scatter is None else 0) or 256))
    key = (dtype, A.trans, B.trans, A.rows, A.cols, A.ld, A.bstride, B.rows, B.cols, B.ld,
           B.bstride, D.rows, D.cols, D.ld, D.bstride, batch, bias_vec is not None, aligns,
           tf32)
    with blas.lock:
        plan = blas.plans.get(key)
        if plan is None:
            plan = blas.plans[key] = _GemmPlan(blas, dtype, A, B, D, m, n, k,
                                               bias_vec is not None, pre_bias is not None,
                                               aligns, tf32)
    bias_ptr = bias_vec.address if bias_vec is not None else 0
    c_beta = beta if pre_bias is not None else 0.0
    isz = out.dtype.itemsize
    out_view = scatter if scatter is not None else out

    def work(s: "CudaStream") -> None:
        scratch: list[Scratch] = []
        try:
            ptrs = []
            for src in (src_a, src_b):
                if src.packed is None:
                    ptrs.append(src.view.address)
                    continue
                sc = Scratch(s, src.origin.numel * isz)
                scratch.append(sc)
                copy_packed(dev, s, sc.ptr, src.origin)
                ptrs.append(sc.ptr)
            d_ptr = out.address
            if scatter is not None:
                sc = Scratch(s, scatter.numel * isz)
                scratch.append(sc)
                d_ptr = sc.ptr
            if pre_bias is not None:
                shape = out_view.sizes
                dst_st = out_view.strides if scatter is None else contiguous_strides(shape)
                dev.strided_work(d_ptr, pre_bias.address, shape, dst_st,
                             broadcast_strides(pre_bias, shape), isz, None)(s)
            plan.run(s, ptrs[0], ptrs[1], d_ptr, d_ptr, bias_ptr, alpha, c_beta)
            if scatter is not None:
                copy_unpacked(dev, s, scatter, d_ptr)
        finally:
            for sc in scratch:
                sc.free()
    return work


def _empty_product(out: Handle, bias: Handle | None, beta: float) -> Work:
    """out = beta * bias (broadcast) when the reduction dim is empty."""
    dev = out.device
    if bias is not None and beta != 0.0 and beta != 1.0:
        raise Unsupported("cuda matmul: k = 0 with a bias scaled by beta != 1")
    zero = dev.strided_fill_work(out, 0)
    copy = None
    if bias is not None and beta != 0.0:
        copy = dev.strided_work(out.address, bias.address, out.sizes, out.strides,
                            broadcast_strides(bias, out.sizes), out.dtype.itemsize, None)

    def work(s: "CudaStream") -> None:
        (copy or zero)(s)
    return work


def make_linear(out: Handle, x: Handle, w: Handle, bias: Handle | None,
                tf32: bool = False) -> Work:
    """out[..., N] = x[..., K] @ w[N, K]^T + bias: one GEMM over all leading rows."""
    n, k = w.sizes
    rows = 1
    for s in x.sizes[:-1]:
        rows *= s
    x2 = _flatten_rows(x, rows, k)
    o2 = _flatten_rows(out, rows, n)
    wt = Handle(w.alloc, w.byte_offset, (k, n), (w.strides[1], w.strides[0]), w.dtype, w.device,
                w.owner)
    b1 = None
    if bias is not None:
        b1 = bias if bias.ndim == 1 else Handle(bias.alloc, bias.byte_offset, (1,), (1,),
                                                bias.dtype, bias.device, bias.owner)
    # Leading dims that do not fold into one row dim go through packed scratch.
    a_full = out_full = None
    if x2 is None:
        x2 = Handle(None, 0, (rows, k), (k, 1), x.dtype, x.device, x.owner)
        a_full = x
    if o2 is None:
        o2 = Handle(None, 0, (rows, n), (n, 1), out.dtype, out.device, out.owner)
        out_full = out
    return make_matmul(o2, x2, wt, b1, 1.0, 1.0, tf32, a_full=a_full, out_full=out_full)


def _flatten_rows(h: Handle, rows: int, cols: int) -> Handle | None:
    """`h` [..., cols] as a 2-D [rows, cols] view if its leading dims fold, else None."""
    if h.ndim == 1:
        return Handle(h.alloc, h.byte_offset, (1, cols), (cols, h.strides[0]), h.dtype,
                      h.device, h.owner)
    lead_sizes = [s for s in h.sizes[:-1]]
    lead_strides = [st for s, st in zip(h.sizes[:-1], h.strides[:-1])]
    row_stride = None
    expect = None
    for s, st in zip(reversed(lead_sizes), reversed(lead_strides)):
        if s == 1:
            continue
        if row_stride is None:
            row_stride, expect = st, st * s
        elif st != expect:
            return None
        else:
            expect = st * s
    if row_stride is None:
        row_stride = cols
    return Handle(h.alloc, h.byte_offset, (rows, cols), (row_stride, h.strides[-1]), h.dtype,
                  h.device, h.owner)


def plain_plan(dev: "CudaDevice", out: Handle, a: Handle, b: Handle,
                aligns_abo: tuple[int, int, int] = (16, 16, 16)) -> tuple[_GemmPlan, bool]:
    """A plan for out = a @ b (views whose addresses may be placeholders); returns the plan
    and whether the operands go in swapped (b first), as make_matmul decides.

    `aligns_abo`: the alignment (bytes, at most 16) every pointer of a, b and out will have
    when the plan runs; cuBLASLt refuses at run time what a plan assumed wrongly."""
    blas = dev.libraries.state(Blas)
    d_op = operand(out, want_t=True)
    row_out = not d_op.trans
    if row_out:
        A, B = operand(b, True), operand(a, True)
        m, n = out.sizes[-1], out.sizes[-2]
    else:
        A, B = operand(a, False), operand(b, False)
        m, n = out.sizes[-2], out.sizes[-1]
    if A is None or B is None:
        raise Unsupported("cuda: an attention operand in a layout cuBLASLt cannot read")
    D = _Operand(0, False, d_op.rows, d_op.cols, d_op.ld, d_op.batch, d_op.bstride)
    batch = max(A.batch, B.batch, D.batch)
    A = _Operand(0, A.trans, A.rows, A.cols, A.ld, batch, A.bstride if A.batch > 1 else 0)
    B = _Operand(0, B.trans, B.rows, B.cols, B.ld, batch, B.bstride if B.batch > 1 else 0)
    al_a, al_b, al_o = (min(16, x) for x in aligns_abo)
    aligns = (al_b, al_a, al_o) if row_out else (al_a, al_b, al_o)
    dtype = out.dtype.name
    key = ("plain", dtype, A.trans, B.trans, A.rows, A.cols, A.ld, A.bstride, B.rows, B.cols,
           B.ld, B.bstride, D.rows, D.cols, D.ld, D.bstride, batch, aligns)
    with blas.lock:
        plan = blas.plans.get(key)
        if plan is None:
            plan = blas.plans[key] = _GemmPlan(blas, dtype, A, B, D, m, n, a.sizes[-1], False,
                                               False, aligns)
    return plan, row_out
