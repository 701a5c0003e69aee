/* Eight-float vectors shared by the cpu ops' few-row kernels (cpu_gemv.c, cpu_linear_wq.c),
   which their modules compile with this text first. */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *p) { v8f v; memcpy(&v, p, 32); return v; }

/* acc + a * b, fused where the CPU has FMA: the kernels' results are compared with the
   reference by tolerance (like the other GEMMs' products), and the fused form halves the
   arithmetic */
#if defined(__FMA__)
#define MADD(acc, a, b) ((v8f)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(acc)))
#else
#define MADD(acc, a, b) ((acc) + (a) * (b))
#endif

static inline float hsum(v8f v) {
    float s = 0.0f;
    for (int i = 0; i < 8; i++) s += v[i];
    return s;
}
