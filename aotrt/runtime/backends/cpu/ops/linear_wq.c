#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
int32_t aotrt_error = 0;

/* Weight-only quantized linear for a few rows (decode): out[m, n] = sum_k x[m, k] * w[n, k]
   + bias[n], w dequantized on the fly from int8 (w = q * s[n]) or int4 (w = (q - z) * s per
   group of GS along K, two values a byte, k = 2j in the low nibble of byte j).

   P[0] x, P[1] qweight, P[2] scales, P[3] zeros (int4) or null, P[4] bias or null, P[5] out,
   P[6] int64 params {M, N, K, G, GS, bits, x row stride, out row stride, x dtype, scales
   dtype, bias dtype, out dtype}, P[7] float scratch of M * K + M * G floats (x as float,
   for int4 each 16 values with the even k first; then each group's sum of x).
   Dtype codes: 0 float32, 1 bfloat16, 2 float16. Work items are blocks of CB columns; the
   caller's thread converts x first, so out may overlap x. */

#define CB COLUMNS
/* v8f, load8, MADD and hsum: cpu_vec8.h, compiled first */
typedef int8_t v8b __attribute__((vector_size(8)));
typedef uint8_t v8u __attribute__((vector_size(8)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* 8 int8 values, or 16 int4 ones (lo: the low nibbles, hi: the high ones), as floats. gcc 12
   keeps an 8-byte vector in a general register and widens it lane by lane, so x86 gets the
   widening instructions by name (vpmovsxbd / vpmovzxbd, then vcvtdq2ps). */
#if defined(__AVX2__)
static inline v8f widen_s8(const int8_t *p) {
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline void widen_u4(const uint8_t *p, v8f *lo, v8f *hi) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = (v8f)_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = (v8f)_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#else
static inline v8f widen_s8(const int8_t *p) {
    v8b b;
    memcpy(&b, p, 8);
    return __builtin_convertvector(__builtin_convertvector(b, v8i), v8f);
}
static inline void widen_u4(const uint8_t *p, v8f *lo, v8f *hi) {
    v8u b;
    memcpy(&b, p, 8);
    *lo = __builtin_convertvector(__builtin_convertvector(b & 15, v8i), v8f);
    *hi = __builtin_convertvector(__builtin_convertvector(b >> 4, v8i), v8f);
}
#endif

static inline float ld_any(const void *p, int64_t i, int64_t dt) {
    if (dt == 0) return ((const float *)p)[i];
    if (dt == 1) {
        uint32_t b = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    return (float)((const _Float16 *)p)[i];
}

static inline void st_any(void *p, int64_t i, int64_t dt, float v) {
    if (dt == 0) { ((float *)p)[i] = v; return; }
    if (dt == 1) {
        uint32_t b;
        memcpy(&b, &v, 4);
        /* round to nearest even; a NaN stays a (quiet) NaN of its sign */
        uint16_t h = (b & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((b >> 16) | 0x40)
                                                     : (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
        ((uint16_t *)p)[i] = h;
        return;
    }
    ((_Float16 *)p)[i] = (_Float16)v;
}

/* int8: R rows (R <= 4) of column n; returns the R dot products with q (before the scale).
   U independent sums a row: one or two rows need four to hide the add's latency, more rows
   have enough chains with two (and four would not fit the 16 vector registers). */
static inline __attribute__((always_inline)) void dot_i8(const float *xf, int64_t K,
        const int8_t *q, int R, float *res) {
    const int U = R <= 2 ? 4 : 2;
    v8f acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < 4; u++) acc[r][u] = (v8f){0};
    int64_t k = 0;
    for (; k + 8 * U <= K; k += 8 * U) {
        v8f w[4];
        for (int u = 0; u < U; u++) w[u] = widen_s8(q + k + 8 * u);
        for (int r = 0; r < R; r++)
            for (int u = 0; u < U; u++)
                acc[r][u] = MADD(acc[r][u], load8(xf + r * K + k + 8 * u), w[u]);
    }
    for (int r = 0; r < R; r++) {
        v8f t = acc[r][0];
        for (int u = 1; u < U; u++) t += acc[r][u];
        float s = hsum(t);
        for (int64_t j = k; j < K; j++) s += xf[r * K + j] * (float)q[j];
        res[r] = s;
    }
}

/* int4: R rows of column n; returns sum_g s[g] * (x_g . q_g - z[g] * sum x_g), the low and
   high nibbles' products in sums of their own (two chains a row) */
static inline __attribute__((always_inline)) void dot_i4(const float *xf, const float *xs,
        int64_t K, int64_t G, int64_t GS, const uint8_t *q, const float *sg, const float *zg,
        int R, float *res) {
    v8f y[4];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < 4; r++) y[r] = (v8f){0};
    for (int64_t g = 0; g < G; g++) {
        v8f d0[4], d1[4];
        for (int r = 0; r < 4; r++) d0[r] = d1[r] = (v8f){0};
        for (int64_t k = g * GS; k < (g + 1) * GS; k += 16) {
            v8f lo, hi;
            widen_u4(q + k / 2, &lo, &hi);
            for (int r = 0; r < R; r++) {
                d0[r] = MADD(d0[r], load8(xf + r * K + k), lo);
                d1[r] = MADD(d1[r], load8(xf + r * K + k + 8), hi);
            }
        }
        const float s = sg[g], sz = sg[g] * zg[g];
        for (int r = 0; r < R; r++) {
            y[r] += (d0[r] + d1[r]) * s;
            c[r] += sz * xs[r * G + g];
        }
    }
    for (int r = 0; r < R; r++) res[r] = hsum(y[r]) - c[r];
}

static void columns(char **P, int64_t begin, int64_t end) {
    const int64_t *p = (const int64_t *)P[6];
    const int64_t M = p[0], N = p[1], K = p[2], G = p[3], GS = p[4], bits = p[5];
    const int64_t ors = p[7], sdt = p[9], bdt = p[10], odt = p[11];
    const float *xf = (const float *)P[7], *xs = xf + M * K;
    const void *scales = P[2], *zeros = P[3], *bias = P[4];
    float sg[MAX_GROUPS], zg[MAX_GROUPS];     /* the caller keeps G <= MAX_GROUPS */
    for (int64_t it = begin; it < end; it++) {
        const int64_t n1 = (it + 1) * CB < N ? (it + 1) * CB : N;
        for (int64_t n = it * CB; n < n1; n++) {
            const float b = bias ? ld_any(bias, n, bdt) : 0.0f;
            float sc = 1.0f;
            if (bits == 8) {
                sc = ld_any(scales, n, sdt);
            } else {
                for (int64_t g = 0; g < G; g++) {
                    sg[g] = ld_any(scales, n * G + g, sdt);
                    zg[g] = ld_any(zeros, n * G + g, sdt);
                }
            }
            for (int64_t m = 0; m < M; m += 4) {
                const int R = M - m < 4 ? (int)(M - m) : 4;
                float res[4];
                if (bits == 8) {
                    const int8_t *q = (const int8_t *)P[1] + n * K;
                    switch (R) {
                        case 4: dot_i8(xf + m * K, K, q, 4, res); break;
                        case 3: dot_i8(xf + m * K, K, q, 3, res); break;
                        case 2: dot_i8(xf + m * K, K, q, 2, res); break;
                        default: dot_i8(xf + m * K, K, q, 1, res); break;
                    }
                    for (int r = 0; r < R; r++) res[r] *= sc;
                } else {
                    const uint8_t *q = (const uint8_t *)P[1] + n * (K / 2);
                    const float *xr = xf + m * K, *xsr = xs + m * G;
                    switch (R) {
                        case 4: dot_i4(xr, xsr, K, G, GS, q, sg, zg, 4, res); break;
                        case 3: dot_i4(xr, xsr, K, G, GS, q, sg, zg, 3, res); break;
                        case 2: dot_i4(xr, xsr, K, G, GS, q, sg, zg, 2, res); break;
                        default: dot_i4(xr, xsr, K, G, GS, q, sg, zg, 1, res); break;
                    }
                }
                for (int r = 0; r < R; r++) st_any(P[5], (m + r) * ors + n, odt, res[r] + b);
            }
        }
    }
}

/* x as float (int4: even k then odd k within each 16), and each group's sum of x */
static void prologue(char **P) {
    const int64_t *p = (const int64_t *)P[6];
    const int64_t M = p[0], K = p[2], G = p[3], GS = p[4], bits = p[5], xrs = p[6], xdt = p[8];
    float *xf = (float *)P[7], *xs = xf + M * K;
    for (int64_t m = 0; m < M; m++) {
        float *dst = xf + m * K;
        if (bits == 8) {
            for (int64_t k = 0; k < K; k++) dst[k] = ld_any(P[0], m * xrs + k, xdt);
            continue;
        }
        for (int64_t g = 0; g < G; g++) {
            float s = 0.0f;
            for (int64_t k = g * GS; k < (g + 1) * GS; k++) {
                const float v = ld_any(P[0], m * xrs + k, xdt);
                const int64_t j = k & 15;
                dst[(k & ~(int64_t)15) + (j & 1) * 8 + j / 2] = v;
                s += v;
            }
            xs[m * G + g] = s;
        }
    }
}

void aot_linear_wq(char **P, int64_t begin, int64_t end, int64_t threads) {
    prologue(P);
    const int64_t n = end - begin, nt = threads < n ? threads : n;
    if (nt <= 1) { columns(P, begin, end); return; }
    const int64_t chunk = n / nt, rem = n % nt;
    #pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int64_t c = 0; c < nt; c++) {
        const int64_t lo = begin + c * chunk + (c < rem ? c : rem);
        columns(P, lo, lo + chunk + (c < rem ? 1 : 0));
    }
}
