#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"
#include "ops/gemm.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

// Naive product of row-major matrices a [n, k] and b [k, m] in double.
std::vector<float> naive_matmul(const float* a, const float* b, int64_t n, int64_t k, int64_t m) {
  std::vector<float> out(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(a[i * k + p]) * b[p * m + j];
      out[static_cast<size_t>(i * m + j)] = static_cast<float>(sum);
    }
  return out;
}

// ---- the GEMM itself ----

struct GemmCase {
  int64_t m, n, k;
  bool transposed;
};

void check_gemm(const GemmCase& c, float alpha, float beta, int max_threads) {
  const int64_t lda = c.k + 3, ldb = (c.transposed ? c.k : c.n) + 2, ldc = c.n + 5;  // padded rows
  std::vector<float> a(static_cast<size_t>(c.m * lda)), b(static_cast<size_t>((c.transposed ? c.n : c.k) * ldb));
  std::vector<float> out(static_cast<size_t>(c.m * ldc));
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.53f * static_cast<float>(i));
  for (size_t i = 0; i < out.size(); ++i) out[i] = 0.25f * static_cast<float>(i % 11);
  const std::vector<float> before = out;
  ops::gemm_f32({.m = c.m,
                 .n = c.n,
                 .k = c.k,
                 .a = a.data(),
                 .lda = lda,
                 .b = b.data(),
                 .ldb = ldb,
                 .b_transposed = c.transposed,
                 .c = out.data(),
                 .ldc = ldc,
                 .alpha = alpha,
                 .beta = beta,
                 .max_threads = max_threads});
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < c.k; ++p)
        sum += static_cast<double>(a[i * lda + p]) * (c.transposed ? b[j * ldb + p] : b[p * ldb + j]);
      const double expected = alpha * sum + beta * before[i * ldc + j];
      ASSERT_NEAR(out[i * ldc + j], expected, 1e-4 * std::max(1.0, std::abs(expected)))
          << "m=" << c.m << " n=" << c.n << " k=" << c.k << " transposed=" << c.transposed << " at " << i << "," << j;
    }
  // Padding between rows stays untouched.
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < ldc; ++j) ASSERT_EQ(out[i * ldc + j], before[i * ldc + j]);
}

TEST(Gemm, OddSizesMatchNaiveProduct) {
  for (int64_t m : {1, 2, 7, 33, 65})
    for (int64_t n : {1, 3, 7, 33, 65})
      for (int64_t k : {1, 7, 33, 65})
        for (bool transposed : {false, true}) check_gemm({m, n, k, transposed}, 1.0f, 0.0f, 0);
}

TEST(Gemm, LargeBlocksAlphaBetaAndThreads) {
  // Sizes that cross the K, M and N cache blocks, with and without threads.
  for (int threads : {1, 0}) {
    check_gemm({150, 1030, 300, false}, 1.5f, 0.5f, threads);
    check_gemm({151, 70, 513, true}, -0.5f, 1.0f, threads);
    check_gemm({3, 2050, 260, true}, 2.0f, 0.0f, threads);
    check_gemm({300, 5, 129, false}, 1.0f, 2.0f, threads);
  }
}

TEST(Gemm, BetaZeroIgnoresGarbageInC) {
  // B = [I | 0] picks the two columns of A; sizes reach the axpy, dot and blocked paths.
  for (auto [m, n] : {std::pair<int64_t, int64_t>{2, 8}, {12, 2}, {12, 8}}) {
    std::vector<float> a(static_cast<size_t>(m * 2)), b(static_cast<size_t>(2 * n), 0.0f);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i + 1);
    b[0] = 1.0f;
    b[static_cast<size_t>(n + 1)] = 1.0f;
    std::vector<float> c(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
    ops::gemm_f32({.m = m, .n = n, .k = 2, .a = a.data(), .lda = 2, .b = b.data(), .ldb = n, .c = c.data(), .ldc = n});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) EXPECT_EQ(c[i * n + j], j < 2 ? a[i * 2 + j] : 0.0f) << m << "x" << n;
  }
}

TEST(Gemm, EmptyInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  ops::gemm_f32({.m = 2, .n = 3, .k = 0, .lda = 0, .ldb = 3, .c = c.data(), .ldc = 3, .beta = 2.0f});
  EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8, 10, 12}));
  ops::gemm_f32({.m = 2, .n = 3, .k = 0, .lda = 0, .ldb = 3, .c = c.data(), .ldc = 3});
  EXPECT_EQ(c, (std::vector<float>(6, 0.0f)));
}

