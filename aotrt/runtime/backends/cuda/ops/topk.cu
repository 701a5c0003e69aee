
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
// is (a, ia) ranked before (b, ib)? largest: NaN first, then descending; smallest:
// ascending, NaN last; equal values by ascending index
static __device__ __forceinline__ bool ranks_before(double a, int64_t ia, double b,
                                                    int64_t ib, int largest) {
  bool an = a != a, bn = b != b;
  if (an || bn) return (an && bn) ? ia < ib : (largest ? an : bn);
  if (a == b) return ia < ib;
  return largest ? a > b : a < b;
}
// One thread per element of a [rows, n] view: its rank is the count of elements ranked
// before it in its row; ranks below k are written. Stops counting at k.
template <typename T>
__device__ void topk_rank(const T* x, T* vals, int64_t* idx, int64_t rows, int64_t n,
    int64_t k, int64_t rs, int64_t es, int64_t vrs, int64_t ves, int64_t irs, int64_t ies,
    int largest) {
  const int64_t total = rows * n;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = t / n, j = t % n;
    const T* xp = x + r * rs;
    const double v = ldd(xp + j * es);
    int64_t rank = 0;
    for (int64_t i = 0; i < n && rank < k; i++)
      rank += ranks_before(ldd(xp + i * es), i, v, j, largest) ? 1 : 0;
    if (rank < k) {
      vals[r * vrs + rank * ves] = xp[j * es];
      idx[r * irs + rank * ies] = j;
    }
  }
}
#define AOT_TOPK(NAME, T) extern "C" __global__ void NAME(const T* x, T* vals, int64_t* idx, \
    int64_t rows, int64_t n, int64_t k, int64_t rs, int64_t es, int64_t vrs, int64_t ves, \
    int64_t irs, int64_t ies, int largest) { topk_rows<T>(x, vals, idx, rows, n, k, rs, es, \
    vrs, ves, irs, ies, largest); } \
extern "C" __global__ void NAME##_rank(const T* x, T* vals, int64_t* idx, int64_t rows, \
    int64_t n, int64_t k, int64_t rs, int64_t es, int64_t vrs, int64_t ves, int64_t irs, \
    int64_t ies, int largest) { topk_rank<T>(x, vals, idx, rows, n, k, rs, es, vrs, ves, \
    irs, ies, largest); }
AOT_TOPK(aot_topk_float32, float)
AOT_TOPK(aot_topk_float16, h16)
AOT_TOPK(aot_topk_bfloat16, bf16)
AOT_TOPK(aot_topk_int64, long long)
AOT_TOPK(aot_topk_int32, int)
AOT_TOPK(aot_topk_int16, short)
AOT_TOPK(aot_topk_int8, signed char)
AOT_TOPK(aot_topk_uint8, unsigned char)
