// bf16 weights in 12 bits (backends/cpu/compact_bf16.h): every value decodes to its own bits, specials included,
// on every implementation and with rows in groups; the encoders agree byte for byte; grouped rows give the products
// of rows in order; products with escapes match the bf16 product; a weight with too many escapes is left as it is.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/compact_bf16.h"
#include "backends/cpu/gemv.h"
#include "core/cpu_features.h"
#include "gemv_isas.h"
#include "npusim/error.h"
#include "random_values.h"

namespace npusim::cpu {
namespace {

class CompactBf16 : public ::testing::Test {
 protected:
  void TearDown() override { force_gemv_isa(std::nullopt); }
};

// Normal-looking weights (scale 0.02, as initialised layers) with a sprinkling of every special: zeros of both
// signs, subnormals, values far below the row's top, the largest finite values, infinities and NaN.
std::vector<uint16_t> weight_bits(int64_t n, int64_t k, uint32_t seed, bool specials) {
  const std::vector<float> values = test::random_floats(n * k, seed, -0.05f, 0.05f);
  std::vector<uint16_t> bits;
  for (float v : values) bits.push_back(float_to_bf16(v));
  if (!specials) return bits;
  const uint16_t kSpecials[] = {0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x2000, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC1};
  for (size_t i = 0; i < bits.size(); i += 37) bits[i] = kSpecials[(i / 37) % std::size(kSpecials)];
  return bits;
}

// Random activations rounded to bf16: their values, and their bits.
std::pair<std::vector<float>, std::vector<uint16_t>> bf16_activations(int64_t count, uint32_t seed) {
  std::vector<float> values = test::random_floats(count, seed);
  std::vector<uint16_t> bits;
  for (float& v : values) {
    bits.push_back(float_to_bf16(v));
    v = bf16_bits_to_float(bits.back());
  }
  return {values, bits};
}

std::vector<uint16_t> decoded(const CompactBf16Weight& w) {
  std::vector<uint16_t> out(static_cast<size_t>(w.n * w.k), 0xDEAD);
  for (int64_t j = 0; j < w.n; ++j) w.decode_row(j, Elem::BF16, reinterpret_cast<std::byte*>(out.data() + j * w.k));
  return out;
}

TEST_F(CompactBf16, EveryValueDecodesToItsOwnBits) {
  for (int64_t k : {0, 1, 7, 63, 64, 65, 130, 1543})
    for (int64_t n : {0, 1, 5, 9})
      for (int64_t interleave : {1, 4})
        for (GemvIsa isa : test::available_gemv_isas()) {
          const std::vector<uint16_t> bits = weight_bits(n, k, static_cast<uint32_t>(n * 101 + k), true);
          force_gemv_isa(isa);
          const auto w = compact_bf16(bits.data(), n, k, nullptr, 1.0, interleave);
          ASSERT_NE(w, nullptr) << "k=" << k;
          const std::string label = "n=" + std::to_string(n) + " k=" + std::to_string(k) + " interleave " +
                                    std::to_string(interleave) + " isa " + std::to_string(static_cast<int>(isa));
          EXPECT_EQ(decoded(*w), bits) << label;
          std::vector<float> floats(static_cast<size_t>(k), 1234.5f);
          for (int64_t j = 0; j < n; ++j) {
            w->decode_row(j, Elem::F32, reinterpret_cast<std::byte*>(floats.data()));
            for (int64_t i = 0; i < k; ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(floats[static_cast<size_t>(i)]),
                        uint32_t{bits[static_cast<size_t>(j * k + i)]} << 16)
                  << label << " at [" << j << ", " << i << "]";
          }
        }
}

// Rows in groups of four: a full group's rows alternate block by block, the last group (one row here) holds its own
// blocks in order, and every block is the block the rows one after another would have.
TEST_F(CompactBf16, InterleavedRowsHoldTheSameBlocksInGroupOrder) {
  const int64_t n = 9, k = 200;  // 4 blocks per row, the last one part full
  const std::vector<uint16_t> bits = weight_bits(n, k, 11, true);
  const auto in_order = compact_bf16(bits.data(), n, k, nullptr, 1.0, 1);
  const auto grouped = compact_bf16(bits.data(), n, k, nullptr, 1.0, 4);
  ASSERT_EQ(grouped->codes.size(), in_order->codes.size());
  const int64_t block = kCompactBlockBytes;
  EXPECT_EQ(grouped->row_offset(0), 0);
  EXPECT_EQ(grouped->row_offset(3), 3 * block);
  EXPECT_EQ(grouped->row_offset(5), (4 * 4 + 1) * block);
  EXPECT_EQ(grouped->row_offset(8), 8 * 4 * block);
  EXPECT_EQ(grouped->block_stride(7), 4 * block);
  EXPECT_EQ(grouped->block_stride(8), block);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t b = 0; b < grouped->blocks(); ++b)
      ASSERT_EQ(std::memcmp(grouped->row_codes(j) + b * grouped->block_stride(j), in_order->row_codes(j) + b * block,
                            static_cast<size_t>(block)),
                0)
          << "row " << j << " block " << b;
  EXPECT_THROW(compact_bf16(bits.data(), n, k, nullptr, 1.0, 0), Error);
}

// Rows in groups give the products of rows one after another, whole and from column ranges that split groups or
// end in the last, smaller one (rows of kGemvLongRow values and more go kGemvLongRowGroup at a time).
TEST_F(CompactBf16, InterleavedRowsGiveTheSameProducts) {
  ThreadPool pool(2);
  for (int64_t k : {100, 4100, 8960}) {
    const int64_t n = 2 * kGemvLongRowGroup + 5;
    std::vector<uint16_t> bits = weight_bits(n, k, static_cast<uint32_t>(k + 3), false);
    for (size_t i = 3; i < bits.size(); i += 97) bits[i] = i % 2 ? uint16_t{0x0003} : uint16_t{0x8000};  // escapes
    const auto [x, x_bf16] = bf16_activations(k, static_cast<uint32_t>(k));
    for (GemvIsa isa : test::available_gemv_isas()) {
      force_gemv_isa(isa);
      const auto in_order = compact_bf16(bits.data(), n, k, nullptr, 1.0, 1);
      std::vector<float> expected(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
      GemvProblem problem{.m = 1, .x = x.data(), .ldx = k, .x_bf16 = x_bf16.data(), .ldy = n};
      problem.weight = {.type = GemvWeightType::CompactBF16, .n = n, .k = k, .compact = in_order.get()};
      problem.y = reinterpret_cast<std::byte*>(expected.data());
      gemv_columns(problem, 0, n);
      for (int64_t interleave : {int64_t{4}, int64_t{kGemvLongRowGroup}}) {
        const auto grouped = compact_bf16(bits.data(), n, k, nullptr, 1.0, interleave);
        problem.weight.compact = grouped.get();
        for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, n}, {1, n - 2}, {2, 11}, {8, n}, {13, n}}) {
          std::vector<float> got(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
          problem.y = reinterpret_cast<std::byte*>(got.data());
          begin == 0 && end == n ? gemv(problem, pool) : gemv_columns(problem, begin, end);
          for (int64_t j = 0; j < n; ++j) {
            const std::string label = "k=" + std::to_string(k) + " interleave " + std::to_string(interleave) + " isa " +
                                      std::to_string(static_cast<int>(isa)) + " columns [" + std::to_string(begin) +
                                      ", " + std::to_string(end) + ") column " + std::to_string(j);
            const float value = got[static_cast<size_t>(j)];
            if (j < begin || j >= end) {
              ASSERT_TRUE(std::isnan(value)) << label;
              continue;
            }
            double magnitude = 0.0;
            for (int64_t t = 0; t < k; ++t)
              magnitude +=
                  std::fabs(x[static_cast<size_t>(t)] * bf16_bits_to_float(bits[static_cast<size_t>(j * k + t)]));
            ASSERT_NEAR(value, expected[static_cast<size_t>(j)], 1e-5 * magnitude + 1e-30) << label;
          }
        }
      }
    }
  }
}

