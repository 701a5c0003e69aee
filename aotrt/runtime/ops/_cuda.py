"""The cuda side of the library ops: cuBLASLt GEMMs (through nvmath-python's bindings), cuDNN
convolution and attention (through its frontend), and own CUDA kernels where no library
fits (pooling, upsampling, topk, im2col, softmax).

Every `make_*` function runs when the op is recorded: it validates what the libraries
accept, builds (and caches) plans, and returns the work, a callable that enqueues onto the
given CudaStream. Scratch memory inside a work item comes from the stream-ordered pool
and goes back to it on the same stream, so it needs no host wait and survives graph capture.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError, Unsupported
from aotrt.runtime.tensor import Handle, contiguous_strides

if TYPE_CHECKING:
    from aotrt.runtime.devices.cuda import CudaDevice, CudaStream

log = logging.getLogger(__name__)

Work = Callable[["CudaStream"], None]

# cudaDataType codes of the float dtypes
_CUDA_TYPE = {"float32": 0, "float16": 2, "bfloat16": 14}
_COMPUTE_32F = 68


def _align(ptr: int) -> int:
    """The largest power of two (at most 256) that divides `ptr`."""
    if ptr == 0:
        return 256
    return min(256, ptr & -ptr)


# ---------------------------------------------------------------------------------------------
# scratch


class Scratch:
    """Device memory for the length of one work item, in stream order on `stream`.

    It comes straight from the driver's stream-ordered allocator (cuMemAllocAsync), which
    also works while the stream is being captured into a CUDA graph (as graph memory nodes).
    """

    def __init__(self, stream: "CudaStream", nbytes: int) -> None:
        from cuda.bindings import driver

        self._stream = stream
        err, ptr = driver.cuMemAllocAsync(max(nbytes, 1), stream.handle)
        if int(err) != 0:
            raise DeviceError(f"cuda: scratch of {nbytes} bytes: {err}")
        self.ptr = int(ptr)

    def free(self) -> None:
        """Give the memory back after everything enqueued so far on the stream."""
        from cuda.bindings import driver

        if self.ptr:
            driver.cuMemFreeAsync(self.ptr, self._stream.handle)
            self.ptr = 0


def stream_workspace(stream: "CudaStream", nbytes: int) -> int:
    """A per-stream workspace of at least `nbytes`; grows in stream order (old one freed
    after the work already enqueued that uses it)."""
    cur = getattr(stream, "_aot_workspace", None)
    if cur is not None and cur[1] >= nbytes:
        return cur[0]
    if stream.capturing:
        raise DeviceError(f"cuda: a library op needs {nbytes} bytes of workspace while "
                          f"capturing a graph; run once without capture first")
    size = max(nbytes, 32 << 20, (cur[1] * 2) if cur else 0)
    buf = stream.device.core.allocate(size, stream=stream.cs)
    if cur is not None:
        cur[2].close(stream.cs)
    stream._aot_workspace = (int(buf.handle), size, buf)
    return int(buf.handle)


# ---------------------------------------------------------------------------------------------
# cuBLASLt


def _lt() -> Any:
    try:
        from nvmath.bindings import cublasLt
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"cuda: GEMMs need nvmath-python (cuBLASLt): {e!r}") from None
    return cublasLt


class _Blas:
    """One cuBLASLt handle per device, with a cache of matmul plans."""

    def __init__(self) -> None:
        L = _lt()
        self.L = L
        self.handle = L.create()
        self.plans: dict[tuple, "_GemmPlan"] = {}
        self.lock = threading.Lock()


_blas: dict[int, _Blas] = {}
_blas_lock = threading.Lock()


def _get_blas(dev: "CudaDevice") -> _Blas:
    with _blas_lock:
        b = _blas.get(id(dev))
        if b is None:
            dev.ensure_current()
            b = _blas[id(dev)] = _Blas()
        return b


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


def _operand(h: Handle, want_t: bool) -> _Operand | None:
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

    def __init__(self, blas: _Blas, dtype: str, a: _Operand, b: _Operand, d: _Operand,
                 m: int, n: int, k: int, bias_epilogue: bool, has_c: bool,
                 aligns: tuple[int, int, int]) -> None:
        L = blas.L
        self.L = L
        self.blas = blas
        dt = _CUDA_TYPE[dtype]
        compute = _COMPUTE_32F
        self.desc = L.matmul_desc_create(compute, 0)
        self._set_desc(L.MatmulDescAttribute.TRANSA, 1 if a.trans else 0)
        self._set_desc(L.MatmulDescAttribute.TRANSB, 1 if b.trans else 0)
        if bias_epilogue:
            self._set_desc(L.MatmulDescAttribute.EPILOGUE, int(L.Epilogue.BIAS))
            self._set_desc(L.MatmulDescAttribute.BIAS_DATA_TYPE, dt)
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
        self._bias_attr = L.MatmulDescAttribute.BIAS_POINTER

    def _set(self, fn: Any, dtype_of: Any, obj: int, attr: Any, value: int) -> None:
        arr = np.array([value], dtype=dtype_of(attr))
        fn(obj, attr, arr.ctypes.data, arr.itemsize)

    def _set_desc(self, attr: Any, value: int) -> None:
        self._set(self.L.matmul_desc_set_attribute, self.L.get_matmul_desc_attribute_dtype,
                  self.desc, attr, value)

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
            if bias:
                self._set_desc(self._bias_attr, bias)
            ws = stream_workspace(stream, self.workspace) if self.workspace else 0
            L.matmul(self.blas.handle, self.desc, self.alpha.ctypes.data, a, self.adesc, b,
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
    op = _operand(h, want_t) if full is None else None
    if op is not None:
        return _Source(h), op
    t = _dense_like(h)
    return _Source(h, t, full), _operand(t, want_t)


def _copy_packed(dev: "CudaDevice", s: "CudaStream", dst: int, src: Handle) -> None:
    """Enqueue a copy of view `src` into packed row-major memory at `dst`."""
    dev._strided(dst, src.address, src.sizes, contiguous_strides(src.sizes), src.strides,
                 src.dtype.itemsize, None)(s)


def _copy_unpacked(dev: "CudaDevice", s: "CudaStream", dst: Handle, src: int) -> None:
    """Enqueue a copy of packed row-major memory at `src` into view `dst`."""
    dev._strided(dst.address, src, dst.sizes, dst.strides, contiguous_strides(dst.sizes),
                 dst.dtype.itemsize, None)(s)


def make_matmul(out: Handle, a: Handle, b: Handle, bias: Handle | None, beta: float,
                alpha: float, a_full: Handle | None = None,
                out_full: Handle | None = None) -> Work:
    """out = alpha * a @ b (+ beta * bias broadcast), a/b 2-D or batched 3-D, any strides.

    `a_full`/`out_full` (linear): the caller's N-D views that `a`/`out` describe as 2-D when
    their leading dims do not fold; they go through packed scratch.
    """
    dev = out.device
    blas = _get_blas(dev)
    dtype = out.dtype.name
    if dtype not in _CUDA_TYPE:
        raise Unsupported(f"cuda matmul: dtype {dtype}")
    if a.sizes[-1] == 0:
        return _empty_product(out_full or out, bias, beta)
    # Output row-major (per batch) -> compute out^T = b^T a^T in column-major terms;
    # column-major -> out = a b directly; any other layout -> through packed scratch.
    d_op = _operand(out, want_t=True) if out_full is None else None
    scatter = None
    if d_op is None:
        scatter = out_full if out_full is not None else out
        d_op = _operand(_dense_like(out), want_t=True)
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
    aligns = tuple(min(16, _align(p)) for p in (
        src_a.desc.address or 256, src_b.desc.address or 256,
        (D.ptr if scatter is None else 0) or 256))
    key = (dtype, A.trans, B.trans, A.rows, A.cols, A.ld, A.bstride, B.rows, B.cols, B.ld,
           B.bstride, D.rows, D.cols, D.ld, D.bstride, batch, bias_vec is not None, aligns)
    with blas.lock:
        plan = blas.plans.get(key)
        if plan is None:
            plan = blas.plans[key] = _GemmPlan(blas, dtype, A, B, D, m, n, k,
                                               bias_vec is not None, pre_bias is not None,
                                               aligns)
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
                _copy_packed(dev, s, sc.ptr, src.origin)
                ptrs.append(sc.ptr)
            d_ptr = out.address
            if scatter is not None:
                sc = Scratch(s, scatter.numel * isz)
                scratch.append(sc)
                d_ptr = sc.ptr
            if pre_bias is not None:
                shape = out_view.sizes
                dst_st = out_view.strides if scatter is None else contiguous_strides(shape)
                dev._strided(d_ptr, pre_bias.address, shape, dst_st,
                             _broadcast_strides(pre_bias, shape), isz, None)(s)
            plan.run(s, ptrs[0], ptrs[1], d_ptr, d_ptr, bias_ptr, alpha, c_beta)
            if scatter is not None:
                _copy_unpacked(dev, s, scatter, d_ptr)
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
        copy = dev._strided(out.address, bias.address, out.sizes, out.strides,
                            _broadcast_strides(bias, out.sizes), out.dtype.itemsize, None)

    def work(s: "CudaStream") -> None:
        (copy or zero)(s)
    return work


def _broadcast_strides(h: Handle, shape: Sequence[int]) -> tuple[int, ...]:
    """Strides reading `h` broadcast (numpy rules) to `shape`: 0 on broadcast dims."""
    pad = len(shape) - h.ndim
    out = []
    for i, n in enumerate(shape):
        j = i - pad
        if j < 0 or h.sizes[j] == 1:
            out.append(0)
        else:
            out.append(h.strides[j])
    return tuple(out)


def make_linear(out: Handle, x: Handle, w: Handle, bias: Handle | None) -> Work:
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
    return make_matmul(o2, x2, wt, b1, 1.0, 1.0, a_full=a_full, out_full=out_full)


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


# ---------------------------------------------------------------------------------------------
# own kernels: pooling, upsampling, attention softmax, topk
#
# Sizes and strides travel as kernel arguments, so one compiled module (cached on disk)
# serves every shape. Values are computed in float; T is the storage type.

_KERNELS = r"""
typedef long long int64_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
#define AOT_INF __int_as_float(0x7f800000)
struct f32 { float v; };
static __device__ __forceinline__ float ld(const float* p) { return *p; }
static __device__ __forceinline__ void st(float* p, float v) { *p = v; }
struct h16 { uint16_t v; };
static __device__ __forceinline__ float ld(const h16* p) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->v)); return f; }
static __device__ __forceinline__ void st(h16* p, float f) {
  uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); p->v = h; }
