#include <gtest/gtest.h>

#include <cmath>

#include "npusim/op_registry.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {}  // namespace

TEST(ReductionSpellings, MapAtenSpellingsToCanonicalOps) {
  const std::pair<const char*, const char*> table[] = {
      {"aten.mean.dim", "mean"},
      {"aten.mean.default", "mean"},
      {"aten.sum.dim_IntList", "sum"},
      {"aten.sum.default", "sum"},
      {"aten.amax.default", "amax"},
      {"aten.amin.default", "amin"},
      {"aten.max.default", "amax"},
      {"aten.min.default", "amin"},
      {"aten.max.dim", "max_dim"},
      {"aten.min.dim", "min_dim"},
      {"aten.argmax.default", "argmax"},
      {"aten.argmin.default", "argmin"},
      {"aten.var.correction", "var"},
      {"aten.var.dim", "var"},
      {"aten.std.correction", "std"},
      {"aten.std.dim", "std"},
      {"aten.prod.dim_int", "prod"},
      {"aten.prod.default", "prod"},
      {"aten.softmax.int", "softmax"},
      {"aten._softmax.default", "softmax"},
      {"aten.log_softmax.int", "log_softmax"},
      {"aten._log_softmax.default", "log_softmax"},
      {"aten.cumsum.default", "cumsum"},
      {"aten.logsumexp.default", "logsumexp"},
  };
  for (const auto& [op_type, canonical] : table) {
    const auto [def, spelling] = OpRegistry::instance().find_spelling(op_type);
    ASSERT_NE(def, nullptr) << op_type;
    EXPECT_EQ(def->name, canonical) << op_type;
  }
}

TEST(ReductionMean, LastDimKeepdimAsInRmsNorm) {
  const auto r = run_op("aten.mean.dim", {floats({2, 3}, {1, 2, 6, -1, 0, 4})},
                        make_attrs({{"dim", ints_attr({-1})}, {"keepdim", true}}));
  EXPECT_EQ(r.meta(), meta({2, 1}, DType::Float32));
  expect_floats(r.out(), {3, 1});
}

TEST(ReductionMean, DimListsDefaultsAndDtype) {
  // iota [2,3,4]: element (i,j,k) = 12i + 4j + k.
  const Tensor x = iota({2, 3, 4});
  const auto middle = run_op("aten.mean.dim", {x}, make_attrs({{"dim", ints_attr({0, 2})}}));
  EXPECT_EQ(middle.meta(), meta({3}, DType::Float32));
  expect_floats(middle.out(), {7.5, 11.5, 15.5});  // mean over i,k of 12i + 4j + k = 6 + 4j + 1.5
  const auto kept = run_op("aten.mean.dim", {x}, make_attrs({{"dim", ints_attr({0, -1})}, {"keepdim", true}}));
  EXPECT_EQ(kept.meta(), meta({1, 3, 1}, DType::Float32));
  expect_floats(kept.out(), {7.5, 11.5, 15.5});
  const auto all = run_op("aten.mean.default", {x});
  EXPECT_EQ(all.meta(), meta({}, DType::Float32));
  expect_floats(all.out(), {11.5});
  expect_floats(run_op("aten.mean.dim", {x}, make_attrs({{"dim", ints_attr({})}})).out(), {11.5});
  expect_floats(run_op("aten.mean.dim", {x}, make_attrs({{"dim", NoneValue{}}, {"keepdim", true}})).out(), {11.5});
  const auto bf16 =
      run_op("aten.mean.dim", {floats({2}, {1, 2}, DType::BFloat16)}, make_attrs({{"dim", ints_attr({0})}}));
  EXPECT_EQ(bf16.meta().dtype, DType::BFloat16);
  const auto from_int = run_op("aten.mean.dim", {ints({2, 2}, {1, 2, 4, 4})},
                               make_attrs({{"dim", ints_attr({1})}, {"dtype", std::string("torch.float32")}}));
  EXPECT_EQ(from_int.meta(), meta({2}, DType::Float32));
  expect_floats(from_int.out(), {1.5, 4});
}

