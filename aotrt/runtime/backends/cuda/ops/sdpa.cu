
// cuDNN's additive attention bias from a mask: bias[b, h, l, s] (rows of Sp elements) =
// mask read through broadcast strides; a bool mask gives 0 where true and -inf elsewhere.
static __device__ __forceinline__ float ldm(const uint8_t* p) { return *p ? 0.f : -AOT_INF; }
static __device__ __forceinline__ float ldm(const float* p) { return *p; }
static __device__ __forceinline__ float ldm(const h16* p) { return ld(p); }
static __device__ __forceinline__ float ldm(const bf16* p) { return ld(p); }
template <typename T, typename M>
__device__ void mask_bias(const M* m, T* bias, int64_t B, int64_t H, int64_t L, int64_t S,
    int64_t Sp, int64_t m0, int64_t m1, int64_t m2, int64_t m3) {
  const int64_t total = B * H * L * S;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t s = i % S, r = i / S; int64_t l = r % L; r /= L; int64_t h = r % H, b = r / H;
    st(bias + ((b * H + h) * L + l) * Sp + s, ldm(m + b * m0 + h * m1 + l * m2 + s * m3));
  }
}
#define AOT_MASK_BIAS(NAME, T, M) extern "C" __global__ void NAME(const M* m, T* bias, \
    int64_t B, int64_t H, int64_t L, int64_t S, int64_t Sp, int64_t m0, int64_t m1, \
    int64_t m2, int64_t m3) { mask_bias<T, M>(m, bias, B, H, L, S, Sp, m0, m1, m2, m3); }
AOT_MASK_BIAS(aot_mask_bias_float16_bool, h16, uint8_t)
AOT_MASK_BIAS(aot_mask_bias_float16_float32, h16, float)
AOT_MASK_BIAS(aot_mask_bias_float16_float16, h16, h16)
AOT_MASK_BIAS(aot_mask_bias_float16_bfloat16, h16, bf16)
AOT_MASK_BIAS(aot_mask_bias_bfloat16_bool, bf16, uint8_t)
AOT_MASK_BIAS(aot_mask_bias_bfloat16_float32, bf16, float)
AOT_MASK_BIAS(aot_mask_bias_bfloat16_float16, bf16, h16)
AOT_MASK_BIAS(aot_mask_bias_bfloat16_bfloat16, bf16, bf16)

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
