
// out[n, c, oh, ow] = x[n, c, rows[oh], cols[ow]] (the op computes torch's source indices);
// `cl`: channel-fastest thread order, for NHWC tensors (see maxpool)
template <typename T>
__device__ void upsample(const T* x, T* out, const int64_t* rows, const int64_t* cols,
    int64_t N, int64_t C, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t xs0,
    int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0, int64_t os1, int64_t os2,
    int64_t os3, int cl) {
  const int64_t total = N * C * HO * WO;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n, c, oh, ow;
    aot_coords(i, total, C, HO, WO, cl, &n, &c, &oh, &ow);
    out[n * os0 + c * os1 + oh * os2 + ow * os3] =
        x[n * xs0 + c * xs1 + rows[oh] * xs2 + cols[ow] * xs3];
  }
}

#define AOT_UP(NAME, T) extern "C" __global__ void NAME(const T* x, T* out, \
    const int64_t* rows, const int64_t* cols, int64_t N, int64_t C, int64_t H, int64_t W, \
    int64_t HO, int64_t WO, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0, \
    int64_t os1, int64_t os2, int64_t os3, int cl) { upsample<T>(x, out, rows, cols, N, C, \
    H, W, HO, WO, xs0, xs1, xs2, xs3, os0, os1, os2, os3, cl); }
AOT_UP(aot_upsample1, b1)
AOT_UP(aot_upsample2, b2)
AOT_UP(aot_upsample4, b4)
AOT_UP(aot_upsample8, b8)
