// The vectorized activations against double-precision math (exp, sigmoid, SiLU, erf, both GELUs) and bit for bit
// against the scalar
// formulas the elementwise kernels use (ReLU, clamp, hardswish, hardsigmoid): every element of odd lengths, special
// values (infinities, NaN, signed zeros, the ends of exp's range), in place and out of place, with sentinel outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/vector_math.h"
#include "core/cpu_features.h"

namespace npusim::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -777.0f;

std::vector<float> inputs(int64_t n, uint32_t seed, float range) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  for (float& x : v) x = dist(gen);
  const float specials[] = {0.0f,   -0.0f,   kInf,  -kInf,  kNaN, 88.7f, 88.72f, 88.73f, 89.0f, -87.0f,
                            -87.4f, -100.0f, 1e-8f, -1e-8f, 3.0f, -3.0f, 6.0f,   0.5f,   -0.5f};
  for (size_t i = 0; i < v.size() && i < std::size(specials); ++i) v[i * 7 % v.size()] = specials[i];
  return v;
}

double reference(UnaryKind f, double x, double low, double high) {
  const auto relu6 = [](double v) { return std::min(std::max(v, 0.0), 6.0); };
  switch (f) {
    case UnaryKind::Exp:
      return std::exp(x);
    case UnaryKind::Sigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case UnaryKind::Silu:
      return x / (1.0 + std::exp(-x));
    case UnaryKind::Relu:
      return x < 0 ? 0.0 : x;
    case UnaryKind::Clamp:
      return std::isnan(x) ? x : std::min(std::max(x, low), high);
    case UnaryKind::Hardswish:
      return x * relu6(x + 3.0) / 6.0;
    case UnaryKind::Hardsigmoid:
      return relu6(x + 3.0) / 6.0;
    case UnaryKind::Erf:
      return std::erf(x);
    case UnaryKind::GeluErf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case UnaryKind::GeluTanh:  // x (1 + tanh u) / 2 as x sigmoid(2u): 1 + tanh u cancels in double for u << 0
      return x / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    default:
      return 0;
  }
}

// How far a result may be from the exact value: erf's approximation is absolute (2e-7), and GELU inherits it
// times |x| / 2; the others are relative (tanh-GELU's also grows with its computed argument).
double tolerance(UnaryKind f, double x, double want) {
  switch (f) {
    case UnaryKind::Erf:
      return 3e-7;
    case UnaryKind::GeluErf:
      return 3e-7 * std::max(1.0, std::fabs(x));
    case UnaryKind::GeluTanh: {  // sigmoid's 3e-7, and the rounding of its argument 2u in float: e^{2u} is that off
      const double two_u = 2.0 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
      return (5e-7 + 2e-7 * std::fabs(two_u)) * std::fabs(want) + 1e-30;
    }
    default:
      return 3e-7 * std::fabs(want) + 1e-37;
  }
}

// The scalar loops' formulas, in float.
float scalar(UnaryKind f, float x, float low, float high) {
  const auto relu6 = [](float v) { return std::min(std::max(v, 0.0f), 6.0f); };
  switch (f) {
    case UnaryKind::Relu:
      return x < 0.0f ? 0.0f : x;
    case UnaryKind::Clamp:
      return std::isnan(x) ? x : (x < low ? low : (x > high ? high : x));
    case UnaryKind::Hardswish:
      return x * relu6(x + 3.0f) / 6.0f;
    case UnaryKind::Hardsigmoid:
      return relu6(x + 3.0f) / 6.0f;
    default:
      return kNaN;
  }
}

bool exact(UnaryKind f) {
  return f == UnaryKind::Relu || f == UnaryKind::Clamp || f == UnaryKind::Hardswish || f == UnaryKind::Hardsigmoid;
}

void check(UnaryKind f, const std::vector<float>& in, const std::vector<float>& out, const std::string& label) {
  const float low = -0.25f, high = 0.75f;
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = in[i], got = out[i];
    const std::string at = label + " x=" + std::to_string(x) + " at " + std::to_string(i);
    if (exact(f)) {
      const float want = scalar(f, x, low, high);
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << at << " got " << got;
      continue;
    }
    const double want = reference(f, x, low, high);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << at << " got " << got;
    } else if (std::isinf(want) || std::fabs(want) > std::numeric_limits<float>::max()) {
      ASSERT_EQ(got, want > 0 ? kInf : -kInf) << at;
    } else {
      ASSERT_NEAR(got, want, tolerance(f, x, want)) << at;
    }
  }
}

TEST(VectorMath, EveryFunctionOverOddLengthsAndSpecialValues) {
  if (!(cpu_features().avx2 && cpu_features().fma)) {
    std::vector<float> in(9, 1.0f), out(9, kSentinel);
    EXPECT_FALSE(vector_unary({UnaryKind::Exp}, in.data(), out.data(), 9));
    EXPECT_EQ(out[0], kSentinel);
    return;
  }
  for (UnaryKind f :
       {UnaryKind::Exp, UnaryKind::Sigmoid, UnaryKind::Silu, UnaryKind::Relu, UnaryKind::Clamp, UnaryKind::Hardswish,
        UnaryKind::Hardsigmoid, UnaryKind::Erf, UnaryKind::GeluErf, UnaryKind::GeluTanh})
    for (int64_t n : {0, 1, 7, 8, 9, 31, 1000}) {
      const std::string label = "f " + std::to_string(static_cast<int>(f)) + " n " + std::to_string(n);
      const std::vector<float> in = inputs(n, static_cast<uint32_t>(n) + 1, f == UnaryKind::Exp ? 90.0f : 12.0f);
      std::vector<float> out(static_cast<size_t>(n) + 1, kSentinel);
      ASSERT_TRUE(vector_unary({f, -0.25f, 0.75f}, in.data(), out.data(), n));
      ASSERT_EQ(out.back(), kSentinel) << label << ": written past the end";
      out.pop_back();
      check(f, in, out, label);
      std::vector<float> same = in;
      ASSERT_TRUE(vector_unary({f, -0.25f, 0.75f}, same.data(), same.data(), n));
      for (size_t i = 0; i < same.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(same[i]), std::bit_cast<uint32_t>(out[i])) << label << " in place at " << i;
    }
}

