#include "backends/cpu/vector_math.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NPUSIM_VECTOR_MATH_X86 1
#endif

#include <cmath>

#include "core/cpu_features.h"

namespace npusim::cpu {

namespace {

double sum_portable(const float* x, int64_t n) {
  double partial[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int64_t j = 0; j < 4; ++j) partial[j] += x[i + j];
  double sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
  for (; i < n; ++i) sum += x[i];
  return sum;
}

double squares_portable(const float* x, int64_t n, double center) {
  double partial[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int64_t j = 0; j < 4; ++j) {
      const double d = x[i + j] - center;
      partial[j] += d * d;
    }
  double sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
  for (; i < n; ++i) sum += (x[i] - center) * (x[i] - center);
  return sum;
}

}  // namespace

#ifdef NPUSIM_VECTOR_MATH_X86
namespace {

#define NPUSIM_AVX2_FMA __attribute__((target("avx2,fma")))

// The reduction shared by exp8 and sigmoid8: for t already clamped to a finite range, n = round(t / ln 2) and the
// return value e^r for r = t - n ln 2 (taken in two steps), by a degree-6 polynomial; e^t = e^r * 2^n.
NPUSIM_AVX2_FMA inline __m256 exp_reduced(__m256 t, __m256& n) {
  n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), t);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  return _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

// 2^k for integer lanes k in [-126, 127].
NPUSIM_AVX2_FMA inline __m256 power_of_two(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

// e^x for 8 lanes. x is clamped to [-104, ln(FLT_MAX)] (a NaN stays NaN through the bound-first min/max), n =
// round(x / ln 2), r = x - n ln 2 in two steps, e^r by a degree-6 polynomial, times 2^(n / 2) and 2^(n - n / 2),
// both normal numbers, so that the products round to denormals and zero the way a single scale would; above
// ln(FLT_MAX) the result is +inf.
NPUSIM_AVX2_FMA inline __m256 exp8(__m256 x) {
  const __m256 overflow = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(88.72283935546875f), x));
  __m256 n;
  const __m256 p = exp_reduced(x, n);
  const __m256i whole = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(whole, 1);
  const __m256 result =
      _mm256_mul_ps(_mm256_mul_ps(p, power_of_two(half)), power_of_two(_mm256_sub_epi32(whole, half)));
  return _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()), overflow);
}

// 1 / (1 + e^-x), as the scalar sigmoid writes it, with exp8's polynomial over the range that matters: for -x < -20,
// 1 + e^-x rounds to 1 anyway, and for x < -ln(FLT_MAX) the scalar loop's e^-x overflows and the result is 0; in
// between, 2^n is one normal number. A NaN stays NaN through the bound-first min/max.
NPUSIM_AVX2_FMA inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(-88.72283935546875f), _CMP_LT_OQ);
  const __m256 t = _mm256_max_ps(_mm256_set1_ps(-20.0f),
                                 _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_sub_ps(_mm256_setzero_ps(), x)));
  __m256 n;
  const __m256 p = exp_reduced(t, n);
  const __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(one, _mm256_mul_ps(p, power_of_two(_mm256_cvtps_epi32(n)))));
  return _mm256_andnot_ps(zero_below, sigmoid);
}

// erf(x) by Eigen's rational approximation (odd degree-13 numerator over even degree-8 denominator in x clamped to
// [-4, 4], where fp32 erf is +-1): within 2e-7 absolutely. A NaN stays NaN through the bound-first min/max.
NPUSIM_AVX2_FMA inline __m256 erf8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-4.0f), _mm256_min_ps(_mm256_set1_ps(4.0f), x));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_fmadd_ps(x2, _mm256_set1_ps(-2.72614225801306e-10f), _mm256_set1_ps(2.77068142495902e-08f));
  p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(-2.10102402082508e-06f));
  p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(-5.69250639462346e-05f));
  p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(-7.34990630326855e-04f));
  p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(-2.95459980854025e-03f));
  p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(-1.60960333262415e-02f));
  __m256 q = _mm256_fmadd_ps(x2, _mm256_set1_ps(-1.45660718464996e-05f), _mm256_set1_ps(-2.13374055278905e-04f));
  q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(-1.68282697438203e-03f));
  q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(-7.37332916720468e-03f));
  q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(-1.42647390514189e-02f));
  return _mm256_div_ps(_mm256_mul_ps(x, p), q);
}