TEST_F(CompactBf16, EncodersAgreeByteForByte) {
  for (int64_t interleave : {1, 4}) {
    const std::vector<uint16_t> bits = weight_bits(9, 1000, 7, true);
    force_gemv_isa(GemvIsa::Portable);
    const auto portable = compact_bf16(bits.data(), 9, 1000, nullptr, 1.0, interleave);
    force_gemv_isa(std::nullopt);
    ThreadPool pool(2);
    const auto vector = compact_bf16(bits.data(), 9, 1000, &pool, 1.0, interleave);
    ASSERT_EQ(portable->codes.size(), vector->codes.size());
    EXPECT_EQ(std::memcmp(portable->codes.data(), vector->codes.data(), portable->codes.size()), 0);
    EXPECT_EQ(portable->top, vector->top);
    EXPECT_EQ(portable->escape_at, vector->escape_at);
    ASSERT_EQ(portable->escapes.size(), vector->escapes.size());
    for (size_t e = 0; e < portable->escapes.size(); ++e) {
      EXPECT_EQ(portable->escapes[e].column, vector->escapes[e].column);
      EXPECT_EQ(std::bit_cast<uint32_t>(portable->escapes[e].value), std::bit_cast<uint32_t>(vector->escapes[e].value));
    }
  }
}

