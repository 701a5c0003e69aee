#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
int32_t aotrt_error = 0;

/* float32 GEMM of a few rows against a weight read along K (decode's linear layers):
   out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), w row n at w + n * ws, unit stride in k
   (nn.Linear's [N, K] weight, or the column-major [K, N] one the exporter stores for mm and
   addmm: exporter/rules/library.transpose_gemm_weights).

   P[0] x, P[1] w, P[2] bias or null, P[3] out, P[4] int64 params {M, N, K, x row stride,
   w row stride, out row stride, min items for a second thread}, P[5] float scratch of
   M * K (x, copied by the calling thread first, so out may overlap x).
   Work items are blocks of CB rows of w. Each output is one thread's, its sum in an order
   fixed by K alone: any thread count gives the same bits. */

#define CB 16
/* v8f, load8, MADD and hsum: cpu_vec8.h, compiled first */

/* R rows of w (R <= 4) against one row of x, two sums a row (one chain of adds per row
   left the FMA latency exposed), 8 vector registers of sums and 2 of x */
static inline __attribute__((always_inline)) void dot_rows(const float *x, const float *w,
        int64_t ws, int64_t K, int R, float *res) {
    v8f a[4][2];
    for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = (v8f){0};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const v8f x0 = load8(x + k), x1 = load8(x + k + 8);
        for (int r = 0; r < R; r++) {
            a[r][0] = MADD(a[r][0], x0, load8(w + r * ws + k));
            a[r][1] = MADD(a[r][1], x1, load8(w + r * ws + k + 8));
        }
    }
    for (int r = 0; r < R; r++) {
        float s = hsum(a[r][0] + a[r][1]);
        for (int64_t j = k; j < K; j++) s += x[j] * w[r * ws + j];
        res[r] = s;
    }
}

static void rows(char **P, int64_t begin, int64_t end) {
    const int64_t *p = (const int64_t *)P[4];
    const int64_t M = p[0], N = p[1], K = p[2], ws = p[4], ors = p[5];
    const float *xf = (const float *)P[5], *w = (const float *)P[1];
    const float *bias = (const float *)P[2];
    float *out = (float *)P[3];
    const int64_t n1 = end * CB < N ? end * CB : N;
    for (int64_t n = begin * CB; n < n1; n += 4) {
        const int R = n1 - n < 4 ? (int)(n1 - n) : 4;
        /* the block's rows stay in L1/L2 while every row of x goes past them */
        for (int64_t m = 0; m < M; m++) {
            float res[4];
            switch (R) {
                case 4: dot_rows(xf + m * K, w + n * ws, ws, K, 4, res); break;
                case 3: dot_rows(xf + m * K, w + n * ws, ws, K, 3, res); break;
                case 2: dot_rows(xf + m * K, w + n * ws, ws, K, 2, res); break;
                default: dot_rows(xf + m * K, w + n * ws, ws, K, 1, res); break;
            }
            for (int r = 0; r < R; r++) out[m * ors + n + r] = res[r] + (bias ? bias[n + r] : 0.0f);
        }
    }
}

void aot_gemv(char **P, int64_t begin, int64_t end, int64_t threads) {
    const int64_t *p = (const int64_t *)P[4];
    const int64_t M = p[0], K = p[2], xrs = p[3];
    float *xf = (float *)P[5];
    for (int64_t m = 0; m < M; m++) memcpy(xf + m * K, (const float *)P[0] + m * xrs, 4 * K);
    const int64_t n = end - begin;
    int64_t nt = threads < n ? threads : n;
    if (n < p[6]) nt = 1;
    if (nt <= 1) { rows(P, begin, end); return; }
    /* Dynamic chunks of a few items: on a shared machine a thread whose core is taken runs
       fewer of them, where an even split waited for it (bench/NOTES.md) */
    const int64_t chunk = n / (nt * 8) > 1 ? n / (nt * 8) : 1;
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t c = begin; c < end; c += chunk) rows(P, c, c + chunk < end ? c + chunk : end);
}
