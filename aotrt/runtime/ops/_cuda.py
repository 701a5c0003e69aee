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
    """Device memory for the length of one work item, in stream order on `stream`."""

    def __init__(self, stream: "CudaStream", nbytes: int) -> None:
        self._stream = stream
        self._buf = stream.device.core.allocate(max(nbytes, 1), stream=stream.cs)
        self.ptr = int(self._buf.handle)

    def free(self) -> None:
        """Give the memory back after everything enqueued so far on the stream."""
        if self._buf is not None:
            self._buf.close(self._stream.cs)
            self._buf = None


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
    """Where one GEMM operand's bytes come from: the view itself, or a packed scratch copy."""

    view: Handle
    packed: Handle | None = None  # row-major stand-in, filled from `view` in the work

    @property
    def desc(self) -> Handle:
        """The view cuBLASLt reads."""
        return self.packed if self.packed is not None else self.view


def _source(h: Handle, want_t: bool) -> tuple[_Source, _Operand]:
    op = _operand(h, want_t)
    if op is not None:
        return _Source(h), op
    t = _dense_like(h)
    return _Source(h, t), _operand(t, want_t)


def make_matmul(out: Handle, a: Handle, b: Handle, bias: Handle | None, beta: float,
                alpha: float) -> Work:
    """out = alpha * a @ b (+ beta * bias broadcast), a/b 2-D or batched 3-D, any strides."""
    dev = out.device
    blas = _get_blas(dev)
    dtype = out.dtype.name
    if dtype not in _CUDA_TYPE:
        raise Unsupported(f"cuda matmul: dtype {dtype}")
    k = a.sizes[-1]
    if k == 0:
        raise Unsupported("cuda matmul: an empty reduction dim (k = 0)")
    # Output row-major (per batch) -> compute out^T = b^T a^T in column-major terms;
    # column-major -> out = a b directly; any other layout -> through packed scratch.
    d_op = _operand(out, want_t=True)
    scatter = None
    if d_op is None:
        scatter = _dense_like(out)
        d_op = _operand(scatter, want_t=True)
    row_out = not d_op.trans
    if row_out:
        (src_a, A), (src_b, B) = _source(b, True), _source(a, True)
        m, n = out.sizes[-1], out.sizes[-2]
    else:
        (src_a, A), (src_b, B) = _source(a, False), _source(b, False)
        m, n = out.sizes[-2], out.sizes[-1]
    D = _Operand(d_op.ptr, False, d_op.rows, d_op.cols, d_op.ld, d_op.batch, d_op.bstride)
    batch = max(A.batch, B.batch, D.batch)
    if A.batch != batch:
        A = _Operand(A.ptr, A.trans, A.rows, A.cols, A.ld, batch, 0)
    if B.batch != batch:
        B = _Operand(B.ptr, B.trans, B.rows, B.cols, B.ld, batch, 0)
    # Bias: a contiguous vector along D's rows goes to the epilogue; anything else is
    # broadcast into the output first and accumulated through C = D (beta).
    bias_vec = pre_bias = None
    if bias is not None and beta != 0.0:
        along = out.sizes[-1] if row_out else out.sizes[-2]
        want = ((along,), (1, along)) if row_out else ((along, 1),)
        unit = bias.strides[-1] if row_out else bias.strides[-2]
        if (tuple(bias.sizes) in want and along > 1 and unit == 1 and beta == 1.0
                and out.ndim == 2):
            bias_vec = bias
        else:
            pre_bias = bias
    aligns = tuple(min(16, _align(p)) for p in (
        src_a.desc.address or 256, src_b.desc.address or 256, D.ptr or 256))
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

    def work(s: "CudaStream") -> None:
        scratch: list[Scratch] = []
        try:
            ptrs = []
            for src in (src_a, src_b):
                if src.packed is None:
                    ptrs.append(src.view.address)
                    continue
                sc = Scratch(s, src.view.numel * isz)
                scratch.append(sc)
                dev._strided(sc.ptr, src.view.address, src.view.sizes, src.packed.strides,
                             src.view.strides, isz, None)(s)
                ptrs.append(sc.ptr)
            d_ptr, d_strides = out.address, out.strides
            if scatter is not None:
                sc = Scratch(s, out.numel * isz)
                scratch.append(sc)
                d_ptr, d_strides = sc.ptr, scatter.strides
            if pre_bias is not None:
                dev._strided(d_ptr, pre_bias.address, out.sizes, d_strides,
                             _broadcast_strides(pre_bias, out.sizes), isz, None)(s)
            plan.run(s, ptrs[0], ptrs[1], d_ptr, d_ptr, bias_ptr, alpha, c_beta)
            if scatter is not None:
                dev._strided(out.address, d_ptr, out.sizes, out.strides, scatter.strides,
                             isz, None)(s)
        finally:
            for sc in scratch:
                sc.free()
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
    lead = x.sizes[:-1]
    rows = 1
    for s in lead:
        rows *= s
    x2 = _flatten_rows(x, rows, k)
    o2 = _flatten_rows(out, rows, n)
    wt = Handle(w.alloc, w.byte_offset, (k, n), (w.strides[1], w.strides[0]), w.dtype, w.device,
                w.owner)
    if x2 is None or o2 is None:
        # Leading dims that do not fold into one: a batched GEMM per leading index is not
        # worth it for the shapes we see; pack x / out through scratch instead.
        raise Unsupported("cuda linear: leading dims that do not fold into rows")
    b1 = None
    if bias is not None:
        b1 = bias if bias.ndim == 1 else Handle(bias.alloc, bias.byte_offset, (1,), (1,),
                                                bias.dtype, bias.device, bias.owner)
    return make_matmul(o2, x2, wt, b1, 1.0, 1.0)


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

