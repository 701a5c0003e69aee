
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

int32_t aotrt_error = 0;

typedef int (*dnnl_exec_t)(void *, void *, int, const void *);
typedef void (*kernel_t)(void **, int64_t, int64_t, int64_t);

typedef struct {
    int64_t kind;
    void *fn;            /* dnnl_primitive_execute, or the kernel */
    void *a;             /* the primitive | the kernel's pointers | dst | where dst is */
    void *b;             /* the primitive's arguments | - | src */
    int64_t n;           /* arguments | the kernel's range | bytes */
    int64_t m;           /* - | threads | - | dst's offset from there */
    int32_t *flag;       /* the kernel library's error flag */
    const int64_t *geo;  /* a copy: itemsize, sizes[4], dst strides[4], src strides[4],
                            the dim contiguous in src that is transposed with dim 3, or -1 */
} aotrt_step;

/* Rows [r0, r1) of a copy: the row's coordinates are found once and then stepped (a
   division per row cost more than a 128-byte row's copy: YOLOv8n's C2f slices, 6400 rows). */
static void copy_rows(const aotrt_step *t, int64_t r0, int64_t r1) {
    const int64_t *g = t->geo, *sz = g + 1, *ds = g + 5, *ss = g + 9;
    int64_t isz = g[0], i2 = r0 % sz[2], q = r0 / sz[2], i1 = q % sz[1], i0 = q / sz[1];
    char *d = (char *)t->a + i0 * ds[0] + i1 * ds[1] + i2 * ds[2];
    const char *s = (const char *)t->b + i0 * ss[0] + i1 * ss[1] + i2 * ss[2];
    for (int64_t r = r0; r < r1; r++) {
        if (ds[3] == isz && ss[3] == isz) {
            memcpy(d, s, (size_t)(sz[3] * isz));
        } else if (isz == 4) {
            for (int64_t i3 = 0; i3 < sz[3]; i3++)
                *(int32_t *)(d + i3 * ds[3]) = *(const int32_t *)(s + i3 * ss[3]);
        } else {
            for (int64_t i3 = 0; i3 < sz[3]; i3++)
                memcpy(d + i3 * ds[3], s + i3 * ss[3], (size_t)isz);
        }
        d += ds[2];
        s += ss[2];
        if (++i2 == sz[2]) {
            i2 = 0;
            d += ds[1] - sz[2] * ds[2];
            s += ss[1] - sz[2] * ss[2];
            if (++i1 == sz[1]) {
                i1 = 0;
                d += ds[0] - sz[1] * ds[1];
                s += ss[0] - sz[1] * ss[1];
            }
        }
    }
}

#define TILE 16

#ifdef __AVX512F__
/* dst row j (16 floats at d + j * ld bytes) = column j of the 16 x 16 block whose row i is
   16 floats at s + i * ls bytes. */
static void transpose16(const char *s, int64_t ls, char *d, int64_t ld) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps((const float *)(s + i * ls));
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]),
                                                   _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]),
                                                       _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int j = 0; j < 16; j++) _mm512_storeu_ps((float *)(d + j * ld), r[j]);
}
#endif

/* One TILE x TILE tile w of a transpose: dims k (contiguous in src) and 3 (in dst). */
static void copy_tile(const aotrt_step *t, int64_t w) {
    const int64_t *g = t->geo, *sz = g + 1, *ds = g + 5, *ss = g + 9;
    int64_t isz = g[0], k = g[13], o0 = k == 0 ? 1 : 0, o1 = k == 2 ? 1 : 2;
    int64_t nk = (sz[k] + TILE - 1) / TILE, n3 = (sz[3] + TILE - 1) / TILE;
    int64_t b3 = w % n3, r = w / n3, bk = r % nk;
    r /= nk;
    int64_t i1 = r % sz[o1], i0 = r / sz[o1];
    char *d = (char *)t->a + i0 * ds[o0] + i1 * ds[o1];
    const char *s = (const char *)t->b + i0 * ss[o0] + i1 * ss[o1];
    int64_t a0 = bk * TILE, a1 = a0 + TILE < sz[k] ? a0 + TILE : sz[k];
    int64_t c0 = b3 * TILE, c1 = c0 + TILE < sz[3] ? c0 + TILE : sz[3];
#ifdef __AVX512F__
    if (isz == 4 && a1 - a0 == TILE && c1 - c0 == TILE) {
        /* src rows: dim 3 (c) steps ss[3], each 16 floats along dim k (a); dst rows: dim k */
        transpose16(s + a0 * 4 + c0 * ss[3], ss[3], d + a0 * ds[k] + c0 * 4, ds[k]);
        return;
    }
#endif
    for (int64_t a = a0; a < a1; a++) {
        char *da = d + a * ds[k];
        const char *sa = s + a * ss[k];
        if (isz == 4) {
            for (int64_t c = c0; c < c1; c++)
                *(int32_t *)(da + c * ds[3]) = *(const int32_t *)(sa + c * ss[3]);
        } else {
            for (int64_t c = c0; c < c1; c++)
                memcpy(da + c * ds[3], sa + c * ss[3], (size_t)isz);
        }
    }
}

/* Rows split over the threads from 256 KiB up: one core's copy bandwidth was the limit.
   A transpose (geo[13] >= 0) goes tile by tile, so that both sides read and write whole
   cache lines (YOLOv8n's head, NHWC to NCHW: 0.65 ms a run element by element). */
static void strided_copy(const aotrt_step *t, int64_t threads) {
    const int64_t *sz = t->geo + 1;
    int64_t rows = sz[0] * sz[1] * sz[2], k = t->geo[13];
    int64_t items = k < 0 ? rows
        : rows / sz[k] * ((sz[k] + TILE - 1) / TILE) * ((sz[3] + TILE - 1) / TILE);
    int nt = (threads > 1 && items > 1 && rows * sz[3] * t->geo[0] >= (1 << 18))
        ? (int)threads : 1;
    if (k < 0) {
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t c = 0; c < nt; c++) copy_rows(t, rows * c / nt, rows * (c + 1) / nt);
    } else {
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t w = 0; w < items; w++) copy_tile(t, w);
    }
}

/* P[0]: the steps, P[1]: the calling thread's dnnl stream, P[2]: int64 out, the failed
   step + 1 (0: none), P[3]: int64 out, its status or error code. Steps [begin, end). */
void aotrt_run_steps(void **P, int64_t begin, int64_t end, int64_t threads) {
    const aotrt_step *steps = (const aotrt_step *)P[0];
    int64_t *failed = (int64_t *)P[2], *code = (int64_t *)P[3];
    for (int64_t i = begin; i < end; i++) {
        const aotrt_step *t = &steps[i];
        int64_t c = 0;
        switch (t->kind) {
        case 1: c = ((dnnl_exec_t)t->fn)(t->a, P[1], (int)t->n, t->b); break;
        case 2:
            ((kernel_t)t->fn)((void **)t->a, 0, t->n, t->m);
            c = *t->flag;  /* read after the kernel's parallel region joined */
            break;
        case 3: memmove(t->a, t->b, (size_t)t->n); break;
        case 4: strided_copy(t, threads); break;
        case 5: memmove(*(char **)t->a + t->m, t->b, (size_t)t->n); break;
        default: c = -1;
        }
        if (c) { *failed = i + 1; *code = c; return; }
    }
}