TEST(ReductionMean, RejectsIntegersBadAndRepeatedDims) {
  EXPECT_THROW(run_op("aten.mean.dim", {ints({2}, {1, 2})}, make_attrs({{"dim", ints_attr({0})}})), Error);
  EXPECT_THROW(run_op("aten.mean.dim", {iota({2, 3})}, make_attrs({{"dim", ints_attr({2})}})), Error);
  EXPECT_THROW(run_op("aten.mean.dim", {iota({2, 3})}, make_attrs({{"dim", ints_attr({-3})}})), Error);
  EXPECT_THROW(run_op("aten.mean.dim", {iota({2, 3})}, make_attrs({{"dim", ints_attr({1, -1})}})), Error);
  EXPECT_THROW(run_op("aten.mean.dim", {iota({2, 3})}, make_attrs({{"dim", std::string("last")}})), Error);
  EXPECT_THROW(run_op("aten.mean.dim", {iota({2, 3})}, make_attrs({{"dtype", std::string("torch.quux")}})), Error);
}

TEST(ReductionSum, FloatsIntegersAndBools) {
  const Tensor x = iota({2, 3, 4});
  const auto outer = run_op("aten.sum.dim_IntList", {x}, make_attrs({{"dim", ints_attr({0, 2})}}));
  EXPECT_EQ(outer.meta(), meta({3}, DType::Float32));
  expect_floats(outer.out(), {60, 92, 124});  // 8 * (6 + 4j + 1.5)
  expect_floats(run_op("aten.sum.dim_IntList", {x}, make_attrs({{"dim", ints_attr({1})}, {"keepdim", true}})).out(),
                {12, 15, 18, 21, 48, 51, 54, 57});
  expect_floats(run_op("aten.sum.default", {x}).out(), {276});
  const int64_t big = int64_t{1} << 53;
  const auto exact =
      run_op("aten.sum.dim_IntList", {ints({2, 3}, {big, 1, 1, -5, 2, 3})}, make_attrs({{"dim", ints_attr({-1})}}));
  EXPECT_EQ(exact.meta(), meta({2}, DType::Int64));
  expect_ints(exact.out(), {big + 2, 0});
  const auto count = run_op("aten.sum.default", {bools({4}, {1, 0, 1, 1})});
  EXPECT_EQ(count.meta(), meta({}, DType::Int64));
  expect_ints(count.out(), {3});
  const auto as_float =
      run_op("aten.sum.default", {ints({2}, {1, 2})}, make_attrs({{"dtype", std::string("torch.float32")}}));
  EXPECT_EQ(as_float.meta().dtype, DType::Float32);
  expect_floats(as_float.out(), {3});
}

TEST(ReductionSum, EmptyAndZeroDimInputs) {
  const auto over_empty = run_op("aten.sum.dim_IntList", {floats({0, 3}, {})}, make_attrs({{"dim", ints_attr({0})}}));
  EXPECT_EQ(over_empty.meta(), meta({3}, DType::Float32));
  expect_floats(over_empty.out(), {0, 0, 0});
  const auto empty_out = run_op("aten.sum.dim_IntList", {floats({0, 3}, {})}, make_attrs({{"dim", ints_attr({1})}}));
  EXPECT_EQ(empty_out.meta(), meta({0}, DType::Float32));
  expect_floats(run_op("aten.mean.dim", {floats({0, 2}, {})}, make_attrs({{"dim", ints_attr({0})}})).out(),
                {kNaN, kNaN});
  expect_floats(run_op("aten.prod.default", {floats({0}, {})}).out(), {1});
  const auto scalar =
      run_op("aten.sum.dim_IntList", {floats({}, {4})}, make_attrs({{"dim", ints_attr({-1})}, {"keepdim", true}}));
  EXPECT_EQ(scalar.meta(), meta({}, DType::Float32));
  expect_floats(scalar.out(), {4});
}

TEST(ReductionProd, FloatAndExactIntegers) {
  expect_floats(
      run_op("aten.prod.dim_int", {floats({2, 3}, {1, 2, 3, -1, 0.5, 4})}, make_attrs({{"dim", int64_t{1}}})).out(),
      {6, -2});
  const auto exact = run_op("aten.prod.default", {ints({3}, {3037000499, 3037000499, 1})});
  EXPECT_EQ(exact.meta(), meta({}, DType::Int64));
  expect_ints(exact.out(), {int64_t{3037000499} * 3037000499});
  EXPECT_EQ(run_op("aten.prod.dim_int", {iota({2, 3})}, make_attrs({{"dim", int64_t{0}}, {"keepdim", true}})).meta(),
            meta({1, 3}, DType::Float32));
}