// src = min(floor(dst * scale), in - 1) in float32, as torch's nearest_idx.
template <typename T>
__device__ void upsample(const T* x, T* out, int64_t N, int64_t C, int64_t H, int64_t W,
    int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0,
    int64_t os1, int64_t os2, int64_t os3, float sch, float scw) {
  const int64_t total = N * C * HO * WO;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % WO, r = i / WO; int64_t oh = r % HO; r /= HO;
    int64_t c = r % C, n = r / C;
    int64_t h = HO == H ? oh : (int64_t)floorf((float)oh * sch);
    int64_t w = WO == W ? ow : (int64_t)floorf((float)ow * scw);
    h = h < H - 1 ? h : H - 1; w = w < W - 1 ? w : W - 1;
    out[n * os0 + c * os1 + oh * os2 + ow * os3] = x[n * xs0 + c * xs1 + h * xs2 + w * xs3];
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
    const float inv = 1.0f / sum;
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
#define AOT_UP(NAME, T) extern "C" __global__ void NAME(const T* x, T* out, int64_t N, \
    int64_t C, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, \
    int64_t xs2, int64_t xs3, int64_t os0, int64_t os1, int64_t os2, int64_t os3, float sch, \
    float scw) { upsample<T>(x, out, N, C, H, W, HO, WO, xs0, xs1, xs2, xs3, os0, os1, os2, \
    os3, sch, scw); }
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

// topk along the last dim of a [rows, n] view (row stride rs, element stride es): one
// thread per row, k selection passes; NaN ranks above numbers; ties by ascending index.
template <typename T>
__device__ void topk_rows(const T* x, T* vals, int64_t* idx, int64_t rows, int64_t n,
    int64_t k, int64_t rs, int64_t es, int64_t vrs, int64_t ves, int64_t irs, int64_t ies,
    int largest) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    const T* xp = x + r * rs;
    float pv = 0.0f; int64_t pi = -1;
    for (int64_t t = 0; t < k; t++) {
      float bv = 0.0f; int64_t bi = -1;
      for (int64_t j = 0; j < n; j++) {
        float v = ld(xp + j * es);
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
      st(vals + r * vrs + t * ves, bv);
      idx[r * irs + t * ies] = bi;
      pv = bv; pi = bi;
    }
  }
}
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

