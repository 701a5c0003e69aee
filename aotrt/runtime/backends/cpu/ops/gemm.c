#include <stdint.h>
#include <string.h>
#include <omp.h>
int32_t aotrt_error = 0;

/* float32 GEMM of many rows (a prefill's linear layers): oneDNN's sgemm on blocks of
   columns, the blocks split over the stream's kernel threads here.
   out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), row-major x and out; w [N, K] with unit
   stride along K (B transposed: row n at w + n * ldb) or along N (B [K, N] as it lies:
   row k at w + k * ldb).

   P[0] x, P[1] w, P[2] bias (N dense floats) or null, P[3] out, P[4] int64 params {M, N, K,
   x row stride, ldb, B transposed (1) or not (0), out row stride, column block},
   P[5] dnnl_sgemm.
   Called over the column range [begin, end).

   Each thread of the team calls oneDNN on one block at a time, taking blocks dynamically:
   a thread whose core another process holds takes fewer, where an even split waited for
   it. Inside the team oneDNN runs on its calling thread alone (its OpenMP is ours: it
   sees the parallel region, and nthreads-var is 1 for the one-thread team too). Every
   column's sum runs over K in the same order whatever its block, so any thread count
   gives the same bits (oneDNN 3.2's blocking of K follows the rows, not the columns). */

typedef int (*sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                        const float *, int64_t, float, float *, int64_t);

/* the code a failed library call leaves in aotrt_error (render_c.KERNEL_ERRORS) */
#define LIBRARY_FAILED 3

static void block(char **P, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const int64_t *p = (const int64_t *)P[4];
    const int64_t K = p[2], xrs = p[3], ldb = p[4], trans = p[5], ors = p[6];
    const float *x = (const float *)P[0] + m0 * xrs;
    const float *w = (const float *)P[1] + n0 * (trans ? ldb : 1);
    const float *bias = (const float *)P[2];
    float *out = (float *)P[3] + m0 * ors + n0;
    const int64_t m = m1 - m0, n = n1 - n0;
    float beta = 0.0f;
    if (bias) {
        /* the bias first, the product added to it (beta 1) */
        for (int64_t r = 0; r < m; r++) memcpy(out + r * ors, bias + n0, 4 * n);
        beta = 1.0f;
    }
    if (((sgemm_fn)P[5])('N', trans ? 'T' : 'N', m, n, K, 1.0f, x, xrs, w, ldb, beta, out,
                         ors)) {
        #pragma omp atomic write
        aotrt_error = LIBRARY_FAILED;
    }
}

void aot_gemm(char **P, int64_t begin, int64_t end, int64_t threads) {
    const int64_t *p = (const int64_t *)P[4];
    const int64_t M = p[0], nb = p[7];
    const int64_t cols = end - begin;
    if (cols <= 0 || M <= 0) return;
    int64_t nt = threads < 1 ? 1 : threads;
    /* blocks of whole rows, 16 columns wide or wider, as many as a multiple of the threads
       (at most one a thread where the columns are few): oneDNN picks its blocking along K
       from the rows, so a split of the rows would change the sums' order, and one of the
       columns does not */
    int64_t chunks = (cols + nb - 1) / nb;
    if (chunks < nt) {
        chunks = (cols + 15) / 16 < nt ? (cols + 15) / 16 : nt;
    } else {
        chunks = (chunks + nt - 1) / nt * nt;
    }
    int64_t width = (cols + chunks - 1) / chunks;
    width = (width + 15) / 16 * 16;
    int64_t items = (cols + width - 1) / width;
    /* a last block of one column would be oneDNN's GEMV, which sums in another order */
    if (items > 1 && cols - (items - 1) * width == 1) items--;
    if (items < nt) nt = items;
    #pragma omp parallel num_threads(nt)
    {
        omp_set_num_threads(1);
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            const int64_t n0 = begin + i * width;
            block(P, 0, M, n0, i == items - 1 ? end : n0 + width);
        }
    }
}
