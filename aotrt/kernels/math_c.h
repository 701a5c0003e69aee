
static inline float aot_bits_f(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline float aot_expf(float x) {
  float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  /* round to nearest through the 1.5 * 2^23 trick: |xc * log2 e| < 2^22 */
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
  float y = p * aot_bits_f((n1 + 127) << 23) * aot_bits_f((n2 + 127) << 23);
  return x != x ? x : y;
}
static inline float aot_tanhf(float x) {
  float a = fabsf(x), s = x * x;
  float small = -5.70498872745e-3f;
  small = small * s + 2.06390887954e-2f;
  small = small * s - 5.37397155531e-2f;
  small = small * s + 1.33314422036e-1f;
  small = small * s - 3.33332819422e-1f;
  small = small * s * x + x;
  float big = 1.0f - 2.0f / (aot_expf(a + a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.625f ? small : big;
}
static inline float aot_erff(float x) {
  float a = fabsf(x), z = x * x;
  float small = 7.853861353153693e-5f;
  small = small * z - 8.010193625184903e-4f;
  small = small * z + 5.188327685732524e-3f;
  small = small * z - 2.685381193529856e-2f;
  small = small * z + 1.128358514861418e-1f;
  small = small * z - 3.761262582423300e-1f;
  small = small * z + 1.128379165726710e+0f;
  small = small * x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  float big = 1.0f - q * t * aot_expf(-z);
  big = x < 0.0f ? -big : big;
  return a < 1.0f ? small : (a != a ? x : big);
}