#define AOT_TOPK(NAME, T) extern "C" __global__ void NAME(const T* x, T* vals, int64_t* idx, \
    int64_t rows, int64_t n, int64_t k, int64_t rs, int64_t es, int64_t vrs, int64_t ves, \
    int64_t irs, int64_t ies, int largest) { topk_rows<T>(x, vals, idx, rows, n, k, rs, es, \
    vrs, ves, irs, ies, largest); }
AOT_TOPK(aot_topk_float32, float)
AOT_TOPK(aot_topk_float16, h16)
AOT_TOPK(aot_topk_bfloat16, bf16)
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

    def work(s: "CudaStream") -> None:
        launch(s.cs, cfg, kern, *args)
    return work


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
    """Nearest upsampling as a gather; the source index arrays are re-derived in-kernel,
    so they are checked against the kernel's formula here (they always agree)."""
    dev = out.device
    n, c, h, w = x.sizes
    ho, wo = out.sizes[2:]
    sch = _scale_of(rows, h, ho)
    scw = _scale_of(cols, w, wo)
    args = [x.address, out.address, n, c, h, w, ho, wo, *x.strides, *out.strides,
            np.float32(sch), np.float32(scw)]
    return _launch(dev, f"aot_upsample{x.dtype.itemsize}", n * c * ho * wo, args)


def _scale_of(src: np.ndarray, n_in: int, n_out: int) -> float:
    """The float32 scale whose floor(dst * scale) reproduces `src` (torch's two rules)."""
    if n_in == n_out:
        return 1.0
    dst = np.arange(n_out, dtype=np.float32)
    for scale in (np.float32(n_in) / np.float32(n_out),
                  np.float32(1.0 / (n_out / n_in))):
        got = np.minimum(np.floor(dst * scale).astype(np.int64), n_in - 1)
        if np.array_equal(got, src):
            return float(scale)
    # A scale factor that is not out/in: search the factor torch used from the indices.
    for num in range(1, 65):
        scale = np.float32(1.0 / (num / 8))
        got = np.minimum(np.floor(dst * scale).astype(np.int64), n_in - 1)
        if np.array_equal(got, src):
            return float(scale)
    raise Unsupported("cuda upsample_nearest2d: source indices of an unusual scale factor")


def make_topk(values_out: Handle, indices_out: Handle, x: Handle, k: int, dim: int,
              largest: bool) -> Work:
    """topk along `dim` (moved last); one thread per row."""
    dev = x.device
    if x.dtype.name not in _CUDA_TYPE:
        raise Unsupported(f"cuda topk: dtype {x.dtype.name}")
    if x.ndim == 0:
        raise Unsupported("cuda topk: a 0-D input")

    def rows_of(h: Handle) -> tuple[int, int, int] | None:
        sizes = [s for i, s in enumerate(h.sizes) if i != dim]
        strides = [st for i, st in enumerate(h.strides) if i != dim]
        msz, (mst,) = _merge(sizes, strides)
        if len(msz) > 1:
            return None
        return (msz[0] if msz else 1), (mst[0] if mst else 0), h.strides[dim]

    rx, rv, ri = rows_of(x), rows_of(values_out), rows_of(indices_out)
    if rx is None or rv is None or ri is None:
        raise Unsupported("cuda topk: outer dims that do not fold into rows")
    rows = rx[0]
    args = [x.address, values_out.address, indices_out.address, rows, x.sizes[dim], k,
            rx[1], rx[2], rv[1], rv[2], ri[1], ri[2], _i32(1 if largest else 0)]
    return _launch(dev, f"aot_topk_{x.dtype.name}", rows, args)


