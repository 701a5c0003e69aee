typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define INT64_MIN (-9223372036854775807LL - 1LL)
#define INT64_MAX 9223372036854775807LL
/* Every kernel takes the address of its library's error flag (page-locked host memory,
   read at the stream's next wait) as its last parameter, `aot_err`. */
#define AOT_ERR(code) (*(volatile int *)aot_err = (code))
#define AOT_ERR_PARAM , int *aot_err
#define AOT_ERR_ARG , aot_err
static __device__ __forceinline__ float aot_h2f(uint16_t h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static __device__ __forceinline__ uint16_t aot_f2h(float f) {
  uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
static __device__ __forceinline__ float aot_bf2f(uint16_t h) {
  return __uint_as_float(((uint32_t)h) << 16); }
static __device__ __forceinline__ uint16_t aot_f2bf(float f) {
  uint16_t h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
