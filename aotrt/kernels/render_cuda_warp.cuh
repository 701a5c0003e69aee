
#define AOT_FULL 0xffffffffu
static __device__ __forceinline__ float aot_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(AOT_FULL, v, o); return v; }
static __device__ __forceinline__ int64_t aot_warp_sum(int64_t v) {
  for (int o = 16; o > 0; o >>= 1)
    v = (int64_t)((uint64_t)v + (uint64_t)__shfl_xor_sync(AOT_FULL, v, o)); return v; }
static __device__ __forceinline__ float aot_warp_prod(float v) {
  for (int o = 16; o > 0; o >>= 1) v *= __shfl_xor_sync(AOT_FULL, v, o); return v; }
static __device__ __forceinline__ int64_t aot_warp_prod(int64_t v) {
  for (int o = 16; o > 0; o >>= 1)
    v = (int64_t)((uint64_t)v * (uint64_t)__shfl_xor_sync(AOT_FULL, v, o)); return v; }
static __device__ __forceinline__ float aot_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = aot_fmaxf(v, __shfl_xor_sync(AOT_FULL, v, o));
  return v; }
static __device__ __forceinline__ int64_t aot_warp_max(int64_t v) {
  for (int o = 16; o > 0; o >>= 1) { int64_t w = __shfl_xor_sync(AOT_FULL, v, o);
    v = w > v ? w : v; } return v; }
static __device__ __forceinline__ bool aot_warp_max(bool v) {
  return __any_sync(AOT_FULL, v); }
static __device__ __forceinline__ float aot_warp_min(float v) {
  for (int o = 16; o > 0; o >>= 1) v = aot_fminf(v, __shfl_xor_sync(AOT_FULL, v, o));
  return v; }
static __device__ __forceinline__ int64_t aot_warp_min(int64_t v) {
  for (int o = 16; o > 0; o >>= 1) { int64_t w = __shfl_xor_sync(AOT_FULL, v, o);
    v = w < v ? w : v; } return v; }
static __device__ __forceinline__ bool aot_warp_min(bool v) {
  return __all_sync(AOT_FULL, v); }
static __device__ __forceinline__ bool aot_warp_sum(bool v) { return __any_sync(AOT_FULL, v); }
static __device__ __forceinline__ bool aot_warp_prod(bool v) { return __all_sync(AOT_FULL, v); }
static __device__ __forceinline__ bool aot_warp_any(bool v) { return __any_sync(AOT_FULL, v); }
static __device__ __forceinline__ bool aot_warp_all(bool v) { return __all_sync(AOT_FULL, v); }