TEST(Gemm, RowSourceProducesB) {
  // B[p][j] = p - j, produced on demand; the same result as the materialized matrix.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{9, 40, 17}, {2, 40, 17}, {40, 3, 17}, {70, 1100, 270}}) {
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(static_cast<float>(i));
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) b[static_cast<size_t>(p * n + j)] = static_cast<float>(p - j) * 0.01f;
    const ops::GemmRowSource source = [](int64_t p, int64_t col, int64_t count, float* out) {
      for (int64_t j = 0; j < count; ++j) out[j] = static_cast<float>(p - (col + j)) * 0.01f;
    };
    std::vector<float> out(static_cast<size_t>(m * n));
    ops::gemm_f32({.m = m, .n = n, .k = k, .a = a.data(), .lda = k, .b_rows = &source, .c = out.data(), .ldc = n});
    const std::vector<float> expected = naive_matmul(a.data(), b.data(), m, k, n);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-4) << i;
  }
}

TEST(Gemm, BatchOffsetsBroadcastAndGroup) {
  // [2, 1] batch against out batch [2, 3]: repeats along the second dim.
  EXPECT_EQ(ops::batch_offsets({2, 1, 4, 5}, {2, 3}), (std::vector<int64_t>{0, 0, 0, 20, 20, 20}));
  // Missing leading dims broadcast too.
  EXPECT_EQ(ops::batch_offsets({3, 2, 2}, {2, 3}), (std::vector<int64_t>{0, 4, 8, 0, 4, 8}));
  // Four query heads over two key heads.
  EXPECT_EQ(ops::batch_offsets({1, 2, 3, 1}, {1, 4}, 1, 2), (std::vector<int64_t>{0, 0, 3, 3}));
}

// ---- matmul ----

TEST(Matmul, TwoByTwo) {
  const Tensor out = run_op("aten.mm.default", {floats({2, 2}, {1, 2, 3, 4}), floats({2, 2}, {5, 6, 7, 8})}).out();
  expect_values(out, {19, 22, 43, 50});
}

TEST(Matmul, OneDimensionalOperands) {
  const Tensor v = floats({3}, {1, 2, 3});
  const Tensor m = floats({3, 2}, {1, 2, 3, 4, 5, 6});
  const Tensor dot = run_op("aten.matmul.default", {v, floats({3}, {4, 5, 6})}).out();
  EXPECT_EQ(dot.shape(), Shape{});
  expect_values(dot, {32});
  const Tensor vm = run_op("aten.matmul.default", {v, m}).out();
  EXPECT_EQ(vm.shape(), Shape{2});
  expect_values(vm, {22, 28});
  const Tensor mv = run_op("aten.matmul.default", {floats({2, 3}, {1, 2, 3, 4, 5, 6}), v}).out();
  EXPECT_EQ(mv.shape(), Shape{2});
  expect_values(mv, {14, 32});
  // [3] x [2, 3, 2] -> [2, 2]; [2, 2, 3] x [3] -> [2, 2]
  const Tensor batched_b = pattern({2, 3, 2});
  const Tensor vb = run_op("aten.matmul.default", {v, batched_b}).out();
  EXPECT_EQ(vb.shape(), (Shape{2, 2}));
  const float* b = batched_b.data<float>();
  expect_values(vb, {b[0] + 2 * b[2] + 3 * b[4], b[1] + 2 * b[3] + 3 * b[5], b[6] + 2 * b[8] + 3 * b[10],
                     b[7] + 2 * b[9] + 3 * b[11]});
  const Tensor batched_a = pattern({2, 2, 3});
  const Tensor bv = run_op("aten.matmul.default", {batched_a, v}).out();
  EXPECT_EQ(bv.shape(), (Shape{2, 2}));
  const float* a = batched_a.data<float>();
  expect_values(bv, {a[0] + 2 * a[1] + 3 * a[2], a[3] + 2 * a[4] + 3 * a[5], a[6] + 2 * a[7] + 3 * a[8],
                     a[9] + 2 * a[10] + 3 * a[11]});
}

TEST(Matmul, BroadcastsBatchDims) {
  const Tensor a = pattern({2, 1, 3, 4}, 0.1f);
  const Tensor b = pattern({5, 4, 2}, 0.2f);
  const Tensor out = run_op("aten.matmul.default", {a, b}).out();
  ASSERT_EQ(out.shape(), (Shape{2, 5, 3, 2}));
  std::vector<float> expected;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      const std::vector<float> block = naive_matmul(a.data<float>() + i * 12, b.data<float>() + j * 8, 3, 4, 2);
      expected.insert(expected.end(), block.begin(), block.end());
    }
  expect_values(out, expected);
}

TEST(Matmul, SharedRightOperandFoldsBatch) {
  const Tensor a = pattern({3, 7, 33});
  const Tensor b = pattern({33, 65}, 1.0f);
  const Tensor out = run_op("aten.matmul.default", {a, b}).out();
  ASSERT_EQ(out.shape(), (Shape{3, 7, 65}));
  expect_values(out, naive_matmul(a.data<float>(), b.data<float>(), 21, 33, 65), 1e-4f);
}