// gelu with erf: x/2 (1 + erf(x / sqrt 2)).
NPUSIM_AVX2_FMA inline __m256 gelu_erf8(__m256 x) {
  const __m256 half_x = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
  const __m256 e = erf8(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f)));
  return _mm256_fmadd_ps(half_x, e, half_x);
}

// gelu with tanh: x/2 (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3).
NPUSIM_AVX2_FMA inline __m256 gelu_tanh8(__m256 x) {
  const __m256 cube_term = _mm256_mul_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(0.044715f));
  const __m256 two_u = _mm256_mul_ps(_mm256_fmadd_ps(cube_term, x, x), _mm256_set1_ps(1.5957691216057308f));
  return _mm256_mul_ps(x, sigmoid8(two_u));
}

// min(max(v, 0), 6) as std::min/std::max take it: a NaN v stays NaN.
NPUSIM_AVX2_FMA inline __m256 relu6_8(__m256 v) {
  return _mm256_min_ps(_mm256_set1_ps(6.0f), _mm256_max_ps(_mm256_setzero_ps(), v));
}

template <UnaryKind F>
NPUSIM_AVX2_FMA inline __m256 apply8(__m256 x, __m256 low, __m256 high) {
  if constexpr (F == UnaryKind::Exp) return exp8(x);
  if constexpr (F == UnaryKind::Sigmoid) return sigmoid8(x);
  if constexpr (F == UnaryKind::Silu) return _mm256_mul_ps(x, sigmoid8(x));
  if constexpr (F == UnaryKind::Erf) return erf8(x);
  if constexpr (F == UnaryKind::GeluErf) return gelu_erf8(x);
  if constexpr (F == UnaryKind::GeluTanh) return gelu_tanh8(x);
  if constexpr (F == UnaryKind::Relu) return _mm256_max_ps(_mm256_setzero_ps(), x);
  if constexpr (F == UnaryKind::Clamp) return _mm256_min_ps(high, _mm256_max_ps(low, x));
  if constexpr (F == UnaryKind::Hardswish)
    return _mm256_div_ps(_mm256_mul_ps(x, relu6_8(_mm256_add_ps(x, _mm256_set1_ps(3.0f)))), _mm256_set1_ps(6.0f));
  if constexpr (F == UnaryKind::Hardsigmoid)
    return _mm256_div_ps(relu6_8(_mm256_add_ps(x, _mm256_set1_ps(3.0f))), _mm256_set1_ps(6.0f));
}

template <UnaryKind F>
NPUSIM_AVX2_FMA void map8(const float* in, float* out, int64_t n, float low, float high) {
  const __m256 lo = _mm256_set1_ps(low), hi = _mm256_set1_ps(high);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, apply8<F>(_mm256_loadu_ps(in + i), lo, hi));
  if (i < n) {
    alignas(32) float tail[8] = {};
    for (int64_t j = i; j < n; ++j) tail[j - i] = in[j];
    _mm256_store_ps(tail, apply8<F>(_mm256_load_ps(tail), lo, hi));
    for (int64_t j = i; j < n; ++j) out[j] = tail[j - i];
  }
}

// map8 of whichever of `Kinds` `kind` is; false for none of them.
template <UnaryKind... Kinds>
bool map8_one_of(UnaryKind kind, const float* in, float* out, int64_t n, float low, float high) {
  return ((kind == Kinds && (map8<Kinds>(in, out, n, low, high), true)) || ...);
}

// False for the steps without a vector form.
bool unary_avx2(const UnaryStep& step, const float* in, float* out, int64_t n) {
  if (step.kind == UnaryKind::Clamp && (std::isnan(step.p0) || std::isnan(step.p1))) return false;
  return map8_one_of<UnaryKind::Exp, UnaryKind::Sigmoid, UnaryKind::Silu, UnaryKind::Erf, UnaryKind::GeluErf,
                     UnaryKind::GeluTanh, UnaryKind::Relu, UnaryKind::Clamp, UnaryKind::Hardswish,
                     UnaryKind::Hardsigmoid>(step.kind, in, out, n, step.p0, step.p1);
}

