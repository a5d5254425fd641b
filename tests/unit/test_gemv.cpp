// The decode-sized matrix products (backends/cpu/gemv.h): every output element against a double-precision product,
// for each weight type, both implementations and one or two threads, and the int8 quantization's error bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/compact_bf16.h"
#include "backends/cpu/gemv.h"
#include "core/cpu_features.h"
#include "gemv_isas.h"
#include "npusim/error.h"

namespace npusim::cpu {
namespace {

constexpr float kSentinel = std::numeric_limits<float>::quiet_NaN();
const std::vector<int64_t> kSizes = {0, 1, 3, 7, 8, 15, 16, 17, 33, 100, 257, 1000};

struct Random {
  uint64_t state;
  float uniform() {  // [-1, 1)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(state >> 40) * 0x1.0p-23f - 1.0f;
  }
};

std::vector<float> random_floats(int64_t count, uint64_t seed) {
  Random random{seed};
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = random.uniform();
  return values;
}

// A weight in one storage type, with its exact fp32 values (what the kernel must multiply by).
struct TestWeight {
  GemvWeightType type;
  int64_t n, k;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  QuantizedWeight quantized;
  std::shared_ptr<const CompactBf16Weight> compact;
  std::vector<float> exact;  // [n, k]

  GemvWeight view() const {
    switch (type) {
      case GemvWeightType::F32:
        return {.type = type, .values = f32.data(), .n = n, .k = k};
      case GemvWeightType::F16:
      case GemvWeightType::BF16:
        return {.type = type, .values = half.data(), .n = n, .k = k};
      case GemvWeightType::Int8:
        return quantized.view();
      case GemvWeightType::CompactBF16:
        return {.type = type, .n = n, .k = k, .compact = compact.get()};
    }
    return {};
  }
};

TestWeight make_weight(GemvWeightType type, int64_t n, int64_t k, int64_t group = 0) {
  TestWeight w{type, n, k, random_floats(n * k, static_cast<uint64_t>(n * 7919 + k)), {}, {}, {}, {}};
  w.exact = w.f32;
  if (type == GemvWeightType::F16 || type == GemvWeightType::BF16 || type == GemvWeightType::CompactBF16) {
    for (float& v : w.exact) {
      const uint16_t bits = type == GemvWeightType::F16 ? float_to_fp16(v) : float_to_bf16(v);
      w.half.push_back(bits);
      v = type == GemvWeightType::F16 ? fp16_to_float(bits) : bf16_bits_to_float(bits);
    }
    if (type == GemvWeightType::CompactBF16) {
      w.compact = compact_bf16(w.half.data(), n, k, nullptr, kCompactEscapeShare, compact_interleave(k));
      if (!w.compact) fail("test weight: not compact");
    }
  } else if (type == GemvWeightType::Int8) {
    w.quantized =
        quantize_int8(reinterpret_cast<const std::byte*>(w.f32.data()), Elem::F32, n, k, group == 0 ? k : group);
    for (int64_t j = 0; j < n; ++j)
      w.quantized.dequantize_row(j, Elem::F32, reinterpret_cast<std::byte*>(w.exact.data() + j * k));
  }
  return w;
}

struct Expected {
  std::vector<double> values;  // [m, n]
  std::vector<double> bounds;  // allowed absolute error per element
};

// Half the step of x[i, t] when activations are quantized to int8 in blocks of 32 along k (int8 weights on AVX2).
std::vector<double> activation_half_steps(const std::vector<float>& x, int64_t m, int64_t k) {
  std::vector<double> steps(x.size(), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t first = 0; first < k; first += 32) {
      double largest = 0.0;
      for (int64_t t = first; t < std::min(k, first + 32); ++t)
        largest = std::max(largest, std::fabs(static_cast<double>(x[static_cast<size_t>(i * k + t)])));
      for (int64_t t = first; t < std::min(k, first + 32); ++t) steps[static_cast<size_t>(i * k + t)] = largest / 254.0;
    }
  return steps;
}

// The product in double; the bound allows fp32 rounding, plus the activation rounding for int8 weights.
Expected naive_product(const std::vector<float>& x, int64_t m, const TestWeight& w, const std::vector<float>& bias) {
  Expected e;
  const std::vector<double> half_steps = activation_half_steps(x, m, w.k);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < w.n; ++j) {
      double sum = bias.empty() ? 0.0 : bias[static_cast<size_t>(bias.size() == 1 ? 0 : j)];
      double magnitude = std::fabs(sum), rounding = 0.0;
      for (int64_t t = 0; t < w.k; ++t) {
        const double weight = w.exact[static_cast<size_t>(j * w.k + t)];
        const double term = static_cast<double>(x[static_cast<size_t>(i * w.k + t)]) * weight;
        sum += term;
        magnitude += std::fabs(term);
        rounding += std::fabs(weight) * half_steps[static_cast<size_t>(i * w.k + t)];
      }
      e.values.push_back(sum);
      e.bounds.push_back(1e-5 * magnitude + (w.type == GemvWeightType::Int8 ? 1.0001 * rounding : 0.0) + 1e-30);
    }
  return e;
}

const char* type_name(GemvWeightType type) {
  switch (type) {
    case GemvWeightType::F32:
      return "f32";
    case GemvWeightType::F16:
      return "f16";
    case GemvWeightType::BF16:
      return "bf16";
    case GemvWeightType::Int8:
      return "int8";
    case GemvWeightType::CompactBF16:
      return "compact_bf16";
  }
  return "?";
}

// Runs the product with output rows padded by 3 sentinel columns, and checks every element and the padding.
void check_product(const TestWeight& w, int64_t m, const std::vector<float>& x, const std::vector<float>& bias,
                   const Expected& expected, ThreadPool& pool, const std::string& label) {
  const int64_t ldy = w.n + 3;
  std::vector<float> y(static_cast<size_t>(m * ldy), kSentinel);
  GemvProblem problem{.m = m,
                      .x = x.data(),
                      .ldx = w.k,
                      .weight = w.view(),
                      .y = reinterpret_cast<std::byte*>(y.data()),
                      .y_elem = Elem::F32,
                      .ldy = ldy};
  // Activations that are bf16 values come as bf16 too, as a bf16 model's do.
  std::vector<uint16_t> x_bf16;
  for (float v : x) x_bf16.push_back(float_to_bf16(v));
  if (std::equal(x.begin(), x.end(), x_bf16.begin(), [](float v, uint16_t b) { return v == bf16_bits_to_float(b); }))
    problem.x_bf16 = x_bf16.data();
  if (!bias.empty()) {
    problem.bias = reinterpret_cast<const std::byte*>(bias.data());
    problem.bias_count = static_cast<int64_t>(bias.size());
  }
  gemv(problem, pool);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n; ++j) {
      const size_t at = static_cast<size_t>(i * w.n + j);
      ASSERT_NEAR(y[static_cast<size_t>(i * ldy + j)], expected.values[at], expected.bounds[at])
          << label << " at [" << i << ", " << j << "]";
    }
    for (int64_t j = w.n; j < ldy; ++j) ASSERT_TRUE(std::isnan(y[static_cast<size_t>(i * ldy + j)])) << label;
  }
}

