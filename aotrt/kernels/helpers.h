
{q} float aot_fmaxf(float a, float b) { return (a != a || a > b) ? a : b; }
{q} float aot_fminf(float a, float b) { return (a != a || a < b) ? a : b; }
{q} float aot_fmod_py(float a, float b) { float r = fmodf(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r; }
{q} float aot_floordivf(float a, float b) { if (b == 0.0f) return a / b;
  float m = fmodf(a, b); float d = (a - m) / b;
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
  if (d == 0.0f) return copysignf(0.0f, a / b);
  float f = floorf(d); return (d - f > 0.5f) ? f + 1.0f : f; }
/* An integer the optimiser cannot see through: gcc folds (float)(int64_t)x into truncf(x)
   without trapping math, which keeps -0.0 for x in (-1, 0) where the integer's zero is +0.0
   (torch's answer), wherever the integer goes back to a float (a cast, a store, an operand).
   NVRTC has no such fold, and the identity there costs nothing. */
#ifdef __CUDACC__
{q} int64_t aot_opaque(int64_t v) { return v; }
#else
{q} int64_t aot_opaque(int64_t v) { __asm__("" : "+r"(v)); return v; }
#endif
{q} int64_t aot_f2i(float x) { return x != x ? 0 : x >= 9223372036854775808.0f ? INT64_MAX
  : x < -9223372036854775808.0f ? INT64_MIN : aot_opaque((int64_t)x); }
{q} int64_t aot_iabs(int64_t a) { return a < 0 ? (int64_t)(0ULL - (uint64_t)a) : a; }
{q} int64_t aot_tdiv(int64_t a, int64_t b AOT_ERR_PARAM) { if (b == 0) { AOT_ERR(1); return 0; }
  if (b == -1) return (int64_t)(0ULL - (uint64_t)a); return a / b; }
{q} int64_t aot_floordiv(int64_t a, int64_t b AOT_ERR_PARAM) { if (b == 0) { AOT_ERR(1); return 0; }
  if (b == -1) return (int64_t)(0ULL - (uint64_t)a); int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
{q} int64_t aot_fmod(int64_t a, int64_t b AOT_ERR_PARAM) { if (b == 0) { AOT_ERR(1); return 0; }
  return b == -1 ? 0 : a % b; }
{q} int64_t aot_mod_py(int64_t a, int64_t b AOT_ERR_PARAM) { if (b == 0) { AOT_ERR(1); return 0; }
  if (b == -1) return 0; int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
{q} int64_t aot_shl(int64_t a, int64_t b) {
  return (b < 0 || b >= 64) ? 0 : (int64_t)((uint64_t)a << b); }
{q} int64_t aot_shr(int64_t a, int64_t b) { return a >> ((b < 0 || b >= 63) ? 63 : b); }
{q} int64_t aot_ipow(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
  uint64_t r = 1, x = (uint64_t)a;
  while (b > 0) { if (b & 1) r *= x; x *= x; b >>= 1; } return (int64_t)r; }
/* An index read from data against the size n of the dim it indexes, [0, n) (_neg: [-n, n)):
   out of range, the kernel reports error 2; the caller clamps it all the same. */
{q} int64_t aot_chkidx(int64_t i, int64_t n AOT_ERR_PARAM) {
  if (i < 0 || i >= n) AOT_ERR(2); return i; }
{q} int64_t aot_chkidx_neg(int64_t i, int64_t n AOT_ERR_PARAM) {
  if (n <= 0 || i >= n || i < -n) AOT_ERR(2); return i; }