NPUSIM_AVX2_FMA void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    alignas(32) float g[8] = {}, u[8] = {};
    for (int64_t j = i; j < n; ++j) g[j - i] = gate[j], u[j - i] = up[j];
    const __m256 gv = _mm256_load_ps(g);
    _mm256_store_ps(g, _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid8(gv)), _mm256_load_ps(u)));
    for (int64_t j = i; j < n; ++j) out[j] = g[j - i];
  }
}

// The four lanes of each half of v added to a and b in double.
NPUSIM_AVX2_FMA inline void add_in_double(__m256 v, __m256d& a, __m256d& b) {
  a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

NPUSIM_AVX2_FMA double exp_shifted_avx2(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256d a = _mm256_setzero_pd(), b = a;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    add_in_double(e, a, b);
  }
  if (i < n) {  // the tail's missing lanes hold -inf: e^-inf adds 0
    alignas(32) float tail[8];
    for (int64_t j = 0; j < 8; ++j) tail[j] = i + j < n ? x[i + j] : -__builtin_inff();
    const __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(tail), s));
    _mm256_store_ps(tail, e);
    for (int64_t j = i; j < n; ++j) x[j] = tail[j - i];
    add_in_double(e, a, b);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a, b));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

__attribute__((target("avx2"))) double sum_avx2(const float* x, int64_t n) {
  __m256d a = _mm256_setzero_pd(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(x + i)));
    b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)));
    c = _mm256_add_pd(c, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)));
    d = _mm256_add_pd(d, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(a, b), _mm256_add_pd(c, d)));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum += x[i];
  return sum;
}

NPUSIM_AVX2_FMA double squares_avx2(const float* x, int64_t n, double center) {
  const __m256d c = _mm256_set1_pd(center);
  __m256d a = _mm256_setzero_pd(), b = a, e = a, f = a;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256d da = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), c);
    const __m256d db = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)), c);
    const __m256d de = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), c);
    const __m256d df = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 12)), c);
    a = _mm256_fmadd_pd(da, da, a);
    b = _mm256_fmadd_pd(db, db, b);
    e = _mm256_fmadd_pd(de, de, e);
    f = _mm256_fmadd_pd(df, df, f);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(a, b), _mm256_add_pd(e, f)));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum += (x[i] - center) * (x[i] - center);
  return sum;
}

// A multiply, then an add (not one fused multiply-add): the scalar loop's two roundings, so bit for bit the same.
__attribute__((target("avx2"))) void affine_avx2(const float* in, float* out, int64_t n, float scale, float shift) {
  const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(in + i), x1 = _mm256_loadu_ps(in + i + 8);
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(x0, s), b));
    _mm256_storeu_ps(out + i + 8, _mm256_add_ps(_mm256_mul_ps(x1, s), b));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(in + i), s), b));
  for (; i < n; ++i) out[i] = in[i] * scale + shift;
}

bool has_avx2_fma() { return cpu_features().avx2 && cpu_features().fma; }

}  // namespace

bool vector_unary(const UnaryStep& step, const float* in, float* out, int64_t n) {
  return has_avx2_fma() && unary_avx2(step, in, out, n);
}

bool vector_exp_shifted(float* x, int64_t n, float shift, double& sum) {
  if (!has_avx2_fma()) return false;
  sum = exp_shifted_avx2(x, n, shift);
  return true;
}

bool vector_silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (!has_avx2_fma()) return false;
  silu_mul_avx2(gate, up, out, n);
  return true;
}

void affine(const float* in, float* out, int64_t n, float scale, float shift) {
  if (cpu_features().avx2) return affine_avx2(in, out, n, scale, shift);
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale + shift;
}

double sum_in_double(const float* x, int64_t n) { return cpu_features().avx2 ? sum_avx2(x, n) : sum_portable(x, n); }

double sum_squared_deviations(const float* x, int64_t n, double center) {
  return has_avx2_fma() ? squares_avx2(x, n, center) : squares_portable(x, n, center);
}

#else

bool vector_unary(const UnaryStep&, const float*, float*, int64_t) { return false; }
bool vector_silu_mul(const float*, const float*, float*, int64_t) { return false; }
bool vector_exp_shifted(float*, int64_t, float, double&) { return false; }

void affine(const float* in, float* out, int64_t n, float scale, float shift) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale + shift;
}

double sum_in_double(const float* x, int64_t n) { return sum_portable(x, n); }
double sum_squared_deviations(const float* x, int64_t n, double center) { return squares_portable(x, n, center); }

#endif

}  // namespace npusim::cpu