const char* isa_name(GemvIsa isa) {
  switch (isa) {
    case GemvIsa::Portable:
      return "portable";
    case GemvIsa::Avx2:
      return "avx2";
    case GemvIsa::Avx512:
      return "avx512";
  }
  return "?";
}

// The bf16 dot products need activations that are bf16 values: the tests round them for that implementation.
std::vector<float> activations_for(GemvIsa isa, const std::vector<float>& x) {
  if (isa != GemvIsa::Avx512 || !cpu_features().avx512bf16) return x;
  std::vector<float> rounded;
  for (float v : x) rounded.push_back(bf16_bits_to_float(float_to_bf16(v)));
  return rounded;
}

class GemvTest : public ::testing::TestWithParam<GemvWeightType> {
 protected:
  void TearDown() override { force_gemv_isa(std::nullopt); }
};

TEST_P(GemvTest, EveryShapeMatchesADoublePrecisionProduct) {
  ThreadPool one(1), two(2);
  for (int64_t n : kSizes)
    for (int64_t k : kSizes) {
      const TestWeight w = make_weight(GetParam(), n, k);
      for (int64_t m : {1, 2, 3, 7}) {
        const std::vector<float> random = random_floats(m * k, static_cast<uint64_t>(m * 31 + k));
        for (GemvIsa isa : test::available_gemv_isas()) {
          const std::vector<float> x = activations_for(isa, random);
          const Expected expected = naive_product(x, m, w, {});
          force_gemv_isa(isa);
          for (ThreadPool* pool : {&one, &two}) {
            const std::string label = std::string(type_name(GetParam())) + " " + isa_name(isa) +
                                      " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                      " k=" + std::to_string(k) + " threads=" + std::to_string(pool->size());
            check_product(w, m, x, {}, expected, *pool, label);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
}

TEST_P(GemvTest, AddsTheBiasPerColumnOrOnce) {
  ThreadPool pool(2);
  for (GemvIsa isa : test::available_gemv_isas()) {
    force_gemv_isa(isa);
    for (int64_t m : {1, 5}) {
      const TestWeight w = make_weight(GetParam(), 37, 45);
      const std::vector<float> x = activations_for(isa, random_floats(m * 45, 3));
      for (const std::vector<float>& bias : {random_floats(37, 4), std::vector<float>{0.75f}})
        check_product(w, m, x, bias, naive_product(x, m, w, bias), pool, "bias of " + std::to_string(bias.size()));
    }
  }
}

// Rows of 4096 values and more take other blocks of rows than short ones on some implementations: odd column counts,
// lengths that are not whole vectors, column ranges of every size through the pool.
TEST_P(GemvTest, LongRowsMatchADoublePrecisionProduct) {
  ThreadPool two(2);
  for (int64_t n : {1, 3, 4, 9})
    for (int64_t k : {4096, 4100, 4127}) {
      const TestWeight w = make_weight(GetParam(), n, k);
      for (int64_t m : {1, 2}) {
        const std::vector<float> random = random_floats(m * k, static_cast<uint64_t>(m * 7 + k));
        for (GemvIsa isa : test::available_gemv_isas()) {
          const std::vector<float> x = activations_for(isa, random);
          force_gemv_isa(isa);
          check_product(w, m, x, {}, naive_product(x, m, w, {}), two,
                        std::string(type_name(GetParam())) + " " + isa_name(isa) + " m=" + std::to_string(m) +
                            " n=" + std::to_string(n) + " k=" + std::to_string(k));
          if (HasFatalFailure()) return;
        }
      }
    }
}

// Threads start on regions of their own and then take what is left of the others': every column once, with region
// counts that do not divide the chunks, and more threads than chunks.
TEST_P(GemvTest, EveryPoolSizeCoversEveryColumnOnce) {
  const TestWeight w = make_weight(GetParam(), 1301, 1000);
  const std::vector<float> random = random_floats(1000, 11);
  for (int threads : {3, 5, 16}) {
    ThreadPool pool(threads);
    for (GemvIsa isa : test::available_gemv_isas()) {
      const std::vector<float> x = activations_for(isa, random);
      force_gemv_isa(isa);
      check_product(w, 1, x, {}, naive_product(x, 1, w, {}), pool,
                    std::string(type_name(GetParam())) + " " + isa_name(isa) + " threads=" + std::to_string(threads));
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, GemvTest,
                         ::testing::Values(GemvWeightType::F32, GemvWeightType::F16, GemvWeightType::BF16,
                                           GemvWeightType::Int8, GemvWeightType::CompactBF16),
                         [](const auto& info) { return std::string(type_name(info.param)); });

TEST(Gemv, ColumnRangesAnywhereGiveTheSameElements) {
  const TestWeight w = make_weight(GemvWeightType::BF16, 29, 40);
  const std::vector<float> x = random_floats(2 * 40, 9);
  const Expected expected = naive_product(x, 2, w, {});
  std::vector<float> y(2 * 29, kSentinel);
  const GemvProblem problem{
      .m = 2, .x = x.data(), .ldx = 40, .weight = w.view(), .y = reinterpret_cast<std::byte*>(y.data()), .ldy = 29};
  gemv_columns(problem, 0, 5);
  gemv_columns(problem, 5, 6);
  gemv_columns(problem, 6, 100);  // clamped to n
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected.values[i], expected.bounds[i]) << i;
}

TEST(Gemv, StoresBf16Outputs) {
  ThreadPool pool(2);
  const TestWeight w = make_weight(GemvWeightType::F32, 20, 24);
  const std::vector<float> x = random_floats(24, 5);
  const Expected expected = naive_product(x, 1, w, {});
  std::vector<uint16_t> y(20, 0xffff);
  gemv({.m = 1,
        .x = x.data(),
        .ldx = 24,
        .weight = w.view(),
        .y = reinterpret_cast<std::byte*>(y.data()),
        .y_elem = Elem::BF16,
        .ldy = 20},
       pool);
  for (size_t j = 0; j < y.size(); ++j) {
    const double value = bf16_bits_to_float(y[j]);  // rounded to 8 significant bits
    EXPECT_NEAR(value, expected.values[j], std::fabs(expected.values[j]) * 0x1.0p-8 + expected.bounds[j]) << j;
  }
}

TEST(Gemv, GroupedInt8ScalesMatchTheDequantizedProduct) {
  ThreadPool pool(2);
  for (GemvIsa isa : test::available_gemv_isas()) {
    force_gemv_isa(isa);
    for (int64_t group : {8, 16, 32, 64})
      for (int64_t k : {8, 17, 100, 257}) {
        const TestWeight w = make_weight(GemvWeightType::Int8, 33, k, group);
        for (int64_t m : {1, 3, 7}) {
          const std::vector<float> x = random_floats(m * k, 11);
          check_product(w, m, x, {}, naive_product(x, m, w, {}), pool,
                        "group " + std::to_string(group) + " k " + std::to_string(k) + " m " + std::to_string(m));
        }
      }
  }
  force_gemv_isa(std::nullopt);
}

// |dequantized - original| <= scale / 2 with scale = max |w| / 127 over the group, values in [-127, 127].
TEST(Gemv, Int8QuantizationErrorIsAtMostHalfAStep) {
  for (int64_t group : {0, 8, 32})
    for (int64_t k : {1, 7, 40, 257}) {
      const int64_t n = 5;
      std::vector<float> w = random_floats(n * k, 21);
      w[0] = 0.0f;
      if (k > 3) std::fill(w.begin() + k, w.begin() + 2 * k, 0.0f);  // a row of zeros: scale 0, values 0
      const QuantizedWeight q = quantize_int8(reinterpret_cast<const std::byte*>(w.data()), Elem::F32, n, k, group);
      const int64_t size = group == 0 || group > k ? k : group;
      EXPECT_EQ(q.group, size);
      const auto* values = reinterpret_cast<const int8_t*>(q.values.data());
      const auto* scales = reinterpret_cast<const float*>(q.scales.data());
      std::vector<float> row(static_cast<size_t>(k));
      for (int64_t j = 0; j < n; ++j) {
        q.dequantize_row(j, Elem::F32, reinterpret_cast<std::byte*>(row.data()));
        for (int64_t i = 0; i < k; ++i) {
          const int64_t first = i / size * size;
          float largest = 0.0f;
          for (int64_t t = first; t < std::min(k, first + size); ++t)
            largest = std::max(largest, std::fabs(w[j * k + t]));
          const float scale = scales[j * ((k + size - 1) / size) + i / size];
          EXPECT_FLOAT_EQ(scale, largest / 127.0f);
          EXPECT_GE(values[j * k + i], -127);
          EXPECT_LE(std::fabs(row[static_cast<size_t>(i)] - w[static_cast<size_t>(j * k + i)]), scale * 0.5f * 1.0001f)
              << "group " << group << " k " << k << " [" << j << ", " << i << "]";
        }
      }
    }
}

// The vector quantizer gives the portable one's bytes: rounding to nearest even, clamping, NaN and infinity.
TEST(Gemv, Int8QuantizationIsTheSameOnEveryImplementation) {
  std::vector<float> w = random_floats(7 * 100, 31);
  for (size_t i = 0; i < w.size(); i += 9) w[i] *= 40.0f;  // large values: others round near .5 steps
  w[5] = std::numeric_limits<float>::quiet_NaN();
  w[150] = std::numeric_limits<float>::infinity();
  w[260] = -std::numeric_limits<float>::infinity();
  std::fill(w.begin() + 300, w.begin() + 400, 0.0f);
  w[401] = 0.5f * 127.0f / 127.0f;
  for (int64_t group : {0, 8, 16, 40}) {
    std::vector<std::vector<std::byte>> results;
    for (GemvIsa isa : test::available_gemv_isas()) {
      force_gemv_isa(isa);
      const QuantizedWeight q = quantize_int8(reinterpret_cast<const std::byte*>(w.data()), Elem::F32, 7, 100, group);
      std::vector<std::byte> bytes(q.values.data(), q.values.data() + 7 * 100);
      bytes.insert(bytes.end(), q.scales.data(), q.scales.data() + q.scales.size());
      results.push_back(std::move(bytes));
    }
    force_gemv_isa(std::nullopt);
    for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r], results[0]) << "group " << group;
  }
}

TEST(Gemv, QuantizesBf16WeightsAndSplitsOverThePool) {
  ThreadPool pool(2);
  std::vector<uint16_t> bits;
  for (float v : random_floats(64 * 48, 8)) bits.push_back(float_to_bf16(v));
  const QuantizedWeight alone = quantize_int8(reinterpret_cast<const std::byte*>(bits.data()), Elem::BF16, 64, 48, 0);
  const QuantizedWeight split =
      quantize_int8(reinterpret_cast<const std::byte*>(bits.data()), Elem::BF16, 64, 48, 0, &pool);
  EXPECT_EQ(std::memcmp(alone.values.data(), split.values.data(), 64 * 48), 0);
  EXPECT_EQ(std::memcmp(alone.scales.data(), split.scales.data(), 64 * sizeof(float)), 0);
  std::vector<float> row(48);
  alone.dequantize_row(3, Elem::F32, reinterpret_cast<std::byte*>(row.data()));
  const float scale = reinterpret_cast<const float*>(alone.scales.data())[3];
  for (int64_t i = 0; i < 48; ++i)
    EXPECT_LE(std::fabs(row[static_cast<size_t>(i)] - bf16_bits_to_float(bits[static_cast<size_t>(3 * 48 + i)])),
              scale * 0.5f * 1.0001f);
}

// Rows widened to fp32 are each int8 value times its group's scale, rounded once; rows widened to bf16 are those
// rounded to nearest even; for per-row and grouped scales, odd lengths, nothing written past the row.
TEST(Gemv, DequantizesRowsToBf16AsTheRoundedFp32Rows) {
  for (int64_t group : {0, 8, 32})
    for (int64_t k : {1, 7, 33, 100}) {
      const std::vector<float> values = random_floats(5 * k, 12);
      const QuantizedWeight q =
          quantize_int8(reinterpret_cast<const std::byte*>(values.data()), Elem::F32, 5, k, group);
      for (int64_t j = 0; j < 5; ++j) {
        std::vector<float> wide(static_cast<size_t>(k) + 1, -1234.5f);
        std::vector<uint16_t> narrow(static_cast<size_t>(k) + 1, 0xFFFF);
        q.dequantize_row(j, Elem::F32, reinterpret_cast<std::byte*>(wide.data()));
        q.dequantize_row(j, Elem::BF16, reinterpret_cast<std::byte*>(narrow.data()));
        const auto* ints = reinterpret_cast<const int8_t*>(q.values.data()) + j * k;
        const auto* scales = reinterpret_cast<const float*>(q.scales.data());
        const int64_t per_row = q.group >= k ? 1 : (k + q.group - 1) / q.group;
        for (int64_t i = 0; i < k; ++i) {
          const float scale = scales[j * per_row + (q.group >= k ? 0 : i / q.group)];
          EXPECT_EQ(wide[static_cast<size_t>(i)], static_cast<float>(ints[i]) * scale)
              << "group " << group << " k " << k << " at [" << j << ", " << i << "]";
          EXPECT_EQ(narrow[static_cast<size_t>(i)], float_to_bf16(wide[static_cast<size_t>(i)]))
              << "group " << group << " k " << k << " at [" << j << ", " << i << "]";
        }
        EXPECT_EQ(wide[static_cast<size_t>(k)], -1234.5f) << "written past the row";
        EXPECT_EQ(narrow[static_cast<size_t>(k)], 0xFFFF) << "written past the row";
      }
    }
  std::vector<std::byte> out(8);
  const std::vector<float> values = random_floats(8, 3);
  const QuantizedWeight q = quantize_int8(reinterpret_cast<const std::byte*>(values.data()), Elem::F32, 1, 8, 0);
  EXPECT_THROW(q.dequantize_row(0, Elem::F16, out.data()), Error);
}

TEST(Gemv, RejectsBadRowCountsAndGroups) {
  ThreadPool pool(1);
  const TestWeight w = make_weight(GemvWeightType::F32, 4, 16);
  const std::vector<float> x(8 * 16, 1.0f);
  std::vector<float> y(8 * 4);
  GemvProblem problem{
      .m = 0, .x = x.data(), .ldx = 16, .weight = w.view(), .y = reinterpret_cast<std::byte*>(y.data()), .ldy = 4};
  EXPECT_THROW(gemv(problem, pool), Error);
  problem.m = kGemvMaxRows + 1;
  EXPECT_THROW(gemv(problem, pool), Error);
  const TestWeight q = make_weight(GemvWeightType::Int8, 4, 16);
  problem.m = 1;
  problem.weight = q.view();
  problem.weight.group = 12;
  EXPECT_THROW(gemv(problem, pool), Error);
  const std::vector<float> values(4 * 16, 1.0f);
  EXPECT_THROW(quantize_int8(reinterpret_cast<const std::byte*>(values.data()), Elem::F32, 4, 16, 12), Error);
  EXPECT_THROW(quantize_int8(reinterpret_cast<const std::byte*>(values.data()), Elem::I64, 4, 2, 0), Error);
}

}  // namespace
}  // namespace npusim::cpu
