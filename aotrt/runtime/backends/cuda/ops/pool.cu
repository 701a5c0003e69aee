
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
// Dense NHWC input and output, no indices: each thread takes V neighbouring channels of one
// output pixel (one 16-byte load per tap when V > 1), 32-bit coordinates. The same choice
// per lane as above: the first tap always, then a NaN or a strictly greater number.
typedef unsigned long long u64;
template <typename T, int V>
__device__ void maxpool_nhwc(const T* __restrict__ x, T* __restrict__ out, int N, int C,
    int H, int W, int HO, int WO, int kh, int kw, int sh, int sw, int ph, int pw, int dh,
    int dw) {
  const unsigned CV = (unsigned)(C / V);
  const unsigned total = (unsigned)N * HO * WO * CV;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += gridDim.x * blockDim.x) {
    unsigned cv = i % CV, r = i / CV;
    const int ow = (int)(r % WO); r /= WO;
    const int oh = (int)(r % HO); const int n = (int)(r / HO);
    float best[V];
    bool any = false;
#pragma unroll
    for (int v = 0; v < V; v++) best[v] = -AOT_INF;
    for (int a = 0; a < kh; a++) {
      const int h = oh * sh - ph + a * dh;
      if (h < 0 || h >= H) continue;
      for (int b = 0; b < kw; b++) {
        const int w = ow * sw - pw + b * dw;
        if (w < 0 || w >= W) continue;
        const T* p = x + (((u64)n * H + h) * W + w) * C + (u64)cv * V;
        __align__(16) T vals[V];
        if (V * sizeof(T) == 16) {
          *reinterpret_cast<uint4*>(vals) = __ldg(reinterpret_cast<const uint4*>(p));
        } else {
#pragma unroll
          for (int v = 0; v < V; v++) vals[v] = p[v];
        }
#pragma unroll
        for (int v = 0; v < V; v++) {
          const float f = ld(&vals[v]);
          if (!any || f != f || (best[v] == best[v] && f > best[v])) best[v] = f;
        }
        any = true;
      }
    }
    __align__(16) T res[V];
#pragma unroll
    for (int v = 0; v < V; v++) st(&res[v], best[v]);
    T* q = out + (((u64)n * HO + oh) * WO + ow) * C + (u64)cv * V;
    if (V * sizeof(T) == 16) {
      *reinterpret_cast<uint4*>(q) = *reinterpret_cast<const uint4*>(res);
    } else {
#pragma unroll
      for (int v = 0; v < V; v++) q[v] = res[v];
    }
  }
}

#define AOT_POOL_NHWC(NAME, T, V) extern "C" __global__ void NAME(const T* x, T* out, int N, \
    int C, int H, int W, int HO, int WO, int kh, int kw, int sh, int sw, int ph, int pw, \
    int dh, int dw) { maxpool_nhwc<T, V>(x, out, N, C, H, W, HO, WO, kh, kw, sh, sw, ph, \
    pw, dh, dw); }
AOT_POOL_NHWC(aot_maxpool_nhwc4_float32, float, 4)
AOT_POOL_NHWC(aot_maxpool_nhwc1_float32, float, 1)
AOT_POOL_NHWC(aot_maxpool_nhwc8_float16, h16, 8)
AOT_POOL_NHWC(aot_maxpool_nhwc1_float16, h16, 1)
AOT_POOL_NHWC(aot_maxpool_nhwc8_bfloat16, bf16, 8)
AOT_POOL_NHWC(aot_maxpool_nhwc1_bfloat16, bf16, 1)
AOT_POOL(aot_maxpool_float32, float)
AOT_POOL(aot_maxpool_float16, h16)
AOT_POOL(aot_maxpool_bfloat16, bf16)