TEST(Matmul, BmmAndIntegers) {
  const Tensor a = pattern({3, 5, 7});
  const Tensor b = pattern({3, 7, 2}, 2.0f);
  const Tensor out = run_op("aten.bmm.default", {a, b}).out();
  ASSERT_EQ(out.shape(), (Shape{3, 5, 2}));
  std::vector<float> expected;
  for (int64_t i = 0; i < 3; ++i) {
    const std::vector<float> block = naive_matmul(a.data<float>() + i * 35, b.data<float>() + i * 14, 5, 7, 2);
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expect_values(out, expected);

  const Tensor integer = run_op("aten.matmul.default", {ints({2, 2}, {1, 2, 3, 4}), ints({2, 2}, {5, 6, 7, 8})}).out();
  EXPECT_EQ(integer.dtype(), DType::Int64);
  EXPECT_EQ(std::vector<int64_t>(integer.data<int64_t>(), integer.data<int64_t>() + 4),
            (std::vector<int64_t>{19, 22, 43, 50}));
}

TEST(Matmul, EmptyDimensions) {
  const Tensor no_rows = run_op("aten.matmul.default", {pattern({0, 3}), pattern({3, 2})}).out();
  EXPECT_EQ(no_rows.shape(), (Shape{0, 2}));
  const Tensor no_inner = run_op("aten.matmul.default", {pattern({2, 0}), pattern({0, 3})}).out();
  EXPECT_EQ(no_inner.shape(), (Shape{2, 3}));
  expect_values(no_inner, std::vector<float>(6, 0.0f));
}

TEST(Matmul, DtypePromotion) {
  const auto metas = infer_op("aten.matmul.default", {{{2, 3}, DType::BFloat16}, {{3, 4}, DType::Float32}});
  EXPECT_EQ(metas[0].dtype, DType::Float32);
  EXPECT_EQ(metas[0].shape, (Shape{2, 4}));
}

TEST(Matmul, RejectsBadShapes) {
  EXPECT_THROW(infer_op("aten.matmul.default", {{{2, 3}, DType::Float32}, {{4, 2}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("aten.matmul.default", {{{2, 2, 3}, DType::Float32}, {{3, 3, 2}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("aten.matmul.default", {{{}, DType::Float32}, {{3}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("aten.mm.default", {{{2, 3, 1}, DType::Float32}, {{3, 2}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("aten.bmm.default", {{{2, 3, 4}, DType::Float32}, {{3, 4, 2}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("aten.bmm.default", {{{3, 4}, DType::Float32}, {{4, 2}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("aten.matmul.default", {{{2, 2}, DType::Bool}, {{2, 2}, DType::Bool}}), Error);
}

// ---- linear ----

TEST(Linear, WithAndWithoutBias) {
  const Tensor x = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor weight = floats({2, 3}, {1, 0, -1, 0.5, 0.5, 0.5});
  expect_values(run_op("aten.linear.default", {x, weight}).out(), {-2, 3, -2, 7.5});
  expect_values(run_op("aten.linear.default", {x, weight, floats({2}, {10, 20})}).out(), {8, 23, 8, 27.5});
}

TEST(Linear, LeadingDimsAndVectorInput) {
  const Tensor x = pattern({2, 3, 33});
  const Tensor weight = pattern({65, 33}, 3.0f);
  const Tensor bias = pattern({65}, 5.0f);
  const Tensor out = run_op("aten.linear.default", {x, weight, bias}).out();
  ASSERT_EQ(out.shape(), (Shape{2, 3, 65}));
  std::vector<float> weight_t(33 * 65);
  for (int64_t j = 0; j < 65; ++j)
    for (int64_t p = 0; p < 33; ++p) weight_t[p * 65 + j] = weight.data<float>()[j * 33 + p];
  std::vector<float> expected = naive_matmul(x.data<float>(), weight_t.data(), 6, 33, 65);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += bias.data<float>()[i % 65];
  expect_values(out, expected, 1e-4f);

  const Tensor small_weight = pattern({2, 3});
  const Tensor vector_out = run_op("aten.linear.default", {floats({3}, {1, 1, 1}), small_weight}).out();
  ASSERT_EQ(vector_out.shape(), Shape{2});
  const float* w = small_weight.data<float>();
  expect_values(vector_out, {w[0] + w[1] + w[2], w[3] + w[4] + w[5]});
}

TEST(Linear, EmptyFeaturesGiveBias) {
  const Tensor out = run_op("aten.linear.default", {pattern({2, 0}), pattern({3, 0}), floats({3}, {1, 2, 3})}).out();
  ASSERT_EQ(out.shape(), (Shape{2, 3}));
  expect_values(out, {1, 2, 3, 1, 2, 3});
  const Tensor no_bias = run_op("aten.linear.default", {pattern({2, 0}), pattern({3, 0})}).out();
  expect_values(no_bias, std::vector<float>(6, 0.0f));
}

TEST(Linear, RejectsBadShapes) {
  EXPECT_THROW(infer_op("aten.linear.default", {{{2, 3}, DType::Float32}, {{4, 2}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("aten.linear.default", {{{2, 3}, DType::Float32}, {{3}, DType::Float32}}), Error);
  EXPECT_THROW(
      infer_op("aten.linear.default", {{{2, 3}, DType::Float32}, {{4, 3}, DType::Float32}, {{3}, DType::Float32}}),
      Error);
  EXPECT_THROW(infer_op("aten.linear.default", {{{}, DType::Float32}, {{4, 3}, DType::Float32}}), Error);
}

// ---- addmm / baddbmm ----

TEST(Addmm, BetaAlphaAndBroadcastBias) {
  const Tensor bias = floats({2}, {1, -1});
  const Tensor a = floats({2, 2}, {1, 2, 3, 4});
  const Tensor b = floats({2, 2}, {5, 6, 7, 8});
  // 0.5 * bias + 2 * (a . b) = 0.5 * [1, -1] + 2 * [[19, 22], [43, 50]]
  const Tensor out =
      run_op("aten.addmm.default", {bias, a, b}, make_attrs({{"beta", 0.5}, {"alpha", int64_t{2}}})).out();
  expect_values(out, {38.5, 43.5, 86.5, 99.5});
  // Defaults: beta = alpha = 1.
  expect_values(run_op("aten.addmm.default", {bias, a, b}).out(), {20, 21, 44, 49});
  // beta = 0 ignores the bias entirely, NaN included.
  const Tensor nan_bias = floats({1}, {std::numeric_limits<float>::quiet_NaN()});
  expect_values(run_op("aten.addmm.default", {nan_bias, a, b}, make_attrs({{"beta", int64_t{0}}})).out(),
                {19, 22, 43, 50});
}

TEST(Addmm, BaddbmmPerBatch) {
  const Tensor self = floats({1, 1, 2}, {10, 20});
  const Tensor a = floats({2, 1, 2}, {1, 2, 3, 4});
  const Tensor b = floats({2, 2, 2}, {1, 0, 0, 1, 2, 0, 0, 2});
  const Tensor out = run_op("aten.baddbmm.default", {self, a, b}, make_attrs({{"beta", 2.0}, {"alpha", -1.0}})).out();
  ASSERT_EQ(out.shape(), (Shape{2, 1, 2}));
  expect_values(out, {19, 38, 14, 32});
}

TEST(Addmm, RejectsBadShapes) {
  EXPECT_THROW(
      infer_op("aten.addmm.default", {{{3}, DType::Float32}, {{2, 2}, DType::Float32}, {{2, 2}, DType::Float32}}),
      Error);
  EXPECT_THROW(
      infer_op("aten.addmm.default", {{{2}, DType::Float32}, {{2, 2, 2}, DType::Float32}, {{2, 2}, DType::Float32}}),
      Error);
  EXPECT_THROW(infer_op("aten.baddbmm.default",
                        {{{2}, DType::Float32}, {{2, 2, 2}, DType::Float32}, {{3, 2, 2}, DType::Float32}}),
               Error);
}

// ---- t ----

TEST(Transpose, MatrixVectorAndScalar) {
  const Tensor out = run_op("aten.t.default", {floats({2, 3}, {1, 2, 3, 4, 5, 6})}).out();
  ASSERT_EQ(out.shape(), (Shape{3, 2}));
  expect_values(out, {1, 4, 2, 5, 3, 6});
  expect_values(run_op("aten.t.default", {floats({3}, {1, 2, 3})}).out(), {1, 2, 3});
  expect_values(run_op("aten.t.default", {floats({}, {7})}).out(), {7});
  const Tensor integer = run_op("aten.t.default", {ints({1, 2}, {5, 9})}).out();
  EXPECT_EQ(integer.shape(), (Shape{2, 1}));
  EXPECT_EQ(integer.data<int64_t>()[1], 9);
  EXPECT_THROW(infer_op("aten.t.default", {{{2, 3, 4}, DType::Float32}}), Error);
}

TEST(LinalgRegistry, SpellingsAreRegistered) {
  for (const char* op : {"aten.linear.default", "aten.matmul.default", "aten.mm.default", "aten.bmm.default",
                         "aten.addmm.default", "aten.baddbmm.default", "aten.t.default"})
    EXPECT_NE(OpRegistry::instance().find_spelling(op).first, nullptr) << op;
}

}  // namespace