TEST(ReductionAmax, AllDimsAndNaN) {
  const Tensor x = floats({2, 3}, {1, 5, -2, 7, kNaN, 0});
  const auto rows = run_op("aten.amax.default", {x}, make_attrs({{"dim", ints_attr({1})}}));
  EXPECT_EQ(rows.meta(), meta({2}, DType::Float32));
  expect_floats(rows.out(), {5, kNaN});
  expect_floats(run_op("aten.amin.default", {x}, make_attrs({{"dim", ints_attr({0})}, {"keepdim", true}})).out(),
                {1, kNaN, -2});
  expect_floats(run_op("aten.amax.default", {floats({2, 2}, {1, 9, -3, 4})}).out(), {9});  // dim=[] is every dim
  const auto full = run_op("aten.max.default", {floats({2, 2}, {1, 9, -3, 4})});
  EXPECT_EQ(full.meta(), meta({}, DType::Float32));
  expect_floats(full.out(), {9});
  expect_floats(run_op("aten.min.default", {floats({2, 2}, {1, 9, -3, 4})}).out(), {-3});
  const int64_t big = int64_t{1} << 60;
  expect_ints(run_op("aten.amax.default", {ints({3}, {big + 1, big, -1})}).out(), {big + 1});
  EXPECT_THROW(run_op("aten.amax.default", {floats({0, 3}, {})}, make_attrs({{"dim", ints_attr({0})}})), Error);
  EXPECT_THROW(run_op("aten.max.default", {floats({0}, {})}), Error);
  EXPECT_EQ(run_op("aten.amax.default", {floats({0, 3}, {})}, make_attrs({{"dim", ints_attr({1})}})).meta(),
            meta({0}, DType::Float32));
}

TEST(ReductionMaxDim, ValuesAndFirstIndices) {
  const Tensor x = floats({2, 3}, {1, 5, 5, 7, -1, 7});
  const auto r = run_op("aten.max.dim", {x}, make_attrs({{"dim", int64_t{1}}}));
  EXPECT_EQ(r.canonical, "max_dim");
  ASSERT_EQ(r.metas.size(), 2u);
  EXPECT_EQ(r.metas[0], meta({2}, DType::Float32));
  EXPECT_EQ(r.metas[1], meta({2}, DType::Int64));
  expect_floats(r.outputs[0], {5, 7});
  expect_ints(r.outputs[1], {1, 0});
  const auto kept = run_op("aten.min.dim", {x}, make_attrs({{"dim", int64_t{-2}}, {"keepdim", true}}));
  EXPECT_EQ(kept.metas[0], meta({1, 3}, DType::Float32));
  EXPECT_EQ(kept.metas[1], meta({1, 3}, DType::Int64));
  expect_floats(kept.outputs[0], {1, -1, 5});
  expect_ints(kept.outputs[1], {0, 1, 0});
  const auto with_nan = run_op("aten.max.dim", {floats({3}, {1, kNaN, 3})}, make_attrs({{"dim", int64_t{0}}}));
  expect_floats(with_nan.outputs[0], {kNaN});
  expect_ints(with_nan.outputs[1], {1});
  const auto integers = run_op("aten.min.dim", {ints({2, 2}, {4, -9, 3, 3})}, make_attrs({{"dim", int64_t{1}}}));
  EXPECT_EQ(integers.metas[0].dtype, DType::Int64);
  expect_ints(integers.outputs[0], {-9, 3});
  expect_ints(integers.outputs[1], {1, 0});
  EXPECT_THROW(run_op("aten.max.dim", {x}, make_attrs({{"dim", int64_t{2}}})), Error);
  EXPECT_THROW(run_op("aten.max.dim", {x}), Error);  // dim is required
  EXPECT_THROW(run_op("aten.max.dim", {floats({2, 0}, {})}, make_attrs({{"dim", int64_t{1}}})), Error);
}