TEST(VectorMath, OtherStepsAreLeftToTheScalarLoops) {
  std::vector<float> in(9, 0.5f), out(9, kSentinel);
  EXPECT_FALSE(vector_unary({UnaryKind::Log}, in.data(), out.data(), 9));
  EXPECT_FALSE(vector_unary({UnaryKind::Clamp, kNaN, 1.0f}, in.data(), out.data(), 9));
  EXPECT_FALSE(vector_unary({UnaryKind::Clamp, 0.0f, kNaN}, in.data(), out.data(), 9));
  for (float v : out) EXPECT_EQ(v, kSentinel);
}

TEST(VectorMath, SiluTimesUp) {
  if (!(cpu_features().avx2 && cpu_features().fma)) GTEST_SKIP() << "no AVX2 and FMA: the scalar loop runs";
  for (int64_t n : {0, 5, 8, 13, 4096}) {
    const std::vector<float> gate = inputs(n, 3, 12.0f), up = inputs(n, 4, 2.0f);
    std::vector<float> out(static_cast<size_t>(n) + 1, kSentinel);
    ASSERT_TRUE(vector_silu_mul(gate.data(), up.data(), out.data(), n));
    ASSERT_EQ(out.back(), kSentinel);
    for (int64_t i = 0; i < n; ++i) {
      const double want = reference(UnaryKind::Silu, gate[static_cast<size_t>(i)], 0, 0) * up[static_cast<size_t>(i)];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[static_cast<size_t>(i)])) << i;
      } else if (std::isinf(want)) {
        ASSERT_EQ(out[static_cast<size_t>(i)], static_cast<float>(want)) << i;
      } else {
        ASSERT_NEAR(out[static_cast<size_t>(i)], want, 5e-7 * std::fabs(want) + 1e-37) << "n " << n << " at " << i;
      }
    }
  }
}

// Softmax's exponentials: e^(x - shift) in place for every element (masked -inf scores give 0, NaN stays NaN), the
// elements past n untouched, and their sum in double.
TEST(VectorMath, ExponentialsShiftedInPlace) {
  if (!(cpu_features().avx2 && cpu_features().fma)) GTEST_SKIP() << "no AVX2 and FMA: the scalar loop runs";
  for (int64_t n : {0, 1, 7, 8, 9, 31, 4099})
    for (float shift : {0.0f, 3.5f, -2.0f}) {
      std::vector<float> x = inputs(n, 21, 30.0f);
      for (float& v : x)
        if (v > 80.0f || v == kInf) v = -kInf;  // softmax shifts by the largest: nothing overflows
      const std::vector<float> original = x;
      x.push_back(kSentinel);
      double sum = -1.0;
      ASSERT_TRUE(vector_exp_shifted(x.data(), n, shift, sum));
      ASSERT_EQ(x.back(), kSentinel);
      long double want_sum = 0;
      bool any_nan = false;
      for (int64_t i = 0; i < n; ++i) {
        const float shifted = original[static_cast<size_t>(i)] - shift;  // in fp32, as softmax shifts
        const double want = std::exp(static_cast<double>(shifted));
        const float got = x[static_cast<size_t>(i)];
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got)) << i;
          any_nan = true;
          continue;
        }
        ASSERT_NEAR(got, want, 5e-7 * want + 1e-37) << "n " << n << " at " << i;
        want_sum += got;
      }
      if (any_nan)
        EXPECT_TRUE(std::isnan(sum)) << "n " << n;
      else
        EXPECT_NEAR(sum, static_cast<double>(want_sum), 1e-12 * static_cast<double>(want_sum)) << "n " << n;
    }
}

TEST(VectorMath, SumInDouble) {
  for (int64_t n : {0, 1, 3, 4, 15, 16, 17, 100, 12544}) {
    const std::vector<float> x = inputs(n, 9, 5.0f);
    std::vector<float> finite;
    for (float v : x) finite.push_back(std::isfinite(v) ? v : 0.5f);
    long double want = 0;
    for (float v : finite) want += v;
    EXPECT_NEAR(sum_in_double(finite.data(), n), static_cast<double>(want), 1e-9) << "n " << n;
  }
}

TEST(VectorMath, SumOfSquaredDeviations) {
  for (int64_t n : {0, 1, 3, 4, 15, 16, 17, 100, 12544})
    for (double center : {0.0, 0.37, -2.5}) {
      const std::vector<float> x = inputs(n, 11, 5.0f);
      std::vector<float> finite;
      for (float v : x) finite.push_back(std::isfinite(v) ? v : 0.5f);
      long double want = 0;
      for (float v : finite) want += (static_cast<long double>(v) - center) * (static_cast<long double>(v) - center);
      EXPECT_NEAR(sum_squared_deviations(finite.data(), n, center), static_cast<double>(want),
                  1e-12 * static_cast<double>(want) + 1e-12)
          << "n " << n << " center " << center;
    }
}

}  // namespace
}  // namespace npusim::cpu
