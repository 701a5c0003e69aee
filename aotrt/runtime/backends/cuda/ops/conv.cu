
// A convolution's epilogue where no library fused it: out = act(out + res) in float, over
// (N, C, H, W) by strides; act 0 none, 1 relu, 2 silu, 3 relu6 (NaN stays NaN, as in torch).
template <typename T>
__device__ void conv_epilogue(T* out, const T* res, int64_t N, int64_t C, int64_t H,
    int64_t W, int64_t os0, int64_t os1, int64_t os2, int64_t os3, int64_t rs0, int64_t rs1,
    int64_t rs2, int64_t rs3, int has_res, int act, int cl) {
  const int64_t total = N * C * H * W;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n, c, h, w;
    aot_coords(i, total, C, H, W, cl, &n, &c, &h, &w);
    T* o = out + n * os0 + c * os1 + h * os2 + w * os3;
    float v = ld(o);
    if (has_res) v += ld(res + n * rs0 + c * rs1 + h * rs2 + w * rs3);
    if (act == 1) v = v < 0.f ? 0.f : v;
    else if (act == 2) v = v / (1.f + expf(-v));
    else if (act == 3) v = v < 0.f ? 0.f : (v > 6.f ? 6.f : v);
    st(o, v);
  }
}
#define AOT_CONV_EPI(NAME, T) extern "C" __global__ void NAME(T* out, const T* res, \
    int64_t N, int64_t C, int64_t H, int64_t W, int64_t os0, int64_t os1, int64_t os2, \
    int64_t os3, int64_t rs0, int64_t rs1, int64_t rs2, int64_t rs3, int has_res, int act, \
    int cl) { conv_epilogue<T>(out, res, N, C, H, W, os0, os1, os2, os3, rs0, rs1, rs2, rs3, \
    has_res, act, cl); }
// The same over `total` elements of dense memory laid out alike (no coordinates).
template <typename T>
__device__ void conv_epilogue_flat(T* out, const T* res, int64_t total, int has_res,
                                   int act) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = ld(out + i);
    if (has_res) v += ld(res + i);
    if (act == 1) v = v < 0.f ? 0.f : v;
    else if (act == 2) v = v / (1.f + expf(-v));
    else if (act == 3) v = v < 0.f ? 0.f : (v > 6.f ? 6.f : v);
    st(out + i, v);
  }
}
#define AOT_CONV_EPI_FLAT(NAME, T) extern "C" __global__ void NAME(T* out, const T* res, \
    int64_t total, int has_res, int act) { conv_epilogue_flat<T>(out, res, total, has_res, \
    act); }
AOT_CONV_EPI_FLAT(aot_conv_epilogue_flat_float32, float)
AOT_CONV_EPI_FLAT(aot_conv_epilogue_flat_float16, h16)
AOT_CONV_EPI_FLAT(aot_conv_epilogue_flat_bfloat16, bf16)
AOT_CONV_EPI(aot_conv_epilogue_float32, float)
AOT_CONV_EPI(aot_conv_epilogue_float16, h16)
AOT_CONV_EPI(aot_conv_epilogue_bfloat16, bf16)

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
