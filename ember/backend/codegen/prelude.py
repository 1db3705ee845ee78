"""The C++ prelude every generated kernel file starts with: no ATen, only C headers.

Vectorizable float math (exp, log, tanh, erf, sigmoid) written branch-free so that gcc turns
it into AVX-512 inside `#pragma omp simd` loops; NaN and Inf are handled explicitly because
the build does not use -ffast-math. Accuracy is a few ulp (cephes-style polynomials).
Double precision calls libm through gcc builtins. No <math.h>: in C++ mode it pulls in
<cmath>, which alone costs a quarter second of compile time.
"""

PRELUDE = r"""
#include <stdint.h>
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))

typedef uint16_t ember_bf16;

static inline float ember_bits_f(uint32_t u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint32_t ember_f_bits(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4); return u; }
static inline float ember_bf16_to_f32(ember_bf16 h) { return ember_bits_f((uint32_t)h << 16); }
static inline ember_bf16 ember_f32_to_bf16(float f) {
  uint32_t u = ember_f_bits(f);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (ember_bf16)(f != f ? ((u >> 16) | 0x40u) : r);
}
static inline float ember_round_bf16(float f) { return ember_bf16_to_f32(ember_f32_to_bf16(f)); }
// float16 through the compiler's _Float16 (IEEE conversions, round to nearest even): an
// instruction where the target has F16C (x86-64-v3 and up), libgcc's routine below that.
// Compilers without _Float16 (g++ < 12) get the same conversions by bits.
#ifdef __FLT16_MAX__
typedef _Float16 ember_f16;
static inline float ember_f16_to_f32(ember_f16 h) { return (float)h; }
static inline ember_f16 ember_f32_to_f16(float f) { return (ember_f16)f; }
#else
typedef uint16_t ember_f16;
static inline float ember_f16_to_f32(ember_f16 h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return ember_bits_f(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e == 0u) return (sign ? -0x1p-24f : 0x1p-24f) * (float)m;  // zero, subnormal: exact
  return ember_bits_f(sign | ((e + 112u) << 23) | (m << 13));
}
static inline ember_f16 ember_f32_to_f16(float f) {
  uint32_t u = ember_f_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (ember_f16)(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return (ember_f16)(sign | 0x7c00u);  // 65520 and up round to inf
  if (a < 0x38800000u) {  // under 2^-14: a multiple of 2^-24, rounded to nearest even
    float units = (ember_bits_f(a) * 0x1p24f + 0x1p23f) - 0x1p23f;
    return (ember_f16)(sign | (uint32_t)units);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // ties to even at the 13 dropped bits
  return (ember_f16)(sign | ((r - 0x38000000u) >> 13));
}
#endif
static inline float ember_round_f16(float f) { return ember_f16_to_f32(ember_f32_to_f16(f)); }

#define EMBER_NAN_MAXMIN(T)                                                  \
  static inline T ember_max(T a, T b) {                                      \
    return a != a ? a : (b != b ? b : (a > b ? a : b));                      \
  }                                                                          \
  static inline T ember_min(T a, T b) {                                      \
    return a != a ? a : (b != b ? b : (a < b ? a : b));                      \
  }
EMBER_NAN_MAXMIN(float)
EMBER_NAN_MAXMIN(double)
template <typename T> static inline T ember_max(T a, T b) { return a > b ? a : b; }
template <typename T> static inline T ember_min(T a, T b) { return a < b ? a : b; }
static inline int64_t ember_imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t ember_imin(int64_t a, int64_t b) { return a < b ? a : b; }

static inline float ember_expm1_reduced(float xc, int32_t* k) {
  /* e^xc = 2^k * e^r with xc = k ln2 + r, |r| <= ln2 / 2; returns e^r - 1 (a polynomial). k is
     rounded by adding 1.5 * 2^23, which leaves it in the sum's low mantissa bits: one add
     instead of a rounding instruction and a float-to-int conversion */
  const float magic = 12582912.0f;
  float z = __builtin_fmaf(xc, 1.44269504088896341f, magic);
  float kf = z - magic;
  *k = (int32_t)(ember_f_bits(z) - 0x4b400000u);
  float r = __builtin_fmaf(kf, -0.693359375f, xc);
  r = __builtin_fmaf(kf, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  return __builtin_fmaf(p, r * r, r);
}

static inline float ember_exp_reduced(float xc, int32_t* k) {
  return ember_expm1_reduced(xc, k) + 1.0f;
}

static inline float ember_exp_in_range(float xc) {
  /* exp(xc) for xc in [-103.97, 88.72] or NaN: 2^k1 * 2^k2 * e^r with k = k1 + k2 split so
     that subnormal results stay exact */
  int32_t k;
  float p = ember_exp_reduced(xc, &k);
  int32_t k1 = k >> 1, k2 = k - k1;
  float s1 = ember_bits_f((uint32_t)(k1 + 127) << 23);
  float s2 = ember_bits_f((uint32_t)(k2 + 127) << 23);
  return p * s1 * s2;
}

static inline float ember_expf(float x) {
  /* The clamps let NaN through (comparisons with NaN are false), so no NaN select */
  const float hi = 88.72283935546875f, lo = -103.972084045410f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  float res = ember_exp_in_range(xc);
  res = x > hi ? INFINITY : res;
  return x < lo ? 0.0f : res;
}

static inline float ember_expf_shifted(float x) {
  /* exp(x) for x <= 0 or NaN (softmax's x - rowmax, tanh's and sigmoid's exp(-|x|)): no
     overflow path. Subnormal results are kept, as eager's AVX2 kernels keep them, at no
     cost: e^r 2^-32 is (e^r - 1) 2^-32 + 2^-32, one fma where e^r takes one add (exact: a
     power of two commutes with rounding), and 2^(k+32) is a normal number for every
     k >= -150, so the product rounds once, into the subnormal range where it falls there */
  const float lo = -103.972084045410f, two_m32 = 2.3283064365386963e-10f;
  float xc = x < lo ? lo : x; /* NaN stays NaN */
  int32_t k;
  float p = __builtin_fmaf(ember_expm1_reduced(xc, &k), two_m32, two_m32);
  float res = p * ember_bits_f((uint32_t)(k + 159) << 23);
  return x < lo ? 0.0f : res;
}

static inline float ember_expf_flush(float x) {
  /* exp(x) for x <= 0 or NaN where results under float's normal range do not matter (tanh's
     exp(-2|x|): tanh is +-1 there; log-softmax's sum, which holds a 1): they are 0, one
     multiply fewer */
  const float lo = -87.3365447505531f;
  float xc = x < lo ? lo : x; /* NaN stays NaN */
  int32_t k;
  float p = ember_exp_reduced(xc, &k);
  float res = p * ember_bits_f((uint32_t)(k + 127) << 23);
  return x < lo ? 0.0f : res;
}

static inline float ember_logf(float x) {
  int32_t sub = x < 1.17549435e-38f;
  float xs = sub ? x * 8388608.0f : x;
  uint32_t u = ember_f_bits(xs);
  int32_t e = (int32_t)((u >> 23) & 0xff) - 127 - (sub ? 23 : 0);
  float m = ember_bits_f((u & 0x7fffffu) | 0x3f800000u);
  int32_t big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  float ef = (float)(e + big);
  float f = m - 1.0f;
  float z = f * f;
  float y = 7.0376836292e-2f;
  y = __builtin_fmaf(y, f, -1.1514610310e-1f);
  y = __builtin_fmaf(y, f, 1.1676998740e-1f);
  y = __builtin_fmaf(y, f, -1.2420140846e-1f);
  y = __builtin_fmaf(y, f, 1.4249322787e-1f);
  y = __builtin_fmaf(y, f, -1.6668057665e-1f);
  y = __builtin_fmaf(y, f, 2.0000714765e-1f);
  y = __builtin_fmaf(y, f, -2.4999993993e-1f);
  y = __builtin_fmaf(y, f, 3.3333331174e-1f);
  y = y * f * z;
  y = __builtin_fmaf(ef, -2.12194440e-4f, y);
  y = __builtin_fmaf(z, -0.5f, y);
  float res = f + y;
  res = __builtin_fmaf(ef, 0.693359375f, res);
  res = x == INFINITY ? x : res;
  res = x == 0.0f ? -INFINITY : res;
  res = x < 0.0f ? NAN : res;
  return x != x ? x : res;
}

static inline float ember_tanhf(float x) {
  /* |x| < 0.625: odd polynomial; else (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.29 (no
     cancellation; the exp needs no overflow path) */
  float ax = __builtin_fabsf(x);
  float z = x * x;
  float s = -5.70498872745e-3f;
  s = __builtin_fmaf(s, z, 2.06390887954e-2f);
  s = __builtin_fmaf(s, z, -5.37397155531e-2f);
  s = __builtin_fmaf(s, z, 1.33314422036e-1f);
  s = __builtin_fmaf(s, z, -3.33332819422e-1f);
  float small = x * __builtin_fmaf(s, z, 1.0f); /* a product keeps -0's sign */
  float e = ember_expf_flush(-2.0f * ax);
  float big = (1.0f - e) / (1.0f + e);
  big = x < 0.0f ? -big : big;
  return ax < 0.625f ? small : big;
}

static inline float ember_sigmoidf(float x) {
  /* with e = exp(-|x|) <= 1: 1 / (1 + e) for x >= 0, e / (1 + e) below; the exp keeps its
     subnormal results (sigmoid(-88.7) is 3e-39, and silu's x sigmoid(x) a normal number) */
  float e = ember_expf_shifted(-__builtin_fabsf(x));
  float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}

static inline float ember_erfcf_given_exp(float v, float e) {
  /* erfc(v) given e = exp(-v*v), to about 2 ulp relative for every v: erfc(|v|) =
     t P(t) e with t = 2 / (2 + |v|) and P a degree-9 polynomial fitted by ember (relative
     error 2e-8 over |v| <= 10); erfc(-v) = 2 - erfc(v). No cancellation, so GELU's
     0.5 x erfc(-x / sqrt 2) keeps its digits far into the negative tail. NaN propagates
     through t; erfc(+inf) = 0 and erfc(-inf) = 2 */
  float t = 2.0f / (2.0f + __builtin_fabsf(v));
  float p = 1.2059852481e-02f;
  p = __builtin_fmaf(p, t, -1.2211570889e-01f);
  p = __builtin_fmaf(p, t, 4.2644193769e-01f);
  p = __builtin_fmaf(p, t, -6.6697335243e-01f);
  p = __builtin_fmaf(p, t, 4.1896751523e-01f);
  p = __builtin_fmaf(p, t, -9.7204923630e-02f);
  p = __builtin_fmaf(p, t, 2.2520072758e-01f);
  p = __builtin_fmaf(p, t, 2.3870874941e-01f);
  p = __builtin_fmaf(p, t, 2.8285041451e-01f);
  p = __builtin_fmaf(p, t, 2.8206479549e-01f);
  float c = t * p * e;
  return v < 0.0f ? 2.0f - c : c;
}

static inline float ember_erff(float x) {
  /* torch.erf: near 0 its Taylor series, for a relative accuracy there */
  float z = x * x;
  float s = 1.0f / 9360.0f;
  s = __builtin_fmaf(s, z, -1.0f / 1320.0f);
  s = __builtin_fmaf(s, z, 1.0f / 216.0f);
  s = __builtin_fmaf(s, z, -1.0f / 42.0f);
  s = __builtin_fmaf(s, z, 1.0f / 10.0f);
  s = __builtin_fmaf(s, z, -1.0f / 3.0f);
  s = __builtin_fmaf(s, z, 1.0f);
  float small = 1.12837916709551257f * x * s;
  float big = 1.0f - ember_erfcf_given_exp(x, ember_expf_shifted(-z)); /* -x*x <= 0 */
  return __builtin_fabsf(x) < 0.5f ? small : big;
}
"""
