"""What the cuda library ops share: scratch and workspace memory, alignment, packed copies,
and the one module of own CUDA kernels with its load and launch helpers."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime.tensor import Handle, contiguous_strides

if TYPE_CHECKING:
    from aotrt.runtime.devices.cuda import CudaDevice, CudaStream

Work = Callable[["CudaStream"], None]

# cudaDataType codes of the float dtypes
_CUDA_TYPE = {"float32": 0, "float16": 2, "bfloat16": 14}

# One lock guards the per-device caches of gemm, conv and upsample (handles, index buffers).
_blas_lock = threading.Lock()


def _align(ptr: int) -> int:
    """The largest power of two (at most 256) that divides `ptr`."""
    if ptr == 0:
        return 256
    return min(256, ptr & -ptr)


def _alignment(*byte_values: int) -> int:
    """The alignment (at most 16) shared by base addresses and byte offsets (0 is free)."""
    al = 16
    for v in byte_values:
        if v:
            al = min(al, _align(v))
    return al


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
# packed copies


def _copy_packed(dev: "CudaDevice", s: "CudaStream", dst: int, src: Handle) -> None:
    """Enqueue a copy of view `src` into packed row-major memory at `dst`."""
    dev._strided(dst, src.address, src.sizes, contiguous_strides(src.sizes), src.strides,
                 src.dtype.itemsize, None)(s)


def _copy_unpacked(dev: "CudaDevice", s: "CudaStream", dst: Handle, src: int) -> None:
    """Enqueue a copy of packed row-major memory at `src` into view `dst`."""
    dev._strided(dst.address, src, dst.sizes, dst.strides, contiguous_strides(dst.sizes),
                 dst.dtype.itemsize, None)(s)


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
    if (at < 0) {  // padding only: torch's index, the first tap moved past the padding
      int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
      if (h0 < 0) h0 += (-h0 + dh - 1) / dh * dh;
      if (w0 < 0) w0 += (-w0 + dw - 1) / dw * dw;
      at = h0 * W + w0;
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
