
#include <stdint.h>
#include <string.h>
#include <math.h>
int32_t aotrt_error = 0;
#include "../../../../kernels/math_c.h"

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, v16 v) { memcpy(p, &v, sizeof v); }

/* The 1-D transforms, written out: a product by a 0 or a 1 is never taken, so a NaN or an
   infinity in the input reaches exactly the outputs the matrices say. */
static inline void bt4(const v16 *d, int s, v16 *r, int rs) {
    r[0] = d[0] - d[2 * s];
    r[rs] = d[s] + d[2 * s];
    r[2 * rs] = d[2 * s] - d[s];
    r[3 * rs] = d[s] - d[3 * s];
}
static inline void bt6(const v16 *d, int s, v16 *r, int rs) {
    v16 d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
    r[0] = 4.0f * d0 - 5.0f * d2 + d4;
    r[rs] = -4.0f * d1 - 4.0f * d2 + d3 + d4;
    r[2 * rs] = 4.0f * d1 - 4.0f * d2 - d3 + d4;
    r[3 * rs] = -2.0f * d1 - d2 + 2.0f * d3 + d4;
    r[4 * rs] = 2.0f * d1 - d2 - 2.0f * d3 + d4;
    r[5 * rs] = 4.0f * d1 - 5.0f * d3 + d5;
}
static inline void at4(const v16 *m, int s, v16 *y, int ys) {
    y[0] = m[0] + m[s] + m[2 * s];
    y[ys] = m[s] - m[2 * s] - m[3 * s];
}
static inline void at6(const v16 *m, int s, v16 *y, int ys) {
    v16 m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s];
    v16 a = m1 + m2, b = m1 - m2, e = m3 + m4, f = m3 - m4;
    y[0] = m[0] + a + e;
    y[ys] = b + 2.0f * f;
    y[2 * ys] = a + 4.0f * e;
    y[3 * ys] = b + 8.0f * f + m[5 * s];
}

/* p: 0 N, 1 H, 2 W, 3 C, 4 OH, 5 OW, 6 O, 7 pad top, 8 pad left, 9 tile rows, 10 tile cols,
   11 tiles (T), 12-15 x's strides (n, c, h, w), 16-19 out's, 20-23 the residual's, 24 the
   activation, 25 m, 26-29 the weights' (o, c, kh, kw). Elements; the activations' channel
   strides are 1. */

/* V[xi][t][c] for the tiles [t0, t1). */
static void input_tiles(char **P, int64_t t0, int64_t t1) {
    const float *x = (const float *)P[0];
    float *V = (float *)P[1];
    const int64_t *p = (const int64_t *)P[2];
    const int64_t H = p[1], W = p[2], C = p[3], th = p[9], tw = p[10], T = p[11], m = p[25];
    const int a = (int)m + 2;
    const v16 zero = {0};
    for (int64_t t = t0; t < t1; t++) {
        int64_t n = t / (th * tw), r = t % (th * tw);
        int64_t h0 = r / tw * m - p[7], w0 = r % tw * m - p[8];
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            v16 d[36], u[36];
            for (int i = 0; i < a; i++)
                for (int j = 0; j < a; j++) {
                    int64_t h = h0 + i, w = w0 + j;
                    d[i * a + j] = (h >= 0 && h < H && w >= 0 && w < W)
                        ? ld(x + n * p[12] + h * p[14] + w * p[15] + c0) : zero;
                }
            if (a == 4) {
                for (int j = 0; j < 4; j++) bt4(d + j, 4, u + j, 4);     /* B^T d */
                for (int i = 0; i < 4; i++) bt4(u + 4 * i, 1, d + 4 * i, 1);  /* (.) B */
            } else {
                for (int j = 0; j < 6; j++) bt6(d + j, 6, u + j, 6);
                for (int i = 0; i < 6; i++) bt6(u + 6 * i, 1, d + 6 * i, 1);
            }
            for (int xi = 0; xi < a * a; xi++) st(V + (xi * T + t) * C + c0, d[xi]);
        }
    }
}

/* Whether a lane of the tile's corner outputs y[0][0], y[0][m-1], y[m-1][0], y[m-1][m-1]
   is a NaN or an infinity. Every element of the input patch reaches a corner through
   nonzero products of B^T, the GEMM (which multiplies zeros too) and A^T: a NaN stays one,
   an infinity stays one or becomes a NaN, never finite. So the corners find every tile whose
   patch holds a NaN or an infinity, at 3 adds and a fold a 16-channel block; all m^2
   outputs cost 5 times more (F(4, 3)). A finite sum that overflows only sends the tile to
   the direct convolution too. */
static inline int non_finite(const v16 *y, int m) {
    v16 s = (y[0] + y[m - 1]) + (y[(m - 1) * m] + y[m * m - 1]);
    v8 h[2];                              /* the lanes' sum by halves: vector adds */
    memcpy(h, &s, sizeof s);
    v8 e = h[0] + h[1];
    v4 q[2];
    memcpy(q, &e, sizeof e);
    v4 f = q[0] + q[1];
    float z = (f[0] + f[1]) + (f[2] + f[3]);
    return !(z - z == 0.0f);              /* z - z: 0 where finite, NaN where not */
}

/* y[i * m + j] = the direct convolution of x at output (h0 + i, w0 + j), image n, output
   channels [o0, o0 + 16), for the outputs inside out (torch's answer where the tile's
   patch holds a NaN or an infinity: only outputs whose window holds it are non-finite). */