def _merge(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    from aotrt.runtime.devices.cuda import _merge_dims

    return _merge_dims(sizes, strides)


# ---------------------------------------------------------------------------------------------
# attention: two batched GEMMs around a fused scale/mask/softmax kernel


def _plain_plan(dev: "CudaDevice", out: Handle, a: Handle, b: Handle
                ) -> tuple[_GemmPlan, bool]:
    """A plan for out = a @ b (views whose addresses may be placeholders); returns the plan
    and whether the operands go in swapped (b first), as make_matmul decides."""
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
    aligns = (16, 16, 16)
    dtype = out.dtype.name
    key = ("plain", dtype, A.trans, B.trans, A.rows, A.cols, A.ld, A.bstride, B.rows, B.cols,
           B.ld, B.bstride, D.rows, D.cols, D.ld, D.bstride, batch)
    with blas.lock:
        plan = blas.plans.get(key)
        if plan is None:
            plan = blas.plans[key] = _GemmPlan(blas, dtype, A, B, D, m, n, a.sizes[-1], False,
                                               False, aligns)
    return plan, row_out


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
    plan1, swap1 = _plain_plan(dev, sc_desc, qd, kt)
    plan2, swap2 = _plain_plan(dev, od, sc_desc, vd)
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
            args = list(sm_args)
            args[0] = sbuf.ptr
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


def _cudnn_conv(dnn: _Dnn, out: Handle, x: Handle, w: Handle, bias: Handle | None,
                p: Any, xb: Handle, ob: Handle) -> Work:
    cudnn = dnn.cudnn
    dt = getattr(cudnn.data_type, _DNN_TYPES[out.dtype.name])
    xs, xst = _as4d(xb)
    ws, wst = _as4d(w)
    os_, ost = _as4d(ob)
    pad, stride, dil = _geometry(p, xb.ndim)
    aligns = tuple(min(16, _align(h.address)) for h in (xb, w, ob) + ((bias,) if bias else ()))
    key = (out.dtype.name, tuple(xs), tuple(xst), tuple(ws), tuple(wst), tuple(os_), tuple(ost),
           tuple(pad), tuple(stride), tuple(dil), bias is not None,
           tuple(bias.strides) if bias is not None else (), aligns)
    with dnn.lock:
        entry = dnn.graphs.get(key)
        if entry is None:
            g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=dnn.handle)
            X = g.tensor(name="x", dim=xs, stride=xst, data_type=dt)
            W = g.tensor(name="w", dim=ws, stride=wst, data_type=dt)
            Y = g.conv_fprop(image=X, weight=W, padding=pad, stride=stride, dilation=dil,
                             compute_data_type=cudnn.data_type.FLOAT, name="conv")
            B = None
            if bias is not None:
                co = bias.sizes[0]
                B = g.tensor(name="b", dim=[1, co, 1, 1], stride=[co, bias.strides[0], 1, 1],
                             data_type=dt)
                Y = g.bias(input=Y, bias=B, name="bias")
            Y.set_output(True).set_data_type(dt).set_dim(os_).set_stride(ost)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
            entry = dnn.graphs[key] = (g, X, W, B, Y, int(g.get_workspace_size()))
    g, X, W, B, Y, wsize = entry
    pack = {X: xb.address, W: w.address, Y: ob.address}
    if B is not None:
        pack[B] = bias.address
    handle = dnn.handle

    def work(s: "CudaStream") -> None:
        ws_ptr = stream_workspace(s, wsize) if wsize else 0
        with dnn.lock:
            cudnn.set_stream(handle, s.handle)
            g.execute(pack, ws_ptr, handle=handle)
    return work


