
typedef long long int64_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
#define AOT_INF __int_as_float(0x7f800000)
struct f32 { float v; };
static __device__ __forceinline__ float ld(const float* p) { return *p; }
static __device__ __forceinline__ void st(float* p, float v) { *p = v; }
struct h16 { uint16_t v; };
static __device__ __forceinline__ float ld(const h16* p) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->v)); return f; }
static __device__ __forceinline__ void st(h16* p, float f) {
  uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); p->v = h; }
struct bf16 { uint16_t v; };
static __device__ __forceinline__ float ld(const bf16* p) {
  return __uint_as_float(((uint32_t)p->v) << 16); }
static __device__ __forceinline__ void st(bf16* p, float f) {
  uint16_t h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); p->v = h; }
struct b1 { uint8_t v; }; struct b2 { uint16_t v; }; struct b4 { uint32_t v; };
struct b8 { int64_t v; };
// The (n, c, oh, ow) of the i-th of `total` = N*C*HO*WO output elements: w fastest (NCHW
// order), or with `cl` channel fastest (NHWC order). 64-bit division is a long software
// routine on the GPU, so sizes that fit take the 32-bit path.
static __device__ __forceinline__ void aot_coords(int64_t i, int64_t total, int64_t C,
    int64_t HO, int64_t WO, int cl, int64_t* n, int64_t* c, int64_t* oh, int64_t* ow) {
  if (total <= 0xffffffffLL) {
    unsigned int u = (unsigned int)i, uc = (unsigned int)C, uh = (unsigned int)HO,
        uw = (unsigned int)WO, r;
    if (cl) {
      *c = u % uc; r = u / uc; *ow = r % uw; r /= uw; *oh = r % uh; *n = r / uh;
    } else {
      *ow = u % uw; r = u / uw; *oh = r % uh; r /= uh; *c = r % uc; *n = r / uc;
    }
    return;
  }
  if (cl) {
    *c = i % C; int64_t r = i / C; *ow = r % WO; r /= WO; *oh = r % HO; *n = r / HO;
  } else {
    *ow = i % WO; int64_t r = i / WO; *oh = r % HO; r /= HO; *c = r % C; *n = r / C;
  }
}