__attribute__((noinline))
static void direct_tile(const float *x, const float *wt, const int64_t *p, int64_t n,
                        int64_t h0, int64_t w0, int64_t o0, v16 *y) {
    const int64_t H = p[1], W = p[2], C = p[3], OH = p[4], OW = p[5], m = p[25];
    const int64_t hn = OH - h0 < m ? OH - h0 : m, wn = OW - w0 < m ? OW - w0 : m;
    const v16 zero = {0};
    for (int k = 0; k < m * m; k++) y[k] = zero;
    for (int kh = 0; kh < 3; kh++)
        for (int kw = 0; kw < 3; kw++)
            for (int64_t ch = 0; ch < C; ch++) {
                v16 g;                        /* weights of 16 output channels, gathered */
                const float *wp = wt + o0 * p[26] + ch * p[27] + kh * p[28] + kw * p[29];
                for (int l = 0; l < 16; l++) g[l] = wp[l * p[26]];
                for (int64_t i = 0; i < hn; i++) {
                    int64_t h = h0 + i + kh - p[7];
                    if (h < 0 || h >= H) continue;
                    for (int64_t j = 0; j < wn; j++) {
                        int64_t w = w0 + j + kw - p[8];
                        if (w < 0 || w >= W) continue;
                        y[i * m + j] += x[n * p[12] + h * p[14] + w * p[15] + ch] * g;
                    }
                }
            }
}

/* out's tiles [t0, t1) from M[xi][t][o], with the bias, the residual and the activation;
   a tile whose Winograd result is not finite is computed directly from x and the weights
   (P[5], P[6]) before the same epilogue. */
static void output_tiles(char **P, int64_t t0, int64_t t1) {
    const float *M = (const float *)P[0], *bias = (const float *)P[2];
    const float *res = (const float *)P[3];
    const float *wt = (const float *)P[5], *x = (const float *)P[6];
    float *out = (float *)P[1];
    const int64_t *p = (const int64_t *)P[4];
    const int64_t OH = p[4], OW = p[5], O = p[6], th = p[9], tw = p[10], T = p[11];
    const int64_t act = p[24], m = p[25];
    const int a = (int)m + 2;
    for (int64_t t = t0; t < t1; t++) {
        int64_t n = t / (th * tw), r = t % (th * tw);
        int64_t h0 = r / tw * m, w0 = r % tw * m;
        for (int64_t o0 = 0; o0 < O; o0 += 16) {
            v16 q[36], u[24], y[16];
            for (int xi = 0; xi < a * a; xi++) q[xi] = ld(M + (xi * T + t) * O + o0);
            if (a == 4) {
                for (int j = 0; j < 4; j++) at4(q + j, 4, u + j, 4);      /* A^T q: 2 x 4 */
                for (int i = 0; i < 2; i++) at4(u + 4 * i, 1, y + 2 * i, 1);  /* 2 x 2 */
            } else {
                for (int j = 0; j < 6; j++) at6(q + j, 6, u + j, 6);      /* 4 x 6 */
                for (int i = 0; i < 4; i++) at6(u + 6 * i, 1, y + 4 * i, 1);  /* 4 x 4 */
            }
            if (non_finite(y, (int)m))
                direct_tile(x, wt, p, n, h0, w0, o0, y);
            v16 b = {0};
            if (bias) b = ld(bias + o0);
            for (int i = 0; i < m; i++) {
                int64_t h = h0 + i;
                if (h >= OH) break;
                for (int j = 0; j < m; j++) {
                    int64_t w = w0 + j;
                    if (w >= OW) break;
                    v16 v = y[i * m + j];
                    if (bias) v += b;
                    if (res) v += ld(res + n * p[20] + h * p[22] + w * p[23] + o0);
                    /* NaN stays NaN, as in torch's relu and hardtanh */
                    if (act == 1)
                        for (int l = 0; l < 16; l++) v[l] = v[l] < 0.0f ? 0.0f : v[l];
                    else if (act == 2)
                        for (int l = 0; l < 16; l++)
                            v[l] = v[l] < 0.0f ? 0.0f : (v[l] > 6.0f ? 6.0f : v[l]);
                    else if (act == 3)    /* x / (1 + exp(-x)), as the generated kernels */
                        for (int l = 0; l < 16; l++) v[l] = v[l] / (1.0f + aot_expf(-v[l]));
                    st(out + n * p[16] + h * p[18] + w * p[19] + o0, v);
                }
            }
        }
    }
}

static void split(void (*range)(char **, int64_t, int64_t), char **P, int64_t begin,
                  int64_t end, int64_t threads) {
    const int64_t n = end - begin, nt = threads < n ? threads : n;
    if (nt <= 1) { range(P, begin, end); return; }
    const int64_t chunk = n / nt, rem = n % nt;
    #pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int64_t c = 0; c < nt; c++) {
        const int64_t lo = begin + c * chunk + (c < rem ? c : rem);
        range(P, lo, lo + chunk + (c < rem ? 1 : 0));
    }
}

void aot_wino_input(char **P, int64_t begin, int64_t end, int64_t threads) {
    split(input_tiles, P, begin, end, threads);
}
void aot_wino_output(char **P, int64_t begin, int64_t end, int64_t threads) {
    split(output_tiles, P, begin, end, threads);
}
