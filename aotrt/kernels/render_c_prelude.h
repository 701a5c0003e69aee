#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
static inline float aot_bf16_to_f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f;
  memcpy(&f, &u, 4); return f; }
static inline uint16_t aot_f_to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16); }
int32_t aotrt_error = 0;
#define AOT_ERR(code) __atomic_store_n(&aotrt_error, (code), __ATOMIC_RELAXED)
#define AOT_ERR_PARAM
#define AOT_ERR_ARG
/* Threads for n outer elements of `cost` work each: none below a grain of work per thread
   (starting threads would cost more than they save), never more than asked or than n. */
static inline int64_t aot_nthreads(int64_t n, int64_t cost, int64_t threads) {
  if (threads <= 1 || n <= 1) return 1;
  int64_t work = n > INT64_MAX / cost ? INT64_MAX : n * cost;
  int64_t nt = work / {grain}LL;
  if (nt > threads) nt = threads;
  if (nt > n) nt = n;
  return nt < 1 ? 1 : nt;
}
