
#define AOT_BLOCK(NAME, T, ID) static __device__ __forceinline__ T aot_block_##NAME(T v) { \
  __shared__ T sh[32]; v = aot_warp_##NAME(v); __syncthreads(); \
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v; __syncthreads(); \
  T r = (threadIdx.x & 31) < (blockDim.x >> 5) ? sh[threadIdx.x & 31] : (T)(ID); \
  return aot_warp_##NAME(r); }
AOT_BLOCK(sum, float, 0.0f) AOT_BLOCK(sum, int64_t, 0) AOT_BLOCK(sum, bool, false)
AOT_BLOCK(prod, float, 1.0f) AOT_BLOCK(prod, int64_t, 1) AOT_BLOCK(prod, bool, true)
AOT_BLOCK(max, float, -INFINITY) AOT_BLOCK(max, int64_t, INT64_MIN) AOT_BLOCK(max, bool, false)
AOT_BLOCK(min, float, INFINITY) AOT_BLOCK(min, int64_t, INT64_MAX) AOT_BLOCK(min, bool, true)
AOT_BLOCK(any, bool, false) AOT_BLOCK(all, bool, true)