struct bf16 { uint16_t v; };
static __device__ __forceinline__ float ld(const bf16* p) {
  return __uint_as_float(((uint32_t)p->v) << 16); }
static __device__ __forceinline__ void st(bf16* p, float f) {
  uint16_t h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); p->v = h; }

// One thread per output element (n, c, oh, ow); first max in window order wins, a NaN wins
// over numbers (the last NaN), padding is never selected.
template <typename T>
__device__ void maxpool(const T* x, T* out, int64_t* idx, int64_t N, int64_t C, int64_t H,
    int64_t W, int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3,
    int64_t os0, int64_t os1, int64_t os2, int64_t os3, int64_t is0, int64_t is1,
    int64_t is2, int64_t is3, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
  const int64_t total = N * C * HO * WO;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % WO, r = i / WO; int64_t oh = r % HO; r /= HO;
    int64_t c = r % C, n = r / C;
    const T* xp = x + n * xs0 + c * xs1;
    float best = -AOT_INF; int64_t at = -1;
    for (int a = 0; a < kh; a++) {
      int64_t h = oh * sh - ph + (int64_t)a * dh;
      if (h < 0 || h >= H) continue;
      for (int b = 0; b < kw; b++) {
        int64_t w = ow * sw - pw + (int64_t)b * dw;
        if (w < 0 || w >= W) continue;
        float v = ld(xp + h * xs2 + w * xs3);
        if (at < 0 || v != v || (best == best && v > best)) { best = v; at = h * W + w; }
      }
    }
    st(out + n * os0 + c * os1 + oh * os2 + ow * os3, best);
    if (idx) idx[n * is0 + c * is1 + oh * is2 + ow * is3] = at;
  }
}

// out[n, c, oh, ow] = x[n, c, rows[oh], cols[ow]] (the op computes torch's source indices)
template <typename T>
__device__ void upsample(const T* x, T* out, const int64_t* rows, const int64_t* cols,
    int64_t N, int64_t C, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t xs0,
    int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0, int64_t os1, int64_t os2,
    int64_t os3) {
  const int64_t total = N * C * HO * WO;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % WO, r = i / WO; int64_t oh = r % HO; r /= HO;
    int64_t c = r % C, n = r / C;
    out[n * os0 + c * os1 + oh * os2 + ow * os3] =
        x[n * xs0 + c * xs1 + rows[oh] * xs2 + cols[ow] * xs3];
  }
}

// Softmax over rows of a packed [NB, L, S] score block, in place, one warp per row:
// p = softmax(s * scale + mask) with an optional additive or boolean mask (read through
// strides over up to 4 batch dims) and an optional top-left causal mask (col <= row).
template <typename T, typename M>
__device__ void softmax_rows(T* s, const M* mask, int mask_kind, int64_t NB, int64_t L,
    int64_t S, float scale, int causal, int nbd, int64_t b0, int64_t b1, int64_t b2,
    int64_t b3, int64_t m0, int64_t m1, int64_t m2, int64_t m3, int64_t ml, int64_t ms) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = NB * L;
  const int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows;
       row += nw) {
    const int64_t l = row % L, b = row / L;
    int64_t moff = 0;
    if (mask_kind) {
      const int64_t B[4] = {b0, b1, b2, b3}; const int64_t MS[4] = {m0, m1, m2, m3};
      int64_t r = b;
      for (int d = nbd - 1; d >= 0; d--) { moff += (r % B[d]) * MS[d]; r /= B[d]; }
      moff += l * ml;
    }
    T* p = s + row * S;
    float mx = -AOT_INF;
    for (int64_t j = lane; j < S; j += 32) {
      float v = ld(p + j) * scale;
      if (mask_kind == 1) v += ld(mask + moff + j * ms);
      if (mask_kind == 2 && !((const uint8_t*)mask)[moff + j * ms]) v = -AOT_INF;
      if (causal && j > l) v = -AOT_INF;
      mx = fmaxf(mx, v);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int64_t j = lane; j < S; j += 32) {
      float v = ld(p + j) * scale;
      if (mask_kind == 1) v += ld(mask + moff + j * ms);
      if (mask_kind == 2 && !((const uint8_t*)mask)[moff + j * ms]) v = -AOT_INF;
      if (causal && j > l) v = -AOT_INF;
      sum += __expf(v - mx);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    // a fully masked row gives zeros, as torch does (not 0/0)
    const float inv = mx == -AOT_INF ? 0.0f : 1.0f / sum;
    if (mx == -AOT_INF) mx = 0.0f;
    for (int64_t j = lane; j < S; j += 32) {
      float v = ld(p + j) * scale;
      if (mask_kind == 1) v += ld(mask + moff + j * ms);
      if (mask_kind == 2 && !((const uint8_t*)mask)[moff + j * ms]) v = -AOT_INF;
      if (causal && j > l) v = -AOT_INF;
      st(p + j, __expf(v - mx) * inv);
    }
  }
}