TEST(ReductionArgmax, FlattenedOrAlongDim) {
  const Tensor x = floats({2, 3}, {1, 8, 3, 8, 0, -4});
  const auto flat = run_op("aten.argmax.default", {x});
  EXPECT_EQ(flat.meta(), meta({}, DType::Int64));
  expect_ints(flat.out(), {1});
  const auto flat_kept = run_op("aten.argmin.default", {x}, make_attrs({{"keepdim", true}}));
  EXPECT_EQ(flat_kept.meta(), meta({1, 1}, DType::Int64));
  expect_ints(flat_kept.out(), {5});
  expect_ints(run_op("aten.argmax.default", {x}, make_attrs({{"dim", int64_t{0}}})).out(), {1, 0, 0});
  const auto rows = run_op("aten.argmin.default", {x}, make_attrs({{"dim", int64_t{-1}}, {"keepdim", true}}));
  EXPECT_EQ(rows.meta(), meta({2, 1}, DType::Int64));
  expect_ints(rows.out(), {0, 2});
  expect_ints(run_op("aten.argmax.default", {ints({3}, {(int64_t{1} << 60) + 1, int64_t{1} << 60, 0})}).out(), {0});
  EXPECT_THROW(run_op("aten.argmax.default", {floats({0}, {})}), Error);
}

TEST(ReductionVariance, CorrectionAndUnbiased) {
  // Rows {1,2,4}: mean 7/3, squared deviations sum 14/3. Rows {0,0,3}: mean 1, squares sum 6.
  const Tensor x = floats({2, 3}, {1, 2, 4, 0, 0, 3});
  const auto sample = run_op("aten.var.correction", {x}, make_attrs({{"dim", ints_attr({1})}}));
  EXPECT_EQ(sample.meta(), meta({2}, DType::Float32));
  expect_floats(sample.out(), {7.0 / 3, 3});
  expect_floats(
      run_op("aten.var.correction", {x}, make_attrs({{"dim", ints_attr({1})}, {"correction", int64_t{0}}})).out(),
      {14.0 / 9, 2});
  expect_floats(
      run_op("aten.var.dim", {x}, make_attrs({{"dim", ints_attr({-1})}, {"unbiased", false}, {"keepdim", true}})).out(),
      {14.0 / 9, 2});
  expect_floats(run_op("aten.std.correction", {x}, make_attrs({{"dim", ints_attr({1})}})).out(),
                {std::sqrt(7.0 / 3), std::sqrt(3.0)});
  expect_floats(run_op("aten.std.dim", {x}, make_attrs({{"dim", ints_attr({1})}, {"unbiased", false}})).out(),
                {std::sqrt(14.0 / 9), std::sqrt(2.0)});
  // All six values: sum(x^2) - 6 * mean^2 = 30 - 6 * (5/3)^2 = 40/3 squared deviations over 5.
  expect_floats(run_op("aten.var.default", {x}).out(), {40.0 / 3 / 5});
  expect_floats(run_op("aten.var.correction", {floats({1}, {5})}).out(), {kNaN});  // one sample, correction 1
  EXPECT_THROW(run_op("aten.var.correction", {ints({2}, {1, 2})}), Error);
}

TEST(ReductionSoftmax, RowsDtypeAndNegativeDim) {
  const double e1 = std::exp(1.0), e2 = std::exp(2.0);
  const double denominator = 1 + e1 + e2;
  const Tensor x = floats({2, 3}, {1, 2, 3, 0, 0, 0}, DType::BFloat16);
  const auto r =
      run_op("aten.softmax.int", {x}, make_attrs({{"dim", int64_t{-1}}, {"dtype", std::string("torch.float32")}}));
  EXPECT_EQ(r.meta(), meta({2, 3}, DType::Float32));
  expect_floats(r.out(), {1 / denominator, e1 / denominator, e2 / denominator, 1.0 / 3, 1.0 / 3, 1.0 / 3});
  EXPECT_EQ(run_op("aten.softmax.int", {x}, make_attrs({{"dim", int64_t{1}}})).meta().dtype, DType::BFloat16);
  EXPECT_EQ(
      run_op("aten._softmax.default", {x}, make_attrs({{"dim", int64_t{1}}, {"half_to_float", true}})).meta().dtype,
      DType::Float32);
  // Along dim 0 of [2,2]: columns (0, ln3) and (0, 0).
  expect_floats(
      run_op("aten._softmax.default", {floats({2, 2}, {0, 0, std::log(3.0f), 0})}, make_attrs({{"dim", int64_t{-2}}}))
          .out(),
      {0.25, 0.5, 0.75, 0.5});
}

