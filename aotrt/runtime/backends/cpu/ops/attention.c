
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#pragma GCC optimize("fp-contract=fast")
int32_t aotrt_error = 0;
#include "../../../../kernels/math_c.h"
typedef float v16 __attribute__((vector_size(64), aligned(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
#define BM 64
#define BN 128
#define LOWEST (-3.0e38f)
/* Keeps a loaded vector in a register: gcc otherwise folds the load into each of the four
   multiply-adds that use it, four loads where one does (half the speed on AMD Zen 4). */
#if defined(__GNUC__) && defined(__AVX512F__)
#define PIN(x) __asm__("" : "+v"(x))
#else
#define PIN(x) ((void)0)
#endif

static inline v16 splat(float x) {
  return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

/* The products' register tile: 4 rows x NX vectors of VW floats. 16-float vectors on AVX2
   are register pairs, and 4 x 4 of them (32 registers of 16) spilled: GPT-2's 128-token
   prefill attention took 14 ms a layer, AVX2, one core. */
#if defined(__AVX512F__)
typedef v16 vec;
typedef v16u vecu;
#define VW 16
#define NX 4
#else
typedef float vec __attribute__((vector_size(32), aligned(32)));
typedef float vecu __attribute__((vector_size(32), aligned(4)));
#define VW 8
#define NX 2
#endif
#define CW (VW * NX)
static inline vec vsplat(float x) { return (vec){0} + x; }
static inline int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Scores of rows [i, i + 4) over keys [0, jv) of the block: sb[r][j] = q[r] . kT[:, j0 + j]. */
static void scores4(const float *qb, int64_t e_n, const float *kT, int64_t sp, int64_t j0,
                    int64_t jv, float *sb) {
  int64_t j = 0;
  for (; j + CW <= jv; j += CW) {
    vec acc[4][NX];
    for (int r = 0; r < 4; r++)
      for (int x = 0; x < NX; x++) acc[r][x] = (vec){0};
    const float *kp = kT + j0 + j;
    for (int64_t e = 0; e < e_n; e++) {
      const float *kr = kp + e * sp;
      vec kk[NX];
      for (int x = 0; x < NX; x++) {
        kk[x] = *(const vec *)(kr + VW * x);
        PIN(kk[x]);
      }
      for (int r = 0; r < 4; r++) {
        vec qr = vsplat(qb[r * e_n + e]);
        PIN(qr);
        for (int x = 0; x < NX; x++) acc[r][x] += qr * kk[x];
      }
    }
    for (int r = 0; r < 4; r++)
      for (int x = 0; x < NX; x++) *(vec *)(sb + r * BN + j + VW * x) = acc[r][x];
  }
  for (; j < jv; j += 16) {
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    const float *kp = kT + j0 + j;
    for (int64_t e = 0; e < e_n; e++) {
      v16 k0 = *(const v16 *)(kp + e * sp);
      a0 += qb[e] * k0; a1 += qb[e_n + e] * k0; a2 += qb[2 * e_n + e] * k0;
      a3 += qb[3 * e_n + e] * k0;
    }
    *(v16 *)(sb + j) = a0; *(v16 *)(sb + BN + j) = a1;
    *(v16 *)(sb + 2 * BN + j) = a2; *(v16 *)(sb + 3 * BN + j) = a3;
  }
}

/* ob[r][:] += sum over keys j < jn of p[r][j] * v[j0 + j][:], rows [i, i + 4). */
static void values4(const float *sb, const float *v, int64_t v_sl, int64_t j0, int64_t jn,
                    int64_t ev, float *ob) {
  int64_t c = 0;
  for (; c + CW <= ev; c += CW) {
    vec acc[4][NX];
    for (int r = 0; r < 4; r++)
      for (int x = 0; x < NX; x++) acc[r][x] = *(const vec *)(ob + r * ev + c + VW * x);
    const float *vr = v + j0 * v_sl + c;
    for (int64_t j = 0; j < jn; j++, vr += v_sl) {
      vec vv[NX];
      for (int x = 0; x < NX; x++) {
        vv[x] = *(const vecu *)(vr + VW * x);
        PIN(vv[x]);
      }
      for (int r = 0; r < 4; r++) {
        vec p = vsplat(sb[r * BN + j]);
        PIN(p);
        for (int x = 0; x < NX; x++) acc[r][x] += p * vv[x];
      }
    }
    for (int r = 0; r < 4; r++)
      for (int x = 0; x < NX; x++) *(vec *)(ob + r * ev + c + VW * x) = acc[r][x];
  }
  for (; c < ev; c += 16) {
    v16 a0 = *(const v16 *)(ob + c), a1 = *(const v16 *)(ob + ev + c),
        a2 = *(const v16 *)(ob + 2 * ev + c), a3 = *(const v16 *)(ob + 3 * ev + c);
    const float *vr = v + j0 * v_sl + c;
    for (int64_t j = 0; j < jn; j++, vr += v_sl) {
      v16 v0 = *(const v16u *)vr;
      a0 += sb[j] * v0; a1 += sb[BN + j] * v0; a2 += sb[2 * BN + j] * v0;
      a3 += sb[3 * BN + j] * v0;
    }
    *(v16 *)(ob + c) = a0; *(v16 *)(ob + ev + c) = a1;
    *(v16 *)(ob + 2 * ev + c) = a2; *(v16 *)(ob + 3 * ev + c) = a3;
  }
}

/* Few query rows (a decode step): each row's scores are dot products with the key rows as
   they lie, so a head's keys are not packed transposed first. The packing was the whole cost
   at one query row: 54 us a head of 256 keys of 64, strided stores (GPT-2's decode step,
   AVX2, one core), against a few us for the products. */
#define DIRECT_ROWS 4
typedef float v8u __attribute__((vector_size(32), aligned(4)));

static inline float dot(const float *a, const float *b, int64_t n) {
  v8u s0 = {0}, s1 = {0};
  int64_t e = 0;
  for (; e + 16 <= n; e += 16) {
    s0 += *(const v8u *)(a + e) * *(const v8u *)(b + e);
    s1 += *(const v8u *)(a + e + 8) * *(const v8u *)(b + e + 8);
  }
  const v8u t = s0 + s1;
  float r = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  for (; e < n; e++) r += a[e] * b[e];
  return r;
}

/* One query row qr (scaled) over keys [0, kend) of a head, in blocks of `cap` scores (sb)
   with an online softmax; orow: EV floats of scratch; out: the row's output. */
static void row_direct(const float *qr, const float *kh, int64_t k_sl, const float *vh,
                       int64_t v_sl, int64_t kend, const uint8_t *mr, int64_t m_sj, int64_t E,
                       int64_t EV, float *sb, int64_t cap, float *orow, float *out) {
  float m = LOWEST, l = 0.0f;
  memset(orow, 0, sizeof(float) * EV);
  for (int64_t j0 = 0; j0 < kend; j0 += cap) {
    const int64_t jn = kend - j0 < cap ? kend - j0 : cap;
    float mx = LOWEST;
    for (int64_t j = 0; j < jn; j++) {
      const float x = mr && !mr[(j0 + j) * m_sj] ? -INFINITY
                                                  : dot(qr, kh + (j0 + j) * k_sl, E);
      sb[j] = x;
      mx = x > mx ? x : mx;
    }
    const float mnew = mx > m ? mx : m, corr = aot_expf(m - mnew);
    float sum = 0.0f;
    for (int64_t j = 0; j < jn; j++) {
      const float p = sb[j] != -INFINITY ? aot_expf(sb[j] - mnew) : 0.0f;
      sb[j] = p;
      sum += p;
    }
    l = l * corr + sum;
    m = mnew;
    for (int64_t c = 0; c < EV; c += 16) {
      v8u a0 = *(v8u *)(orow + c), a1 = *(v8u *)(orow + c + 8);
      a0 *= corr;
      a1 *= corr;
      const float *vr = vh + j0 * v_sl + c;
      for (int64_t j = 0; j < jn; j++, vr += v_sl) {
        a0 += sb[j] * *(const v8u *)vr;
        a1 += sb[j] * *(const v8u *)(vr + 8);
      }
      *(v8u *)(orow + c) = a0;
      *(v8u *)(orow + c + 8) = a1;
    }
  }
  /* a row that sees no key (all masked) is zeros, as the numpy path gives */
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t e = 0; e < EV; e++) out[e] = orow[e] * inv;
}

#if defined(__AVX__)
/* d's rows e (8 floats at d + e * ld) = column e of the 8 x 8 block whose row j is 8 floats
   at s + j * ls. */
static inline void transpose8(const float *s, int64_t ls, float *d, int64_t ld) {
  __m256 r[8], t[8];
  for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(s + j * ls);
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
    r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
    r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
  }
  for (int e = 0; e < 4; e++) {
    _mm256_storeu_ps(d + e * ld, _mm256_permute2f128_ps(r[e], r[e + 4], 0x20));
    _mm256_storeu_ps(d + (e + 4) * ld, _mm256_permute2f128_ps(r[e], r[e + 4], 0x31));
  }
}
#endif

/* Keys [j0, j1) of a head (row j at kh + j * k_sl) transposed into kT[e][j] (rows of sp
   floats), zeros past the head's S keys; j0 a multiple of 8. A scalar transpose's strided
   stores took a quarter of GPT-2's prefill attention (AVX2, one core). */
static void pack_keys(const float *kh, int64_t k_sl, int64_t E, int64_t S, int64_t j0,
                      int64_t j1, float *kT, int64_t sp) {
  const int64_t jr = j1 < S ? j1 : S;
  int64_t j = j0;
#if defined(__AVX__)
  for (; j + 8 <= jr; j += 8) {
    int64_t e = 0;
    for (; e + 8 <= E; e += 8) transpose8(kh + j * k_sl + e, k_sl, kT + e * sp + j, sp);
    for (; e < E; e++)
      for (int64_t i = j; i < j + 8; i++) kT[e * sp + i] = kh[i * k_sl + e];
  }
#endif
  for (; j < jr; j++)
    for (int64_t e = 0; e < E; e++) kT[e * sp + j] = kh[j * k_sl + e];
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = jr > j0 ? jr : j0; i < j1; i++) kT[e * sp + i] = 0.0f;
}

/* [*lo, *hi): the keys below kend that rows [l0, l0 + rows) of the mask `mr` (row and key
   strides m_sl, m_sj) see, *lo rounded down to a multiple of 16; empty where none sees one.
   A key block wholly outside adds nothing to the online softmax (its scores are -inf). */
static void see_range(const uint8_t *mr, int64_t m_sl, int64_t m_sj, int64_t rows,
                      int64_t l0, int64_t causal, int64_t kend, int64_t *lo, int64_t *hi) {
  int64_t a = kend, z = 0;
  for (int64_t i = 0; i < rows; i++, mr += m_sl) {
    const int64_t see = causal && l0 + i + 1 < kend ? l0 + i + 1 : kend;
    int64_t f = 0, t = see;
    while (f < see && !mr[f * m_sj]) f++;
    if (f == see) continue;
    while (t > f && !mr[(t - 1) * m_sj]) t--;
    a = f < a ? f : a;
    z = t > z ? t : z;
  }
  *lo = a < z ? a & ~(int64_t)15 : 0;
  *hi = a < z ? z : 0;
}

/* P: q, k, v, out (float32, unit stride along the head dim), the int64 parameters, the
   float64 scale, per-thread scratch, and a bool mask or null (a[21..24] its batch, head, row
   and key strides, 0 where it broadcasts: a key whose entry is false is not seen). Items
   [begin, end) are (batch, head, row block). */
void aot_attention_f32(char **P, int64_t begin, int64_t end, int64_t threads) {
  const float *q = (const float *)P[0], *k = (const float *)P[1], *v = (const float *)P[2];
  float *o = (float *)P[3];
  const int64_t *a = (const int64_t *)P[4];
  const float scale = (float)((const double *)P[5])[0];
  char *scratch = P[6];
  const int64_t H = a[1], L = a[2], S = a[3], E = a[4], EV = a[5], G = a[6], causal = a[7];
  const int64_t q_sb = a[8], q_sh = a[9], q_sl = a[10], k_sb = a[11], k_sh = a[12],
                k_sl = a[13], v_sb = a[14], v_sh = a[15], v_sl = a[16], o_sb = a[17],
                o_sh = a[18], o_sl = a[19], per_thread = a[20];
  const uint8_t *mask = (const uint8_t *)P[7];
  const int64_t m_sb = a[21], m_sh = a[22], m_sl = a[23], m_sj = a[24];
  const int64_t nblk = (L + BM - 1) / BM, sp = round16(S);
  int64_t items = end - begin;
  int nt = (int)(threads < items ? threads : items);
  if (nt < 1) nt = 1;
#pragma omp parallel num_threads(nt)
  {
    float *kT = (float *)(scratch + (int64_t)omp_get_thread_num() * per_thread);
    float *qb = kT + E * sp, *sb = qb + BM * E, *ob = sb + BM * BN, *mrow = ob + BM * EV,
          *lrow = mrow + BM;
    int64_t packed = -1, packed_end = 0;
    /* a head's row blocks in a row on one thread (its keys are packed once), the heads
       taken dynamically: a thread whose core another process holds takes fewer */
#pragma omp for schedule(dynamic, 1)
    for (int64_t head = begin / nblk; head < (end + nblk - 1) / nblk; head++)
    for (int64_t it = head * nblk > begin ? head * nblk : begin;
         it < (head + 1) * nblk && it < end; it++) {
      const int64_t b = it / (H * nblk), h = (it / nblk) % H, l0 = (it % nblk) * BM;
      const int64_t rows = L - l0 < BM ? L - l0 : BM, rows4 = (rows + 3) & ~(int64_t)3;
      const int64_t kend = causal ? (S < l0 + rows ? S : l0 + rows) : S;
      const int64_t kv = b * (H / G) + h / G;
      const float *vh = v + b * v_sb + (h / G) * v_sh;
      if (L <= DIRECT_ROWS) {
        const float *kh = k + b * k_sb + (h / G) * k_sh;
        for (int64_t i = 0; i < rows; i++) {
          const int64_t l = l0 + i, see = causal ? (S < l + 1 ? S : l + 1) : S;
          const float *qr = q + b * q_sb + h * q_sh + l * q_sl;
          for (int64_t e = 0; e < E; e++) qb[e] = qr[e] * scale;
          const uint8_t *mr = mask ? mask + b * m_sb + h * m_sh + l * m_sl : 0;
          row_direct(qb, kh, k_sl, vh, v_sl, see, mr, m_sj, E, EV, sb, BM * BN, ob,
                     o + b * o_sb + h * o_sh + l * o_sl);
        }
        continue;
      }
      /* only the keys some row of the block sees, from a multiple of 16 (kT's aligned
         loads): a prefill chunk's rows see no cache slot past their own, so its blocks
         past them were all masked (half of a 128-token prompt's over 256 slots) */
      int64_t jlo = 0, jhi = kend;
      if (mask) see_range(mask + b * m_sb + h * m_sh + l0 * m_sl, m_sl, m_sj, rows, l0,
                          causal, kend, &jlo, &jhi);
      /* this head's keys, transposed (kT[e][j]), packed as far as its blocks need them */
      if (kv != packed) {
        packed = kv;
        packed_end = 0;
      }
      const int64_t need = round16(jhi);
      if (need > packed_end) {
        pack_keys(k + b * k_sb + (h / G) * k_sh, k_sl, E, S, packed_end, need, kT, sp);
        packed_end = need;
      }
      const float *qh = q + b * q_sb + h * q_sh + l0 * q_sl;
      for (int64_t i = 0; i < rows4; i++)
        for (int64_t e = 0; e < E; e++) qb[i * E + e] = i < rows ? qh[i * q_sl + e] * scale : 0;
      memset(ob, 0, sizeof(float) * BM * EV);
      for (int64_t i = 0; i < BM; i++) { mrow[i] = LOWEST; lrow[i] = 0.0f; }
      for (int64_t j0 = jlo; j0 < jhi; j0 += BN) {
        const int64_t jn = jhi - j0 < BN ? jhi - j0 : BN, jv = round16(jn);
        for (int64_t i = 0; i < rows4; i += 4) scores4(qb + i * E, E, kT, sp, j0, jv, sb + i * BN);
        for (int64_t i = 0; i < rows4; i++) {
          float *s = sb + i * BN;
          /* keys this row sees in the block: all jn, or up to its own position (causal) */
          int64_t see = causal ? l0 + i - j0 + 1 : jn;
          if (see > jn) see = jn;
          if (see < 0) see = 0;
          /* masked keys' scores become -inf, and their weights 0 below */
          if (mask && i < rows) {
            const uint8_t *mr = mask + b * m_sb + h * m_sh + (l0 + i) * m_sl + j0 * m_sj;
            for (int64_t j = 0; j < see; j++)
              if (!mr[j * m_sj]) s[j] = -INFINITY;
          }
          float mx = LOWEST;
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j < see; j++) mx = s[j] > mx ? s[j] : mx;
          const float mnew = mx > mrow[i] ? mx : mrow[i];
          const float corr = aot_expf(mrow[i] - mnew);
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < jv; j++) {
            float p = j < see && s[j] != -INFINITY ? aot_expf(s[j] - mnew) : 0.0f;
            s[j] = p;
            sum += p;
          }
          lrow[i] = lrow[i] * corr + sum;
          mrow[i] = mnew;
          float *orow = ob + i * EV;
#pragma omp simd
          for (int64_t e = 0; e < EV; e++) orow[e] *= corr;
        }
        for (int64_t i = 0; i < rows4; i += 4)
          values4(sb + i * BN, vh, v_sl, j0, jn, EV, ob + i * EV);
      }
      float *oh = o + b * o_sb + h * o_sh + l0 * o_sl;
      for (int64_t i = 0; i < rows; i++) {
        /* a row that sees no key (all masked) is zeros, as the numpy path gives */
        const float inv = lrow[i] > 0.0f ? 1.0f / lrow[i] : 0.0f;
        for (int64_t e = 0; e < EV; e++) oh[i * o_sl + e] = ob[i * EV + e] * inv;
      }
    }
  }
}