#define AOT_POOL(NAME, T) extern "C" __global__ void NAME(const T* x, T* out, int64_t* idx, \
    int64_t N, int64_t C, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t xs0, \
    int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0, int64_t os1, int64_t os2, \
    int64_t os3, int64_t is0, int64_t is1, int64_t is2, int64_t is3, int kh, int kw, \
    int sh, int sw, int ph, int pw, int dh, int dw) { maxpool<T>(x, out, idx, N, C, H, W, \
    HO, WO, xs0, xs1, xs2, xs3, os0, os1, os2, os3, is0, is1, is2, is3, kh, kw, sh, sw, ph, \
    pw, dh, dw); }
AOT_POOL(aot_maxpool_float32, float)
AOT_POOL(aot_maxpool_float16, h16)
AOT_POOL(aot_maxpool_bfloat16, bf16)

struct b1 { uint8_t v; }; struct b2 { uint16_t v; }; struct b4 { uint32_t v; };
struct b8 { int64_t v; };
#define AOT_UP(NAME, T) extern "C" __global__ void NAME(const T* x, T* out, \
    const int64_t* rows, const int64_t* cols, int64_t N, int64_t C, int64_t H, int64_t W, \
    int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0, \
    int64_t os1, int64_t os2, int64_t os3) { upsample<T>(x, out, rows, cols, N, C, H, W, HO, \
    WO, xs0, xs1, xs2, xs3, os0, os1, os2, os3); }
AOT_UP(aot_upsample1, b1)
AOT_UP(aot_upsample2, b2)
AOT_UP(aot_upsample4, b4)
AOT_UP(aot_upsample8, b8)

#define AOT_SOFTMAX(NAME, T, M) extern "C" __global__ void NAME(T* s, const M* mask, \
    int mask_kind, int64_t NB, int64_t L, int64_t S, float scale, int causal, int nbd, \
    int64_t b0, int64_t b1, int64_t b2, int64_t b3, int64_t m0, int64_t m1, int64_t m2, \
    int64_t m3, int64_t ml, int64_t ms) { softmax_rows<T, M>(s, mask, mask_kind, NB, L, S, \
    scale, causal, nbd, b0, b1, b2, b3, m0, m1, m2, m3, ml, ms); }
AOT_SOFTMAX(aot_softmax_float32_float32, float, float)
AOT_SOFTMAX(aot_softmax_float16_float16, h16, h16)
AOT_SOFTMAX(aot_softmax_float16_float32, h16, float)
AOT_SOFTMAX(aot_softmax_bfloat16_bfloat16, bf16, bf16)
AOT_SOFTMAX(aot_softmax_bfloat16_float32, bf16, float)
AOT_SOFTMAX(aot_softmax_float32_float16, float, h16)
AOT_SOFTMAX(aot_softmax_float32_bfloat16, float, bf16)

// col[n, (c*KH + a)*KW + b, oh*WO + ow] = x[n, c, oh*sh - ph + a*dh, ow*sw - pw + b*dw] or 0
template <typename T>
__device__ void im2col(const T* x, T* col, int64_t N, int64_t C, int64_t H, int64_t W,
    int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, int kh, int kw,
    int sh, int sw, int ph, int pw, int dh, int dw) {
  const int64_t total = N * C * kh * kw * HO * WO;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % WO, r = i / WO; int64_t oh = r % HO; r /= HO;
    int64_t b = r % kw; r /= kw; int64_t a = r % kh; r /= kh;
    int64_t c = r % C, n = r / C;
    int64_t h = oh * sh - ph + a * dh, w = ow * sw - pw + b * dw;
    T v; v.v = 0;
    if (h >= 0 && h < H && w >= 0 && w < W) v = x[n * xs0 + c * xs1 + h * xs2 + w * xs3];
    col[i] = v;
  }
}
#define AOT_IM2COL(NAME, T) extern "C" __global__ void NAME(const T* x, T* col, int64_t N, \
    int64_t C, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, \
    int64_t xs2, int64_t xs3, int kh, int kw, int sh, int sw, int ph, int pw, int dh, \
    int dw) { im2col<T>(x, col, N, C, H, W, HO, WO, xs0, xs1, xs2, xs3, kh, kw, sh, sw, ph, \
    pw, dh, dw); }
AOT_IM2COL(aot_im2col2, b2)
AOT_IM2COL(aot_im2col4, b4)

// Transposed convolution, second half: out[n, co, oh, ow] = bias[co] + the sum over taps
// (a, b) with oh + ph - a*dh = ih*sh and ow + pw - b*dw = iw*sw (in range) of
// cols[n, g, (j*KH + a)*KW + b, ih*W + iw], where co = g*OG + j (a gather: no atomics).
template <typename T>
__device__ void col2im(const T* cols, T* out, const T* bias, int64_t bs, int64_t N,
    int64_t CO, int64_t G, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t os0,
    int64_t os1, int64_t os2, int64_t os3, int kh, int kw, int sh, int sw, int ph, int pw,
    int dh, int dw) {
  const int64_t total = N * CO * HO * WO;
  const int64_t OG = CO / G, KK = (int64_t)kh * kw, HW = H * W;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % WO, r = i / WO; int64_t oh = r % HO; r /= HO;
    int64_t co = r % CO, n = r / CO;
    int64_t g = co / OG, j = co % OG;
    const T* cp = cols + ((n * G + g) * OG + j) * KK * HW;
    float acc = bias ? ld(bias + co * bs) : 0.0f;
    for (int a = 0; a < kh; a++) {
      int64_t t = oh + ph - (int64_t)a * dh;
      if (t < 0 || t % sh) continue;
      int64_t ih = t / sh;
      if (ih >= H) continue;
      for (int b = 0; b < kw; b++) {
        int64_t u = ow + pw - (int64_t)b * dw;
        if (u < 0 || u % sw) continue;
        int64_t iw = u / sw;
        if (iw >= W) continue;
        acc += ld(cp + ((int64_t)a * kw + b) * HW + ih * W + iw);
      }
    }
    st(out + n * os0 + co * os1 + oh * os2 + ow * os3, acc);
  }
}
#define AOT_COL2IM(NAME, T) extern "C" __global__ void NAME(const T* cols, T* out, \
    const T* bias, int64_t bs, int64_t N, int64_t CO, int64_t G, int64_t H, int64_t W, \
    int64_t HO, int64_t WO, int64_t os0, int64_t os1, int64_t os2, int64_t os3, int kh, \
    int kw, int sh, int sw, int ph, int pw, int dh, int dw) { col2im<T>(cols, out, bias, bs, \
    N, CO, G, H, W, HO, WO, os0, os1, os2, os3, kh, kw, sh, sw, ph, pw, dh, dw); }
