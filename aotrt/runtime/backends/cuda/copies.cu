typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
#define AOT_DIMS(T) int64_t ndim, \
  int64_t s0, int64_t s1, int64_t s2, int64_t s3, int64_t s4, int64_t s5, int64_t s6, \
  int64_t s7, int64_t a0, int64_t a1, int64_t a2, int64_t a3, int64_t a4, int64_t a5, \
  int64_t a6, int64_t a7, int64_t b0, int64_t b1, int64_t b2, int64_t b3, int64_t b4, \
  int64_t b5, int64_t b6, int64_t b7
#define AOT_OFFSETS \
  const int64_t S[8] = {s0, s1, s2, s3, s4, s5, s6, s7}; \
  const int64_t A[8] = {a0, a1, a2, a3, a4, a5, a6, a7}; \
  const int64_t B[8] = {b0, b1, b2, b3, b4, b5, b6, b7}; \
  int64_t oa = 0, ob = 0; int64_t r = i; \
  _Pragma("unroll") for (int d = 7; d >= 0; d--) { if (d < ndim) { \
    int64_t c; if (n < 2147483647LL) { c = (int64_t)((uint32_t)r % (uint32_t)S[d]); \
      r = (int64_t)((uint32_t)r / (uint32_t)S[d]); } else { c = r % S[d]; r = r / S[d]; } \
    oa += c * A[d]; ob += c * B[d]; } }
#define AOT_COPY(NAME, T) \
extern "C" __global__ void NAME(char* dst, const char* src, int64_t n, AOT_DIMS(T)) { \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; \
       i += (int64_t)gridDim.x * blockDim.x) { AOT_OFFSETS \
    ((T*)dst)[oa] = ((const T*)src)[ob]; } }
#define AOT_FILL(NAME, T) \
extern "C" __global__ void NAME(char* dst, uint64_t value, int64_t n, AOT_DIMS(T)) { \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; \
       i += (int64_t)gridDim.x * blockDim.x) { AOT_OFFSETS \
    ((T*)dst)[oa] = (T)value; } }
/* Rows of `cols` units of T, each row `dpitch` / `spitch` units apart: a channel slice of
   an NHWC activation (a view of a concatenation) copied to or from packed memory, moved in
   16-byte units where the row and both pitches and addresses allow. */
struct alignas(16) aot_v16 { uint64_t a, b; };
struct alignas(8) aot_v8 { uint64_t a; };
#define AOT_ROWS(NAME, T) \
extern "C" __global__ void NAME(char* dst, const char* src, int64_t n, int64_t cols, \
                                int64_t dpitch, int64_t spitch) { \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; \
       i += (int64_t)gridDim.x * blockDim.x) { \
    int64_t r, c; \
    if (n < 2147483647LL) { r = (int64_t)((uint32_t)i / (uint32_t)cols); \
      c = i - r * cols; } else { r = i / cols; c = i - r * cols; } \
    ((T*)dst)[r * dpitch + c] = ((const T*)src)[r * spitch + c]; } }
AOT_ROWS(aot_rows16, aot_v16)
AOT_ROWS(aot_rows8, aot_v8)
AOT_ROWS(aot_rows4, uint32_t)
AOT_COPY(aot_copy1, uint8_t)
AOT_COPY(aot_copy2, uint16_t)
AOT_COPY(aot_copy4, uint32_t)
AOT_COPY(aot_copy8, uint64_t)
AOT_FILL(aot_fill1, uint8_t)
AOT_FILL(aot_fill2, uint16_t)
AOT_FILL(aot_fill4, uint32_t)
AOT_FILL(aot_fill8, uint64_t)