TEST_F(CompactBf16, StoresTwelveBitsPerValue) {
  const std::vector<uint16_t> bits = weight_bits(64, 1536, 3, false);
  const auto w = compact_bf16(bits.data(), 64, 1536);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(static_cast<int64_t>(w->codes.size()), 64 * 1536 * 3 / 2);
  EXPECT_LT(w->stored_bytes(), 64 * 1536 * 2 * 76 / 100);
}

TEST_F(CompactBf16, LeavesWeightsWithManyEscapesAsTheyAre) {
  std::vector<uint16_t> bits = weight_bits(4, 512, 5, false);
  for (size_t i = 0; i < bits.size(); i += 2) bits[i] = 0;  // half the values zero
  EXPECT_EQ(compact_bf16(bits.data(), 4, 512), nullptr);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = i % 300 == 0 ? uint16_t{0} : float_to_bf16(0.01f);
  EXPECT_NE(compact_bf16(bits.data(), 4, 512), nullptr);  // one in 300: kept compact
}

// Rows with escapes (zeros, subnormals, tiny values) against the same product over the plain bf16 weight.
TEST_F(CompactBf16, ProductsWithEscapesMatchTheBf16Product) {
  ThreadPool pool(2);
  for (int64_t k : {64, 100, 1543, 4100}) {
    const int64_t n = 21;
    std::vector<uint16_t> bits = weight_bits(n, k, static_cast<uint32_t>(k), false);
    for (size_t i = 3; i < bits.size(); i += 211) bits[i] = i % 2 ? uint16_t{0x0003} : uint16_t{0x8000};
    bits[5] = 0x1F00;  // far below the row's top
    const auto w = compact_bf16(bits.data(), n, k, nullptr, 1.0);
    ASSERT_NE(w, nullptr);
    ASSERT_GT(w->escapes.size(), 0u);
    for (int64_t m : {1, 3}) {
      const auto [x, x_bf16] = bf16_activations(m * k, static_cast<uint32_t>(m + k));
      for (GemvIsa isa : test::available_gemv_isas()) {
        force_gemv_isa(isa);
        std::vector<float> plain(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
        std::vector<float> compact = plain;
        GemvProblem problem{.m = m, .x = x.data(), .ldx = k, .x_bf16 = m == 1 ? x_bf16.data() : nullptr, .ldy = n};
        problem.weight = {.type = GemvWeightType::BF16, .values = bits.data(), .n = n, .k = k};
        problem.y = reinterpret_cast<std::byte*>(plain.data());
        gemv(problem, pool);
        problem.weight = {.type = GemvWeightType::CompactBF16, .n = n, .k = k, .compact = w.get()};
        problem.y = reinterpret_cast<std::byte*>(compact.data());
        gemv(problem, pool);
        for (int64_t i = 0; i < m * n; ++i) {
          double magnitude = 0.0;
          for (int64_t t = 0; t < k; ++t)
            magnitude += std::fabs(x[static_cast<size_t>(i / n * k + t)] *
                                   bf16_bits_to_float(bits[static_cast<size_t>(i % n * k + t)]));
          ASSERT_NEAR(compact[static_cast<size_t>(i)], plain[static_cast<size_t>(i)], 1e-5 * magnitude + 1e-30)
              << "k=" << k << " m=" << m << " isa " << static_cast<int>(isa) << " at " << i;
        }
      }
    }
  }
}

// Each vector kernel the CPU has, called directly whichever one the GEMV picks here: one row and a group of rows at
// a time, rows in order and interleaved, against a double-precision product of the bf16 values.
TEST_F(CompactBf16, EachVectorKernelMatchesTheProduct) {
  const CpuFeatures& cpu = cpu_features();
  if (!cpu.avx2_fma_f16c()) GTEST_SKIP() << "needs AVX2";
  const bool pairs = cpu.avx512() && cpu.avx512bf16;
  for (int64_t k : {64, 1543, 4100})
    for (int64_t interleave : {int64_t{1}, int64_t{kGemvLongRowGroup}}) {
      const int64_t n = 2 * kGemvLongRowGroup;
      std::vector<uint16_t> bits = weight_bits(n, k, static_cast<uint32_t>(k + interleave), false);
      for (size_t i = 3; i < bits.size(); i += 211) bits[i] = i % 2 ? uint16_t{0x0003} : uint16_t{0x8000};  // escapes
      const auto w = compact_bf16(bits.data(), n, k, nullptr, 1.0, interleave);
      ASSERT_NE(w, nullptr);
      const auto [x, x_bf16] = bf16_activations(k, static_cast<uint32_t>(k));
      const int64_t padded = w->blocks() * kCompactBlock;
      std::vector<float> x_floats(static_cast<size_t>(padded));
      std::vector<uint16_t> x_pairs(static_cast<size_t>(padded));
      order_for_avx2(x.data(), k, x_floats.data());
      order_for_avx512(x_bf16.data(), k, x_pairs.data());
      for (int64_t j = 0; j < n; j += kGemvLongRowGroup) {
        static_assert(kCompactRowsInTurn == kGemvLongRowGroup);
        float one[kGemvLongRowGroup], group[kGemvLongRowGroup], in_turn[kCompactRowsInTurn],
            one_pairs[kGemvLongRowGroup], group_pairs[kGemvLongRowGroup];
        for (int r = 0; r < kGemvLongRowGroup; ++r) {
          float out[1];
          compact_dots_avx2<1>(*w, j + r, x_floats.data(), x.data(), out);
          one[r] = out[0];
          if (pairs) compact_dots_avx512<1>(*w, j + r, x_pairs.data(), x.data(), out);
          one_pairs[r] = pairs ? out[0] : one[r];
        }
        compact_dots_avx2<kGemvLongRowGroup>(*w, j, x_floats.data(), x.data(), group);
        compact_dots_avx2_in_turn(*w, j, x_floats.data(), x.data(), in_turn);
        if (pairs) compact_dots_avx512<kGemvLongRowGroup>(*w, j, x_pairs.data(), x.data(), group_pairs);
        for (int r = 0; r < kGemvLongRowGroup; ++r) {
          double sum = 0.0, magnitude = 0.0;
          for (int64_t t = 0; t < k; ++t) {
            const double term = static_cast<double>(x[static_cast<size_t>(t)]) *
                                bf16_bits_to_float(bits[static_cast<size_t>((j + r) * k + t)]);
            sum += term;
            magnitude += std::fabs(term);
          }
          const std::string label =
              "k=" + std::to_string(k) + " interleave " + std::to_string(interleave) + " row " + std::to_string(j + r);
          ASSERT_NEAR(one[r], sum, 1e-5 * magnitude + 1e-30) << label;
          ASSERT_NEAR(group[r], sum, 1e-5 * magnitude + 1e-30) << label;
          ASSERT_NEAR(in_turn[r], sum, 1e-5 * magnitude + 1e-30) << label;
          if (!pairs) continue;
          ASSERT_NEAR(one_pairs[r], sum, 1e-5 * magnitude + 1e-30) << label;
          ASSERT_NEAR(group_pairs[r], sum, 1e-5 * magnitude + 1e-30) << label;
        }
      }
    }
}

TEST_F(CompactBf16, RejectsAMismatchedView) {
  const std::vector<uint16_t> bits = weight_bits(3, 64, 1, false);
  const auto w = compact_bf16(bits.data(), 3, 64);
  std::vector<float> x(64, 1.0f), y(4);
  GemvProblem problem{.m = 1, .x = x.data(), .ldx = 64, .y = reinterpret_cast<std::byte*>(y.data()), .ldy = 4};
  problem.weight = {.type = GemvWeightType::CompactBF16, .n = 4, .k = 64, .compact = w.get()};
  ThreadPool pool(1);
  EXPECT_THROW(gemv(problem, pool), Error);
  problem.weight.compact = nullptr;
  EXPECT_THROW(gemv(problem, pool), Error);
}

}  // namespace
}  // namespace npusim::cpu