AOT_COL2IM(aot_col2im_float32, float)
AOT_COL2IM(aot_col2im_float16, h16)
AOT_COL2IM(aot_col2im_bfloat16, bf16)

// topk along the last dim of a [rows, n] view (row stride rs, element stride es): one
// thread per row, k selection passes; NaN ranks above numbers; ties by ascending index.
// Values are compared as double (exact for every dtype here) and copied bit for bit.
static __device__ __forceinline__ double ldd(const float* p) { return *p; }
static __device__ __forceinline__ double ldd(const h16* p) { return ld(p); }
static __device__ __forceinline__ double ldd(const bf16* p) { return ld(p); }
static __device__ __forceinline__ double ldd(const long long* p) { return (double)*p; }
static __device__ __forceinline__ double ldd(const int* p) { return *p; }
static __device__ __forceinline__ double ldd(const short* p) { return *p; }
static __device__ __forceinline__ double ldd(const signed char* p) { return *p; }
static __device__ __forceinline__ double ldd(const unsigned char* p) { return *p; }
template <typename T>
__device__ void topk_rows(const T* x, T* vals, int64_t* idx, int64_t rows, int64_t n,
    int64_t k, int64_t rs, int64_t es, int64_t vrs, int64_t ves, int64_t irs, int64_t ies,
    int largest) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    const T* xp = x + r * rs;
    double pv = 0.0; int64_t pi = -1;
    for (int64_t t = 0; t < k; t++) {
      double bv = 0.0; int64_t bi = -1;
      for (int64_t j = 0; j < n; j++) {
        double v = ldd(xp + j * es);
        // is (v, j) after (pv, pi) in rank order, i.e. still available?
        if (pi >= 0) {
          bool vn = v != v, pn = pv != pv;
          bool after;
          if (largest)
            after = pn ? (vn ? j > pi : true) : (!vn && (v < pv || (v == pv && j > pi)));
          else
            after = pn ? (vn && j > pi) : (vn || v > pv || (v == pv && j > pi));
          if (!after) continue;
        }
        if (bi < 0) { bv = v; bi = j; continue; }
        bool vn = v != v, bn = bv != bv;
        bool better;
        if (largest) better = vn ? !bn : (!bn && v > bv);
        else better = vn ? false : (bn || v < bv);
        if (better) { bv = v; bi = j; }
      }
      vals[r * vrs + t * ves] = xp[bi * es];
      idx[r * irs + t * ies] = bi;
      pv = bv; pi = bi;
    }
  }
}
#define AOT_TOPK(NAME, T) extern "C" __global__ void NAME(const T* x, T* vals, int64_t* idx, \
    int64_t rows, int64_t n, int64_t k, int64_t rs, int64_t es, int64_t vrs, int64_t ves, \
    int64_t irs, int64_t ies, int largest) { topk_rows<T>(x, vals, idx, rows, n, k, rs, es, \
    vrs, ves, irs, ies, largest); }
AOT_TOPK(aot_topk_float32, float)
AOT_TOPK(aot_topk_float16, h16)
AOT_TOPK(aot_topk_bfloat16, bf16)
AOT_TOPK(aot_topk_int64, long long)
AOT_TOPK(aot_topk_int32, int)
AOT_TOPK(aot_topk_int16, short)
AOT_TOPK(aot_topk_int8, signed char)
AOT_TOPK(aot_topk_uint8, unsigned char)
"""


def _module(dev: "CudaDevice") -> Any:
    return dev.compile_cubin(_KERNELS, "library op kernels")


def _kernel(dev: "CudaDevice", name: str) -> Any:
    try:
        return _module(dev).get_kernel(name)
    except Exception as e:  # noqa: BLE001
        raise DeviceError(f"cuda: kernel {name}: {e}") from e


def _launch(dev: "CudaDevice", name: str, threads: int, args: list) -> Work:
    from cuda.core import launch

    kern = _kernel(dev, name)
    cfg = dev.launch_config(threads)
    args = _typed(args)

    def work(s: "CudaStream") -> None:
        launch(s.cs, cfg, kern, *args)
    return work


def _typed(args: list) -> list:
    """Python ints as int64 (pointers and sizes are 8-byte kernel parameters)."""
    return [np.int64(a) if isinstance(a, int) and not isinstance(a, bool) else a
            for a in args]


def _i32(v: int) -> np.int32:
    return np.int32(v)


def _nchw(h: Handle) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sizes, strides) of a 3-D (C, H, W) or 4-D view as 4-D."""
    if h.ndim == 3:
        return (1,) + tuple(h.sizes), (0,) + tuple(h.strides)
    return tuple(h.sizes), tuple(h.strides)


def make_maxpool(out: Handle, indices_out: Handle | None, x: Handle, p: Any) -> Work:
    """max_pool2d with optional int64 indices (flat h * W + w per plane)."""
    dev = out.device
    (n, c, h, w), xs = _nchw(x)
    (_, _, ho, wo), os_ = _nchw(out)
    if indices_out is not None:
        _, is_ = _nchw(indices_out)
        iptr = indices_out.address
    else:
        is_, iptr = (0, 0, 0, 0), 0
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = p.kernel, p.stride, p.padding, p.dilation
    args = [x.address, out.address, iptr, n, c, h, w, ho, wo, *xs, *os_, *is_,
            *(_i32(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw))]
    return _launch(dev, f"aot_maxpool_{x.dtype.name}", n * c * ho * wo, args)


def make_upsample(out: Handle, x: Handle, rows: np.ndarray, cols: np.ndarray) -> Work:
    """Nearest upsampling as a gather through the op's own source-index arrays (uploaded
    once per distinct array and kept on the device)."""
    dev = out.device
    n, c, h, w = x.sizes
    ho, wo = out.sizes[2:]
    args = [x.address, out.address, _index_buffer(dev, rows), _index_buffer(dev, cols), n, c,
            h, w, ho, wo, *x.strides, *out.strides]
    return _launch(dev, f"aot_upsample{x.dtype.itemsize}", n * c * ho * wo, args)


_index_buffers: dict[tuple[int, bytes], Any] = {}


def _index_buffer(dev: "CudaDevice", arr: np.ndarray) -> int:
    """Device address of an int64 copy of `arr` (cached; small and immutable)."""
    from cuda.bindings import driver

    data = np.ascontiguousarray(arr, dtype=np.int64)
    key = (id(dev), data.tobytes())
    with _blas_lock:
        buf = _index_buffers.get(key)
        if buf is None:
            dev.ensure_current()
            buf = dev.core.allocate(max(data.nbytes, 8), stream=dev._alloc_stream)
            dev._alloc_stream.sync()
            err = driver.cuMemcpyHtoD(int(buf.handle), data.ctypes.data, data.nbytes)[0]
            if int(err) != 0:
                raise DeviceError(f"cuda: upload of upsample indices failed: {err}")
            _index_buffers[key] = buf
        return int(buf.handle)