TEST(ReductionSoftmax, FullyMaskedRowIsNaN) {
  const auto r =
      run_op("aten.softmax.int", {floats({2, 2}, {-kInf, -kInf, 0, -kInf})}, make_attrs({{"dim", int64_t{1}}}));
  expect_floats(r.out(), {kNaN, kNaN, 1, 0});
  expect_floats(run_op("aten.log_softmax.int", {floats({2}, {-kInf, -kInf})}, make_attrs({{"dim", int64_t{0}}})).out(),
                {kNaN, kNaN});
}

TEST(ReductionSoftmax, LogSoftmaxAndErrors) {
  const double log_denominator = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  expect_floats(run_op("aten.log_softmax.int", {floats({3}, {1, 2, 3})}, make_attrs({{"dim", int64_t{0}}})).out(),
                {1 - log_denominator, 2 - log_denominator, 3 - log_denominator});
  expect_floats(run_op("aten._log_softmax.default", {floats({1, 2}, {5, 5})}, make_attrs({{"dim", int64_t{1}}})).out(),
                {-std::log(2.0), -std::log(2.0)});
  EXPECT_EQ(run_op("aten.softmax.int", {floats({0, 4}, {})}, make_attrs({{"dim", int64_t{1}}})).meta(),
            meta({0, 4}, DType::Float32));
  EXPECT_THROW(run_op("aten.softmax.int", {iota({2, 3})}, make_attrs({{"dim", int64_t{2}}})), Error);
  EXPECT_THROW(run_op("aten.softmax.int", {iota({2, 3})}), Error);  // dim is required
  EXPECT_THROW(run_op("aten.softmax.int", {ints({2}, {1, 2})}, make_attrs({{"dim", int64_t{0}}})), Error);
}

TEST(ReductionCumsum, FloatsAndExactIntegers) {
  const auto rows =
      run_op("aten.cumsum.default", {floats({2, 3}, {1, 2, 3, 0.5, -1, 4})}, make_attrs({{"dim", int64_t{-1}}}));
  EXPECT_EQ(rows.meta(), meta({2, 3}, DType::Float32));
  expect_floats(rows.out(), {1, 3, 6, 0.5, -0.5, 3.5});
  expect_floats(run_op("aten.cumsum.default", {floats({2, 2}, {1, 2, 3, 4})}, make_attrs({{"dim", int64_t{0}}})).out(),
                {1, 2, 4, 6});
  const int64_t big = int64_t{1} << 53;
  expect_ints(run_op("aten.cumsum.default", {ints({3}, {big, 1, 1})}, make_attrs({{"dim", int64_t{0}}})).out(),
              {big, big + 1, big + 2});
  const auto from_bool = run_op("aten.cumsum.default", {bools({3}, {1, 1, 0})}, make_attrs({{"dim", int64_t{0}}}));
  EXPECT_EQ(from_bool.meta().dtype, DType::Int64);
  expect_ints(from_bool.out(), {1, 2, 2});
  EXPECT_THROW(run_op("aten.cumsum.default", {iota({2})}, make_attrs({{"dim", int64_t{1}}})), Error);
}

TEST(ReductionLogsumexp, StableAndInfinite) {
  const double expected = 3 + std::log(1 + std::exp(-1.0) + std::exp(-2.0));
  const auto r = run_op("aten.logsumexp.default", {floats({2, 3}, {1, 2, 3, 1000, 1000, -kInf})},
                        make_attrs({{"dim", ints_attr({1})}}));
  EXPECT_EQ(r.meta(), meta({2}, DType::Float32));
  expect_floats(r.out(), {expected, 1000 + std::log(2.0)});
  expect_floats(run_op("aten.logsumexp.default", {floats({2, 2}, {-kInf, -kInf, kInf, 1})},
                       make_attrs({{"dim", ints_attr({-1})}}))
                    .out(),
                {-kInf, kInf});
  const auto from_int =
      run_op("aten.logsumexp.default", {ints({2}, {0, 0})}, make_attrs({{"dim", ints_attr({0})}, {"keepdim", true}}));
  EXPECT_EQ(from_int.meta(), meta({1}, DType::Float32));
  expect_floats(from_int.out(), {std::log(2.0)});
}
