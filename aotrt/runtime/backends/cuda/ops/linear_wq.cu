
// Weight-only quantized linear (linear_wq): w dequantized from int8 (w = q * s[n]) or int4
// (w = (q - z[n, g]) * s[n, g], groups of GS along K, two values a byte, k = 2j in the low
// nibble of byte j) in float32, products accumulated in float32, the result rounded once.
// T: x, out and bias's type; S: scales' and zeros' type.
//
// aot_wq_gemv: a few rows (decode). One warp per output column (grid-stride over columns);
// its lanes take chunks of 8 k-values in turn, so a warp reads its weight row once per tile
// of 8 rows, in 8-byte (int8) or 4-byte (int4) loads where the row is aligned (`vec`), and
// the tile's sums are reduced across the warp. Memory-bound: the weights' bytes dominate.
// aot_wq_dequant: many rows (prefill). The weights dequantized into a [N, K] T scratch,
// which a cuBLASLt GEMM then reads.

template <typename T, typename S, int BITS>
__device__ void wq_gemv(const T* x, const unsigned char* q, const S* scales, const S* zeros,
    const T* bias, T* out, int64_t M, int64_t N, int64_t K, int64_t G, int64_t GS,
    int64_t xrs, int64_t ors, int vec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const int64_t chunks = K >> 3;
  const int64_t row_bytes = BITS == 8 ? K : K >> 1;
  for (int64_t n = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; n < N; n += warps) {
    const unsigned char* qn = q + n * row_bytes;
    const float s8 = BITS == 8 ? ld(scales + n) : 0.0f;
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
      const int R = M - m0 < 8 ? (int)(M - m0) : 8;
      const T* xr = x + m0 * xrs;
      float acc[8];
#pragma unroll
      for (int r = 0; r < 8; r++) acc[r] = 0.0f;
      for (int64_t c = lane; c < chunks; c += 32) {
        const int64_t k0 = c << 3;
        float w[8];
        if (BITS == 8) {
          signed char b[8];
          if (vec) {
            const uint2 v = *(const uint2*)(qn + k0);
            const uint32_t lo = v.x, hi = v.y;
#pragma unroll
            for (int j = 0; j < 4; j++) {
              b[j] = (signed char)((lo >> (8 * j)) & 0xff);
              b[4 + j] = (signed char)((hi >> (8 * j)) & 0xff);
            }
          } else {
#pragma unroll
            for (int j = 0; j < 8; j++) b[j] = (signed char)qn[k0 + j];
          }
#pragma unroll
          for (int j = 0; j < 8; j++) w[j] = (float)b[j] * s8;
        } else {
          uint32_t v;
          if (vec) {
            v = *(const uint32_t*)(qn + (k0 >> 1));
          } else {
            const unsigned char* p = qn + (k0 >> 1);
            v = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                ((uint32_t)p[3] << 24);
          }
          const int64_t g = k0 / GS;
          const float s = ld(scales + n * G + g), z = ld(zeros + n * G + g);
#pragma unroll
          for (int j = 0; j < 8; j++) w[j] = ((float)((v >> (4 * j)) & 15u) - z) * s;
        }
#pragma unroll
        for (int r = 0; r < 8; r++) {
          if (r < R) {
            const T* xk = xr + r * xrs + k0;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[r] += ld(xk + j) * w[j];
          }
        }
      }
      if (BITS == 8) {
        // int8 rows of any K: the last K % 8 values one lane each
        for (int64_t k = (chunks << 3) + lane; k < K; k += 32) {
          const float wk = (float)(signed char)qn[k] * s8;
#pragma unroll
          for (int r = 0; r < 8; r++)
            if (r < R) acc[r] += ld(xr + r * xrs + k) * wk;
        }
      }
#pragma unroll
      for (int r = 0; r < 8; r++) {
        float v = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[r] = v;
      }
      if (lane == 0) {
        const float b = bias ? ld(bias + n) : 0.0f;
        for (int r = 0; r < R; r++) st(out + (m0 + r) * ors + n, acc[r] + b);
      }
    }
  }
}

template <typename T, typename S, int BITS>
__device__ void wq_dequant(const unsigned char* q, const S* scales, const S* zeros, T* w,
    int64_t N, int64_t K, int64_t G, int64_t GS) {
  const int64_t total = N * K;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / K, k = i % K;
    float v;
    if (BITS == 8) {
      v = (float)(signed char)q[i] * ld(scales + n);
    } else {
      const unsigned char b = q[n * (K >> 1) + (k >> 1)];
      const float qv = (float)((k & 1) ? (b >> 4) : (b & 15));
      v = (qv - ld(zeros + n * G + k / GS)) * ld(scales + n * G + k / GS);
    }
    st(w + i, v);
  }
}

#define AOT_WQ(TN, T, SN, S, BITS) \
  extern "C" __global__ void aot_wq_gemv##BITS##_##TN##_##SN(const T* x, \
      const unsigned char* q, const S* scales, const S* zeros, const T* bias, T* out, \
      int64_t M, int64_t N, int64_t K, int64_t G, int64_t GS, int64_t xrs, int64_t ors, \
      int vec) { \
    wq_gemv<T, S, BITS>(x, q, scales, zeros, bias, out, M, N, K, G, GS, xrs, ors, vec); } \
  extern "C" __global__ void aot_wq_dequant##BITS##_##TN##_##SN(const unsigned char* q, \
      const S* scales, const S* zeros, T* w, int64_t N, int64_t K, int64_t G, int64_t GS) { \
    wq_dequant<T, S, BITS>(q, scales, zeros, w, N, K, G, GS); }
#define AOT_WQ_S(TN, T, BITS) AOT_WQ(TN, T, float32, float, BITS) \
  AOT_WQ(TN, T, float16, h16, BITS) AOT_WQ(TN, T, bfloat16, bf16, BITS)
#define AOT_WQ_TS(BITS) AOT_WQ_S(float32, float, BITS) AOT_WQ_S(float16, h16, BITS) \
  AOT_WQ_S(bfloat16, bf16, BITS)
AOT_WQ_TS(8)
AOT_WQ_TS(4)