def make_topk(values_out: Handle, indices_out: Handle, x: Handle, k: int, dim: int,
              largest: bool) -> Work:
    """topk along `dim`: one thread per row of the other dims (folded, or packed first)."""
    dev = x.device
    if x.ndim == 0:
        return _topk_scalar(values_out, indices_out, x)
    n = x.sizes[dim]
    kern_name = f"aot_topk_{x.dtype.name}"
    _kernel(dev, kern_name)  # refuse early if the module lacks it

    def rows_of(h: Handle) -> tuple[int, int, int] | None:
        sizes = [s for i, s in enumerate(h.sizes) if i != dim]
        strides = [st for i, st in enumerate(h.strides) if i != dim]
        msz, (mst,) = _merge(sizes, strides)
        if len(msz) > 1:
            return None
        return (msz[0] if msz else 1), (mst[0] if mst else 0), h.strides[dim]

    def moved(h: Handle) -> Handle:
        order = [i for i in range(h.ndim) if i != dim] + [dim]
        return Handle(h.alloc, h.byte_offset, tuple(h.sizes[i] for i in order),
                      tuple(h.strides[i] for i in order), h.dtype, h.device, h.owner)

    rows = 1
    for i, s_ in enumerate(x.sizes):
        if i != dim:
            rows *= s_
    rx, rv, ri = rows_of(x), rows_of(values_out), rows_of(indices_out)
    # outputs over the input must read the old values: go through packed copies then
    direct = (rx is not None and rv is not None and ri is not None
              and not _overlaps(values_out, x) and not _overlaps(indices_out, x))
    kern = _kernel(dev, kern_name)
    cfg = dev.launch_config(rows)
    isz = x.dtype.itemsize
    xm, vm, im = moved(x), moved(values_out), moved(indices_out)

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        if direct:
            args = [x.address, values_out.address, indices_out.address, rows, n, k, rx[1], rx[2],
                    rv[1], rv[2], ri[1], ri[2]]
            launch(s.cs, cfg, kern, *_typed(args), np.int32(1 if largest else 0))
            return
        xs, vs, ins = (Scratch(s, rows * n * isz), Scratch(s, rows * k * isz),
                       Scratch(s, rows * k * 8))
        try:
            _copy_packed(dev, s, xs.ptr, xm)
            args = [xs.ptr, vs.ptr, ins.ptr, rows, n, k, n, 1, k, 1, k, 1]
            launch(s.cs, cfg, kern, *_typed(args), np.int32(1 if largest else 0))
            _copy_unpacked(dev, s, vm, vs.ptr)
            _copy_unpacked(dev, s, im, ins.ptr)
        finally:
            for sc in (xs, vs, ins):
                sc.free()
    return work


def _overlaps(a: Handle, b: Handle) -> bool:
    """True when two views share bytes of one allocation (conservatively, by byte range)."""
    if a.alloc is None or b.alloc is None or a.alloc is not b.alloc:
        return False
    a0, a1 = a.byte_range()
    b0, b1 = b.byte_range()
    return a0 < b1 and b0 < a1


def _topk_scalar(values_out: Handle, indices_out: Handle, x: Handle) -> Work:
    """torch: a 0-D input gives itself and index 0."""
    dev = x.device
    copy = dev._strided(values_out.address, x.address, (1,), (1,), (1,), x.dtype.itemsize, None)
    zero = dev.strided_fill_work(indices_out, 0)

    def work(s: "CudaStream") -> None:
        copy(s)
        zero(s)
    return work


