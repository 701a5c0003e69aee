"""max_pool2d on cuda: one thread per output element, through the own pooling kernel."""

from __future__ import annotations

from typing import Any

from aotrt.runtime.ops.cuda.common import Work, i32, launch
from aotrt.runtime.tensor import Handle


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
    # Threads walk the elements in the input's order (it is read kh*kw times, the output
    # once): channel fastest for an NHWC input, so that neighbours read neighbouring bytes.
    cl = xs[1] == 1 and c > 1
    args = [x.address, out.address, iptr, n, c, h, w, ho, wo, *xs, *os_, *is_,
            *(i32(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw, cl))]
    return launch(dev, KERNELS, f"aot_maxpool_{x.dtype.name}", n * c * ho * wo, args)


# ---------------------------------------------------------------------------------------------
# CUDA C (compiled after common.PRELUDE)

KERNELS = r"""
// One thread per output element; first max in window order wins, a NaN wins over numbers
// (the last NaN), padding is never selected. `cl`: the threads walk the elements channel
// fastest (n, oh, ow, c), so that neighbours read neighbouring bytes of NHWC tensors.
template <typename T>
__device__ void maxpool(const T* x, T* out, int64_t* idx, int64_t N, int64_t C, int64_t H,
    int64_t W, int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3,
    int64_t os0, int64_t os1, int64_t os2, int64_t os3, int64_t is0, int64_t is1,
    int64_t is2, int64_t is3, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
    int cl) {
  const int64_t total = N * C * HO * WO;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n, c, oh, ow;
    aot_coords(i, total, C, HO, WO, cl, &n, &c, &oh, &ow);
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

#define AOT_POOL(NAME, T) extern "C" __global__ void NAME(const T* x, T* out, int64_t* idx, \
    int64_t N, int64_t C, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t xs0, \
    int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0, int64_t os1, int64_t os2, \
    int64_t os3, int64_t is0, int64_t is1, int64_t is2, int64_t is3, int kh, int kw, \
    int sh, int sw, int ph, int pw, int dh, int dw, int cl) { maxpool<T>(x, out, idx, N, C, \
    H, W, HO, WO, xs0, xs1, xs2, xs3, os0, os1, os2, os3, is0, is1, is2, is3, kh, kw, sh, \
    sw, ph, pw, dh, dw, cl); }
AOT_POOL(aot_maxpool_float32, float)
AOT_POOL(aot_maxpool_float16, h16)
AOT_POOL(aot_maxpool_bfloat16, bf16)
"""