def make_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: Any) -> Work:
    """aten.convolution forward (1-D/2-D, strided, padded, dilated, grouped) on cuda."""
    dev = out.device
    if p.transposed:
        raise Unsupported("cuda convolution: transposed convolution")
    if out.dtype.name not in _CUDA_TYPE:
        raise Unsupported(f"cuda convolution: dtype {out.dtype.name}")
    xb, ob = x, out
    if not p.batched:  # (C, *spatial) -> (1, C, *spatial)
        xb = Handle(x.alloc, x.byte_offset, (1,) + tuple(x.sizes), (0,) + tuple(x.strides),
                    x.dtype, x.device, x.owner)
        ob = Handle(out.alloc, out.byte_offset, (1,) + tuple(out.sizes),
                    (0,) + tuple(out.strides), out.dtype, out.device, out.owner)
    dnn = _get_dnn(dev)
    if dnn is not None:
        try:
            return _cudnn_conv(dnn, out, x, w, bias, p, xb, ob)
        except Exception as e:  # noqa: BLE001 - any refusal: the GEMM path still works
            log.info("cuDNN refused a convolution (%s); using im2col + GEMM", e)
    return _im2col_conv(out, w, bias, p, xb, ob)


def _im2col_conv(out: Handle, w: Handle, bias: Handle | None, p: Any, xb: Handle,
                 ob: Handle) -> Work:
    dev = out.device
    if p.groups != 1:
        raise Unsupported("cuda convolution: groups > 1 without cuDNN")
    (n, c, h, wd), xst = _as4d(xb)
    (_, co, ho, wo), ost = _as4d(ob)
    wsz, wst = _as4d(w)
    kh, kw = wsz[2], wsz[3]
    pad, stride, dil = _geometry(p, xb.ndim)
    kdim = c * kh * kw
    isz = out.dtype.itemsize
    # out viewed [n, co, ho*wo] (when the spatial dims fold), w viewed [co, c*kh*kw]
    if ost[2] != wo * ost[3] and ho > 1:
        raise Unsupported("cuda convolution: an output whose spatial dims do not fold")
    o3 = Handle(ob.alloc, ob.byte_offset, (n, co, ho * wo), (ost[0], ost[1], ost[3]),
                out.dtype, out.device, out.owner)
    if not (wst[3] == 1 and wst[2] == kw and wst[1] == kh * kw):
        raise Unsupported("cuda convolution: weights that are not packed per output channel")
    w2 = Handle(w.alloc, w.byte_offset, (n, co, kdim), (0, wst[0], 1), w.dtype, w.device,
                w.owner)
    direct = (kh == kw == 1 and stride == [1, 1] and pad == [0, 0]
              and (xst[2] == wd * xst[3] or h == 1) and xst[3] == 1)
    if direct:
        col = Handle(xb.alloc, xb.byte_offset, (n, c, h * wd), (xst[0], xst[1], 1), xb.dtype,
                     xb.device, xb.owner)
    else:
        col = Handle(None, 0, (n, kdim, ho * wo), contiguous_strides((n, kdim, ho * wo)),
                     out.dtype, out.device, out.owner)
    plan, swap = _plain_plan(dev, o3, w2, col)
    if isz not in (2, 4):
        raise Unsupported(f"cuda convolution: dtype {out.dtype.name}")
    im2col = None if direct else _kernel(dev, f"aot_im2col{isz}")
    cfg = dev.launch_config(n * kdim * ho * wo)
    im_args = [xb.address, 0, n, c, h, wd, ho, wo, *xst,
               *(_i32(v) for v in (kh, kw, stride[0], stride[1], pad[0], pad[1], dil[0],
                                   dil[1]))]
    bias_st = None
    if bias is not None:
        bias_st = (0, bias.strides[0], 0)

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch = None
        try:
            col_ptr = col.address
            if im2col is not None:
                scratch = Scratch(s, n * kdim * ho * wo * isz)
                args = list(im_args)
                args[1] = scratch.ptr
                launch(s.cs, cfg, im2col, *args)
                col_ptr = scratch.ptr
            beta = 0.0
            if bias is not None:
                dev._strided(o3.address, bias.address, o3.sizes, o3.strides, bias_st, isz,
                             None)(s)
                beta = 1.0
            a_ptr, b_ptr = (col_ptr, w.address) if swap else (w.address, col_ptr)
            plan.run(s, a_ptr, b_ptr, o3.address, o3.address, 0, 1.0, beta)
        finally:
            if scratch is not None:
                scratch.free()
    return work