def _merge(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    from aotrt.runtime.devices.cuda import _merge_dims

    return _merge_dims(sizes, strides)


# ---------------------------------------------------------------------------------------------
# attention: two batched GEMMs around a fused scale/mask/softmax kernel


def _plain_plan(dev: "CudaDevice", out: Handle, a: Handle, b: Handle,
                aligns_abo: tuple[int, int, int] = (16, 16, 16)) -> tuple[_GemmPlan, bool]:
    """A plan for out = a @ b (views whose addresses may be placeholders); returns the plan
    and whether the operands go in swapped (b first), as make_matmul decides.

    `aligns_abo`: the alignment (bytes, at most 16) every pointer of a, b and out will have
    when the plan runs; cuBLASLt refuses at run time what a plan assumed wrongly."""
    blas = _get_blas(dev)
    d_op = _operand(out, want_t=True)
    row_out = not d_op.trans
    if row_out:
        A, B = _operand(b, True), _operand(a, True)
        m, n = out.sizes[-1], out.sizes[-2]
    else:
        A, B = _operand(a, False), _operand(b, False)
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


def _alignment(*byte_values: int) -> int:
    """The alignment (at most 16) shared by base addresses and byte offsets (0 is free)."""
    al = 16
    for v in byte_values:
        if v:
            al = min(al, _align(v))
    return al


def _fold_batch(h: Handle, nb: int) -> Handle | None:
    """`h` [..., R, C] as [nb, R, C] when its batch dims fold into one stride, else None."""
    bs = [(s, st) for s, st in zip(h.sizes[:-2], h.strides[:-2]) if s != 1]
    if not bs:
        stride = 0
    else:
        stride, expect = bs[-1][1], bs[-1][1] * bs[-1][0]
        for s, st in reversed(bs[:-1]):
            if st != expect:
                return None
            expect = st * s
    if h.numel and nb != max(1, h.numel // (h.sizes[-1] * h.sizes[-2])):
        return None
    ok = _operand(Handle(None, 0, (nb,) + tuple(h.sizes[-2:]), (stride,) + tuple(h.strides[-2:]),
                         h.dtype, h.device, h.owner), False)
    if ok is None:
        return None
    return Handle(h.alloc, h.byte_offset, (nb,) + tuple(h.sizes[-2:]),
                  (stride,) + tuple(h.strides[-2:]), h.dtype, h.device, h.owner)


def make_sdpa(out: Handle, q: Handle, k: Handle, v: Handle, mask: Handle | None,
              is_causal: bool, scale: float, groups: int) -> Work:
    """softmax(q k^T * scale + mask) v for [..., L, E] views (batch dims broadcast, GQA)."""
    dev = out.device
    dt = out.dtype.name
    if dt not in _CUDA_TYPE:
        raise Unsupported(f"cuda sdpa: dtype {dt}")
    batch = tuple(out.sizes[:-2])
    nb = 1
    for s in batch:
        nb *= s
    lq, e = q.sizes[-2], q.sizes[-1]
    s_len, ev = k.sizes[-2], v.sizes[-1]
    if len(batch) > 4:
        raise Unsupported("cuda sdpa: more than 4 batch dims")
    if s_len == 0:
        return dev.strided_fill_work(out, 0)  # no keys: torch gives zeros

    def expanded(h: Handle) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """sizes/strides of h broadcast to the full batch (GQA heads repeated)."""
        sizes, strides = list(h.sizes[:-2]), list(h.strides[:-2])
        if groups > 1 and h is not q:
            # head index hq -> hq // groups: view dim -3 as (heads, groups) with stride 0
            hs = strides[-1]
            sizes = sizes[:-1] + [sizes[-1], groups]
            strides = strides[:-1] + [hs, 0]
            full = list(batch[:-1]) + [batch[-1] // groups, groups]
        else:
            full = list(batch)
        pad = len(full) - len(sizes)
        bst = []
        for i, n in enumerate(full):
            j = i - pad
            bst.append(0 if j < 0 or sizes[j] == 1 else strides[j])
        return tuple(full) + tuple(h.sizes[-2:]), tuple(bst) + tuple(h.strides[-2:])

    # Operands readable as one strided batch are used in place; others are packed.
    def operand(h: Handle) -> tuple[Handle, tuple | None]:
        if groups == 1 and tuple(h.sizes[:-2]) == batch:
            f = _fold_batch(h, nb)
            if f is not None:
                return f, None
        sizes, strides = expanded(h)
        packed = Handle(None, 0, (nb,) + tuple(h.sizes[-2:]),
                        contiguous_strides((nb,) + tuple(h.sizes[-2:])), h.dtype, h.device,
                        h.owner)
        return packed, (h.address, sizes, strides)

    qd, qpack = operand(q)
    kd, kpack = operand(k)
    vd, vpack = operand(v)
    kt = Handle(kd.alloc, kd.byte_offset, (nb, e, s_len), (kd.strides[0], kd.strides[2],
                                                           kd.strides[1]), kd.dtype, kd.device,
                kd.owner)
    sc_desc = Handle(None, 0, (nb, lq, s_len), contiguous_strides((nb, lq, s_len)), q.dtype,
                     q.device, q.owner)
    od = _fold_batch(out, nb) if tuple(out.sizes[:-2]) == batch else None
    o_scatter = od is None
    if o_scatter:
        od = Handle(None, 0, (nb, lq, ev), contiguous_strides((nb, lq, ev)), out.dtype,
                    out.device, out.owner)
    isz0 = out.dtype.itemsize

    def al(d: Handle, packed: Any) -> int:
        return 16 if packed is not None else _alignment(d.address, d.strides[0] * isz0)

    o_al = 16 if od.alloc is None else _alignment(od.address, od.strides[0] * isz0)
    plan1, swap1 = _plain_plan(dev, sc_desc, qd, kt, (al(qd, qpack), al(kd, kpack), 16))
    plan2, swap2 = _plain_plan(dev, od, sc_desc, vd, (16, al(vd, vpack), o_al))
    # mask: strides broadcast over (batch..., lq, s)
    mask_kind, mptr, mst, mname = 0, 0, [0] * 6, "float32"
    if mask is not None:
        full = batch + (lq, s_len)
        mst = list(_broadcast_strides(mask, full))
        mask_kind = 2 if mask.dtype.name == "bool" else 1
        mptr = mask.address
        mname = "float32" if mask_kind == 2 else mask.dtype.name
    bdims = list(batch) + [1] * (4 - len(batch))
    bms = mst[:len(batch)] + [0] * (4 - len(batch))
    sm_kernel = _kernel(dev, f"aot_softmax_{dt}_{mname}")
    sm_cfg = dev.launch_config(nb * lq * 32)
    sm_args = [0, mptr, _i32(mask_kind), nb, lq, s_len, np.float32(1.0),
               _i32(1 if is_causal else 0), _i32(len(batch)), *bdims, *bms, mst[-2], mst[-1]]
    isz = out.dtype.itemsize

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch: list[Scratch] = []
        try:
            ptr = {}
            for name, d, pack, h in (("q", qd, qpack, q), ("k", kd, kpack, k),
                                     ("v", vd, vpack, v)):
                if pack is None:
                    ptr[name] = d.address
                    continue
                src, sizes, strides = pack
                sc = Scratch(s, d.numel * isz)
                scratch.append(sc)
                dev._strided(sc.ptr, src, sizes, contiguous_strides(sizes), strides, isz,
                             None)(s)
                ptr[name] = sc.ptr
            sbuf = Scratch(s, nb * lq * s_len * isz)
            scratch.append(sbuf)
            a1, b1 = (ptr["k"], ptr["q"]) if swap1 else (ptr["q"], ptr["k"])
            # scale in the GEMM's alpha keeps half-precision scores in range
            plan1.run(s, a1, b1, sbuf.ptr, sbuf.ptr, 0, scale, 0.0)
            args = _typed(list(sm_args))
            args[0] = np.int64(sbuf.ptr)
            launch(s.cs, sm_cfg, sm_kernel, *args)
            o_ptr = od.address
            if o_scatter:
                osc = Scratch(s, nb * lq * ev * isz)
                scratch.append(osc)
                o_ptr = osc.ptr
            a2, b2 = (ptr["v"], sbuf.ptr) if swap2 else (sbuf.ptr, ptr["v"])
            plan2.run(s, a2, b2, o_ptr, o_ptr, 0, 1.0, 0.0)
            if o_scatter:
                dev._strided(out.address, o_ptr, out.sizes, out.strides,
                             contiguous_strides(out.sizes), isz, None)(s)
        finally:
            for sc in scratch:
                sc.free()
    return work


# ---------------------------------------------------------------------------------------------
# convolution: cuDNN (frontend graph, bias fused), else im2col + cuBLASLt

_DNN_TYPES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BFLOAT16"}


class _Dnn:
    """One cuDNN handle per device, with built graphs cached by shape."""

    def __init__(self) -> None:
        import cudnn

        self.cudnn = cudnn
        self.handle = cudnn.create_handle()
        self.graphs: dict[tuple, Any] = {}
        self.lock = threading.Lock()


_dnn: dict[int, _Dnn | None] = {}


def _get_dnn(dev: "CudaDevice") -> _Dnn | None:
    """The device's cuDNN, or None where the frontend or library is missing."""
    with _blas_lock:
        if id(dev) not in _dnn:
            try:
                dev.ensure_current()
                _dnn[id(dev)] = _Dnn()
            except Exception as e:  # noqa: BLE001 - no cuDNN: the im2col path serves
                log.info("cuDNN is not available (%r); convolutions use im2col + GEMM", e)
                _dnn[id(dev)] = None
        return _dnn[id(dev)]


def _as4d(h: Handle) -> tuple[list[int], list[int]]:
    """A 3-D (N, C, L) view as (N, C, 1, L); 4-D as is."""
    if h.ndim == 3:
        n, c, l_ = h.sizes
        s0, s1, s2 = h.strides
        return [n, c, 1, l_], [s0, s1, l_ * s2, s2]
    return list(h.sizes), list(h.strides)


def _geometry(p: Any, ndim: int) -> tuple[list[int], list[int], list[int]]:
    if ndim == 3:
        return [0] + list(p.padding), [1] + list(p.stride), [1] + list(p.dilation)
    return list(p.padding), list(p.stride), list(p.dilation)


def _dense4d(h: Handle) -> tuple[list[int], list[int], bool]:
    """(sizes, strides, direct) of a 3-D/4-D conv operand as cuDNN gets it: the view itself
    when it is packed (any dense order) and 16-byte aligned, else a packed row-major copy."""
    sz, st = _as4d(h)
    if h.packed and h.address % 16 == 0 and all(x > 0 for n, x in zip(sz, st) if n > 1):
        # size-1 dims get the stride a packed tensor would have (cuDNN checks them)
        fixed = list(st)
        for i in range(len(sz) - 1, -1, -1):
            if sz[i] == 1:
                inner = [st[j] * sz[j] for j in range(len(sz)) if sz[j] > 1 and st[j] < 2 ** 62]
                fixed[i] = max([1] + [v for v in inner])
        return sz, fixed, True
    return sz, list(contiguous_strides(tuple(sz))), False


def _cudnn_conv(dnn: _Dnn, out: Handle, x: Handle, w: Handle, bias: Handle | None,
                p: Any, xb: Handle, ob: Handle) -> Work:
    cudnn = dnn.cudnn
    dev = out.device
    dt = getattr(cudnn.data_type, _DNN_TYPES[out.dtype.name])
    xs, xst, x_direct = _dense4d(xb)
    ws, wst, w_direct = _dense4d(w)
    os_, ost, o_direct = _dense4d(ob)
    b_direct = bias is None or (bias.strides[0] == 1 or bias.sizes[0] == 1) and \
        bias.address % 16 == 0
    pad, stride, dil = _geometry(p, xb.ndim)
    key = (out.dtype.name, p.transposed, tuple(xs), tuple(xst), tuple(ws), tuple(wst),
           tuple(os_), tuple(ost), tuple(pad), tuple(stride), tuple(dil), bias is not None)
    with dnn.lock:
        entry = dnn.graphs.get(key)
        if entry is None:
            g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=dnn.handle)
            X = g.tensor(name="x", dim=xs, stride=xst, data_type=dt)
            W = g.tensor(name="w", dim=ws, stride=wst, data_type=dt)
            if p.transposed:
                # a transposed convolution is the data gradient of the forward one
                Y = g.conv_dgrad(loss=X, filter=W, padding=pad, stride=stride, dilation=dil,
                                 compute_data_type=cudnn.data_type.FLOAT, name="convt")
                Y.set_dim(os_).set_stride(ost)
            else:
                Y = g.conv_fprop(image=X, weight=W, padding=pad, stride=stride, dilation=dil,
                                 compute_data_type=cudnn.data_type.FLOAT, name="conv")
            B = None
            if bias is not None:
                co = bias.sizes[0]
                B = g.tensor(name="b", dim=[1, co, 1, 1], stride=[co, 1, 1, 1], data_type=dt)
                Y = g.bias(input=Y, bias=B, name="bias")
            Y.set_output(True).set_data_type(dt).set_dim(os_).set_stride(ost)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
            entry = dnn.graphs[key] = (g, X, W, B, Y, int(g.get_workspace_size()))
    g, X, W, B, Y, wsize = entry
    handle = dnn.handle
    isz = out.dtype.itemsize
    xv = Handle(xb.alloc, xb.byte_offset, tuple(_as4d(xb)[0]), tuple(_as4d(xb)[1]), xb.dtype,
                xb.device, xb.owner)
    wv = Handle(w.alloc, w.byte_offset, tuple(_as4d(w)[0]), tuple(_as4d(w)[1]), w.dtype,
                w.device, w.owner)
    ov = Handle(ob.alloc, ob.byte_offset, tuple(_as4d(ob)[0]), tuple(_as4d(ob)[1]), ob.dtype,
                ob.device, ob.owner)

    def work(s: "CudaStream") -> None:
        scratch: list[Scratch] = []
        try:
            def packed(view: Handle, direct: bool, copy_in: bool) -> int:
                if direct:
                    return view.address
                sc = Scratch(s, view.numel * isz)
                scratch.append(sc)
                if copy_in:
                    _copy_packed(dev, s, sc.ptr, view)
                return sc.ptr
            pack = {X: packed(xv, x_direct, True), W: packed(wv, w_direct, True),
                    Y: packed(ov, o_direct, False)}
            if B is not None:
                pack[B] = packed(bias, b_direct, True)
            ws_ptr = stream_workspace(s, wsize) if wsize else 0
            with dnn.lock:
                cudnn.set_stream(handle, s.handle)
                g.execute(pack, ws_ptr, handle=handle)
            if not o_direct:
                _copy_unpacked(dev, s, ov, pack[Y])
        finally:
            for sc in scratch:
                sc.free()
    return work


def make_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: Any) -> Work:
    """aten.convolution (1-D/2-D, strided, padded, dilated, grouped, transposed) on cuda.

    Half types go through cuDNN; float32 through im2col + a float32 cuBLASLt GEMM, because
    cuDNN may pick TF32 tensor-core engines for float32, which miss float32 accuracy.
    """
    dev = out.device
    if out.dtype.name not in _CUDA_TYPE:
        raise Unsupported(f"cuda convolution: dtype {out.dtype.name}")
    xb, ob = x, out
    if not p.batched:  # (C, *spatial) -> (1, C, *spatial)
        xb = Handle(x.alloc, x.byte_offset, (1,) + tuple(x.sizes),
                    (x.numel,) + tuple(x.strides), x.dtype, x.device, x.owner)
        ob = Handle(out.alloc, out.byte_offset, (1,) + tuple(out.sizes),
                    (out.numel,) + tuple(out.strides), out.dtype, out.device, out.owner)
    if p.transposed:
        return _gemm_col2im_conv(out, w, bias, p, xb, ob)
    dnn = _get_dnn(dev)
    if dnn is not None and out.dtype.name != "float32":
        try:
            return _cudnn_conv(dnn, out, x, w, bias, p, xb, ob)
        except Exception as e:  # noqa: BLE001 - any refusal: the GEMM path still works
            log.info("cuDNN refused a convolution (%s); using im2col + GEMM", e)
    return _im2col_conv(out, w, bias, p, xb, ob)


def _gemm_col2im_conv(out: Handle, w: Handle, bias: Handle | None, p: Any, xb: Handle,
                      ob: Handle) -> Work:
    """Transposed convolution: cols = W_g^T x_g per group (cuBLASLt), then a col2im gather
    that sums the taps of each output element and adds the bias."""
    dev = out.device
    (n, cin, h, wd), xst = _as4d(xb)
    (_, co, ho, wo), ost = _as4d(ob)
    wsz, wst = _as4d(w)
    kh, kw = wsz[2], wsz[3]
    pad, stride, dil = _geometry(p, xb.ndim)
    groups = p.groups
    cg, og = cin // groups, co // groups
    kk, hw = kh * kw, h * wd
    isz = out.dtype.itemsize
    w_direct = tuple(wst) == tuple(contiguous_strides(tuple(wsz)))
    x_direct = xst[3] == 1 and (xst[2] == wd or h == 1)
    xv = Handle(xb.alloc, xb.byte_offset, (n, cin, h, wd), tuple(xst), xb.dtype, xb.device,
                xb.owner)
    wv = Handle(w.alloc, w.byte_offset, tuple(wsz), tuple(wst), w.dtype, w.device, w.owner)
    x_rows = Handle(None, 0, (n, cg, hw), (xst[0], xst[1], 1) if x_direct else
                    (cin * hw, hw, 1), out.dtype, out.device, out.owner)
    if _operand(x_rows, False) is None:
        x_direct = False
        x_rows = Handle(None, 0, (n, cg, hw), (cin * hw, hw, 1), out.dtype, out.device,
                        out.owner)
    w_t = Handle(None, 0, (n, og * kk, cg), (0, 1, og * kk), out.dtype, out.device, out.owner)
    c_rows = Handle(None, 0, (n, og * kk, hw), (groups * og * kk * hw, hw, 1), out.dtype,
                    out.device, out.owner)
    x_cs = xst[1] if x_direct else hw
    w_al = _alignment(wv.address if w_direct else 0, cg * og * kk * isz)
    x_al = _alignment(xv.address if x_direct else 0, cg * x_cs * isz,
                      (xst[0] if x_direct else cin * hw) * isz)
    c_al = _alignment(og * kk * hw * isz, groups * og * kk * hw * isz)
    plan, swap = _plain_plan(dev, c_rows, w_t, x_rows, (w_al, x_al, c_al))
    kern = _kernel(dev, f"aot_col2im_{out.dtype.name}")
    cfg = dev.launch_config(n * co * ho * wo)
    x_cstride = xst[1] if x_direct else hw
    tail = [bias.strides[0] if bias is not None else 0, n, co, groups, h, wd, ho, wo, *ost]
    geo = [_i32(v) for v in (kh, kw, stride[0], stride[1], pad[0], pad[1], dil[0], dil[1])]

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch: list[Scratch] = []
        try:
            x_ptr, w_ptr = xv.address, wv.address
            if not x_direct:
                sc = Scratch(s, xv.numel * isz)
                scratch.append(sc)
                _copy_packed(dev, s, sc.ptr, xv)
                x_ptr = sc.ptr
            if not w_direct:
                sc = Scratch(s, wv.numel * isz)
                scratch.append(sc)
                _copy_packed(dev, s, sc.ptr, wv)
                w_ptr = sc.ptr
            cols = Scratch(s, n * groups * og * kk * hw * isz)
            scratch.append(cols)
            for gi in range(groups):
                wp = w_ptr + gi * cg * og * kk * isz
                xp = x_ptr + gi * cg * x_cstride * isz
                cp = cols.ptr + gi * og * kk * hw * isz
                a_ptr, b_ptr = (xp, wp) if swap else (wp, xp)
                plan.run(s, a_ptr, b_ptr, cp, cp, 0, 1.0, 0.0)
            args = _typed([cols.ptr, ob.address, bias.address if bias is not None else 0,
                           *tail])
            launch(s.cs, cfg, kern, *args, *geo)
        finally:
            for sc in scratch:
                sc.free()
    return work


def _im2col_conv(out: Handle, w: Handle, bias: Handle | None, p: Any, xb: Handle,
                 ob: Handle) -> Work:
    """Convolution as im2col (own kernel) + one batched cuBLASLt GEMM per group; a 1x1
    stride-1 unpadded convolution of a plane-contiguous input needs no im2col at all."""
    dev = out.device
    (n, c, h, wd), xst = _as4d(xb)
    (_, co, ho, wo), ost = _as4d(ob)
    wsz, wst = _as4d(w)
    kh, kw = wsz[2], wsz[3]
    pad, stride, dil = _geometry(p, xb.ndim)
    groups = p.groups
    cg, og = c // groups, co // groups
    kg = cg * kh * kw
    hw = ho * wo
    isz = out.dtype.itemsize
    if isz not in (2, 4):
        raise Unsupported(f"cuda convolution: dtype {out.dtype.name}")
    w_direct = tuple(wst) == tuple(contiguous_strides(tuple(wsz)))
    direct = (kh == kw == 1 and stride == [1, 1] and pad == [0, 0] and xst[3] == 1
              and (xst[2] == wd or h == 1))
    # the stride of the flattened spatial index, when (ho, wo) fold into one dim
    if hw == 1 or ho == 1:
        sp = ost[3] if wo > 1 else 1
    elif wo == 1:
        sp = ost[2]
    else:
        sp = ost[3] if ost[2] == wo * ost[3] else None
    o_direct = sp is not None
    if o_direct:
        o_rows = Handle(None, 0, (n, og, hw), (ost[0], ost[1], sp), out.dtype, out.device,
                        out.owner)
        o_direct = _operand(o_rows, True) is not None
    if not o_direct:
        o_rows = Handle(None, 0, (n, og, hw), (co * hw, hw, 1), out.dtype, out.device,
                        out.owner)
    w_rows = Handle(None, 0, (n, og, kg), (0, kg, 1), w.dtype, w.device, w.owner)
    if direct:
        col_rows = Handle(None, 0, (n, kg, hw), (xst[0], xst[1], 1), xb.dtype, xb.device,
                          xb.owner)
        if _operand(col_rows, False) is None:
            direct = False
    if not direct:
        col_rows = Handle(None, 0, (n, kg, hw), (c * kh * kw * hw, hw, 1), out.dtype,
                          out.device, out.owner)
    w_al = _alignment(w.address if w_direct else 0, og * kg * isz)
    c_al = (_alignment(xb.address, cg * xst[1] * isz, xst[0] * isz) if direct else
            _alignment(kg * hw * isz, c * kh * kw * hw * isz))
    o_al = (_alignment(ob.address, og * ost[1] * isz, ost[0] * isz) if o_direct else
            _alignment(og * hw * isz, co * hw * isz))
    plan, swap = _plain_plan(dev, o_rows, w_rows, col_rows, (w_al, c_al, o_al))
    im2col = None if direct else _kernel(dev, f"aot_im2col{isz}")
    cfg = dev.launch_config(n * c * kh * kw * hw)
    im_args = [xb.address, 0, n, c, h, wd, ho, wo, *xst]
    im_tail = [_i32(v) for v in (kh, kw, stride[0], stride[1], pad[0], pad[1], dil[0], dil[1])]
    ov = Handle(ob.alloc, ob.byte_offset, (n, co, ho, wo), tuple(ost), ob.dtype, ob.device,
                ob.owner)
    wv = Handle(w.alloc, w.byte_offset, tuple(wsz), tuple(wst), w.dtype, w.device, w.owner)
    o_stride_c = ost[1] if o_direct else hw
    col_stride_c = xst[1] if direct else hw

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch: list[Scratch] = []
        try:
            col_ptr = xb.address
            if im2col is not None:
                sc = Scratch(s, n * c * kh * kw * hw * isz)
                scratch.append(sc)
                args = _typed(list(im_args))
                args[1] = np.int64(sc.ptr)
                launch(s.cs, cfg, im2col, *args, *im_tail)
                col_ptr = sc.ptr
            w_ptr = wv.address
            if not w_direct:
                sc = Scratch(s, wv.numel * isz)
                scratch.append(sc)
                _copy_packed(dev, s, sc.ptr, wv)
                w_ptr = sc.ptr
            o_ptr = ov.address
            if not o_direct:
                sc = Scratch(s, ov.numel * isz)
                scratch.append(sc)
                o_ptr = sc.ptr
            beta = 0.0
            if bias is not None:
                o_st = ost if o_direct else contiguous_strides((n, co, ho, wo))
                dev._strided(o_ptr, bias.address, (n, co, ho, wo), o_st,
                             (0, bias.strides[0], 0, 0), isz, None)(s)
                beta = 1.0
            for gi in range(groups):
                wp = w_ptr + gi * og * kg * isz
                cp = col_ptr + gi * (cg * col_stride_c if direct else kg * hw) * isz
                op = o_ptr + gi * og * o_stride_c * isz
                a_ptr, b_ptr = (cp, wp) if swap else (wp, cp)
                plan.run(s, a_ptr, b_ptr, op, op, 0, 1.0, beta)
            if not o_direct:
                _copy_unpacked(dev, s, ov, o_ptr)
        finally:
            for sc in scratch:
                sc.free()
    return work
