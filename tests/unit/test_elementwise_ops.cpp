#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "npusim/op_registry.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

DType result_dtype(const std::string& op_type, const std::vector<Tensor>& inputs, Attrs attrs = make_attrs()) {
  return run_op(op_type, inputs, std::move(attrs)).meta().dtype;
}

}  // namespace

TEST(ElementwiseSpellings, MapAtenSpellingsToCanonicalOps) {
  const std::pair<const char*, const char*> table[] = {
      {"aten.add.Tensor", "add"},
      {"aten.add_.Tensor", "add"},
      {"aten.add.Scalar", "add"},
      {"aten.sub.Tensor", "sub"},
      {"aten.sub_.Tensor", "sub"},
      {"aten.sub.Scalar", "sub"},
      {"aten.rsub.Scalar", "rsub"},
      {"aten.rsub.Tensor", "rsub"},
      {"aten.mul.Tensor", "mul"},
      {"aten.mul_.Tensor", "mul"},
      {"aten.mul.Scalar", "mul"},
      {"aten.div.Tensor", "div"},
      {"aten.div_.Tensor", "div"},
      {"aten.div.Scalar", "div"},
      {"aten.div.Tensor_mode", "div"},
      {"aten.floor_divide.default", "div"},
      {"aten.remainder.Tensor", "remainder"},
      {"aten.fmod.Scalar", "fmod"},
      {"aten.pow.Tensor_Scalar", "pow"},
      {"aten.pow.Tensor_Tensor", "pow"},
      {"aten.pow.Scalar", "pow"},
      {"aten.maximum.default", "maximum"},
      {"aten.minimum.default", "minimum"},
      {"aten.neg.default", "neg"},
      {"aten.abs.default", "abs"},
      {"aten.exp.default", "exp"},
      {"aten.log.default", "log"},
      {"aten.sqrt.default", "sqrt"},
      {"aten.rsqrt.default", "rsqrt"},
      {"aten.reciprocal.default", "reciprocal"},
      {"aten.sin.default", "sin"},
      {"aten.cos.default", "cos"},
      {"aten.tanh.default", "tanh"},
      {"aten.sigmoid.default", "sigmoid"},
      {"aten.erf.default", "erf"},
      {"aten.relu.default", "relu"},
      {"aten.relu_.default", "relu"},
      {"aten.relu6.default", "hardtanh"},
      {"aten.hardtanh.default", "hardtanh"},
      {"aten.hardtanh_.default", "hardtanh"},
      {"aten.gelu.default", "gelu"},
      {"aten.silu.default", "silu"},
      {"aten.silu_.default", "silu"},
      {"aten.hardswish.default", "hardswish"},
      {"aten.hardswish_.default", "hardswish"},
      {"aten.hardsigmoid.default", "hardsigmoid"},
      {"aten.hardsigmoid_.default", "hardsigmoid"},
      {"aten.leaky_relu.default", "leaky_relu"},
      {"aten.elu.default", "elu"},
      {"aten.softplus.default", "softplus"},
      {"aten.mish.default", "mish"},
      {"aten.clamp.default", "clamp"},
      {"aten.clamp.Tensor", "clamp"},
      {"aten.clamp_min.default", "clamp"},
      {"aten.clamp_max.default", "clamp"},
      {"aten.sign.default", "sign"},
      {"aten.floor.default", "floor"},
      {"aten.ceil.default", "ceil"},
      {"aten.round.default", "round"},
      {"aten.logical_not.default", "logical_not"},
      {"aten.bitwise_not.default", "bitwise_not"},
      {"aten.eq.Tensor", "eq"},
      {"aten.eq.Scalar", "eq"},
      {"aten.ne.Scalar", "ne"},
      {"aten.lt.Tensor", "lt"},
      {"aten.le.Tensor", "le"},
      {"aten.gt.Scalar", "gt"},
      {"aten.ge.Scalar", "ge"},
      {"aten.logical_and.default", "logical_and"},
      {"aten.logical_or.default", "logical_or"},
      {"aten.logical_xor.default", "logical_xor"},
      {"aten.bitwise_and.Tensor", "bitwise_and"},
      {"aten.bitwise_or.Tensor", "bitwise_or"},
      {"aten.__and__.Tensor", "bitwise_and"},
      {"aten.__or__.Tensor", "bitwise_or"},
      {"aten.where.self", "where"},
      {"aten.where.ScalarOther", "where"},
      {"aten.where.ScalarSelf", "where"},
      {"aten.where.Scalar", "where"},
      {"aten.masked_fill.Scalar", "masked_fill"},
      {"aten.masked_fill.Tensor", "masked_fill"},
  };
  for (const auto& [op_type, canonical] : table) {
    const auto [def, spelling] = OpRegistry::instance().find_spelling(op_type);
    ASSERT_NE(def, nullptr) << op_type;
    EXPECT_EQ(def->name, canonical) << op_type;
    EXPECT_EQ(spelling->op_type, op_type);
  }
}

TEST(ElementwiseAdd, BroadcastsTwoTensors) {
  // [2,1,3] + [4,1] -> [2,4,3]: out[i][j][k] = a[i][0][k] + b[j][0].
  const auto r = run_op("aten.add.Tensor", {floats({2, 1, 3}, {0, 1, 2, 3, 4, 5}), floats({4, 1}, {10, 20, 30, 40})});
  EXPECT_EQ(r.canonical, "add");
  EXPECT_EQ(r.meta(), meta({2, 4, 3}, DType::Float32));
  std::vector<double> expected;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k) expected.push_back(3 * i + k + 10 * (j + 1));
  expect_floats(r.out(), expected);
}

TEST(ElementwiseAdd, ScalarOtherAndAlpha) {
  expect_floats(run_op("aten.add.Tensor", {floats({3}, {1, 2, 3})}, make_attrs({{"other", 1e-6}})).out(),
                {1.000001, 2.000001, 3.000001});
  expect_floats(
      run_op("aten.add.Tensor", {floats({3}, {1, 2, 3}), floats({3}, {4, 5, 6})}, make_attrs({{"alpha", 2.0}})).out(),
      {9, 12, 15});
  expect_floats(run_op("aten.add.Scalar", {floats({2}, {1, 2})}, make_attrs({{"other", int64_t{3}}})).out(), {4, 5});
  expect_floats(run_op("aten.add_.Tensor", {floats({2, 2}, {1, 2, 3, 4}), floats({2}, {10, 20})}).out(),
                {11, 22, 13, 24});
}

TEST(ElementwiseAdd, Int64StaysExact) {
  const int64_t big = (int64_t{1} << 53) + 1;  // not representable in a double
  const auto r = run_op("aten.add.Tensor", {ints({3}, {0, big, -big})}, make_attrs({{"other", int64_t{0}}}));
  EXPECT_EQ(r.meta(), meta({3}, DType::Int64));
  expect_ints(r.out(), {0, big, -big});
  expect_ints(
      run_op("aten.add.Tensor", {ints({2}, {big, 5}), ints({2}, {1, -7})}, make_attrs({{"alpha", int64_t{3}}})).out(),
      {big + 3, -16});
  // int64 max + 1 wraps like PyTorch.
  expect_ints(
      run_op("aten.add.Tensor", {ints({1}, {std::numeric_limits<int64_t>::max()})}, make_attrs({{"other", int64_t{1}}}))
          .out(),
      {std::numeric_limits<int64_t>::min()});
}

TEST(ElementwiseAdd, RejectsFloatAlphaForIntegers) {
  EXPECT_THROW(run_op("aten.add.Tensor", {ints({2}, {1, 2}), ints({2}, {1, 2})}, make_attrs({{"alpha", 0.5}})), Error);
}

TEST(ElementwiseAdd, RejectsShapesThatDoNotBroadcast) {
  EXPECT_THROW(run_op("aten.add.Tensor", {floats({2, 3}, {0, 0, 0, 0, 0, 0}), floats({2}, {0, 0})}), Error);
  EXPECT_THROW(run_op("aten.mul.Tensor", {floats({4}, {0, 0, 0, 0}), floats({3, 1}, {0, 0, 0}), floats({1}, {0})}),
               Error);
}

TEST(ElementwiseAdd, RejectsMissingScalarAndBadAttrTypes) {
  EXPECT_THROW(run_op("aten.add.Tensor", {floats({2}, {1, 2})}), Error);
  EXPECT_THROW(run_op("aten.add.Tensor", {floats({2}, {1, 2})}, make_attrs({{"other", std::string("x")}})), Error);
  EXPECT_THROW(
      run_op("aten.add.Tensor", {floats({2}, {1, 2})}, make_attrs({{"other", 1.0}, {"alpha", std::string("a")}})),
      Error);
}

TEST(ElementwiseAdd, EmptyTensors) {
  const auto r = run_op("aten.add.Tensor", {floats({0, 3}, {}), floats({3}, {1, 2, 3})});
  EXPECT_EQ(r.meta(), meta({0, 3}, DType::Float32));
  EXPECT_EQ(r.out().numel(), 0);
  EXPECT_EQ(run_op("aten.exp.default", {floats({2, 0}, {})}).meta(), meta({2, 0}, DType::Float32));
}

TEST(ElementwisePromotion, FollowsPyTorchResultType) {
  const Tensor i32 = ints({2}, {1, 2}, DType::Int32);
  const Tensor f16 = floats({2}, {1, 2}, DType::Float16);
  const Tensor bf16 = floats({2}, {1, 2}, DType::BFloat16);
  const Tensor b = bools({2}, {1, 0});
  // Scalars keep the tensor's dtype within a category and only lift its category.
  EXPECT_EQ(result_dtype("aten.add.Tensor", {i32}, make_attrs({{"other", int64_t{1}}})), DType::Int32);
  EXPECT_EQ(result_dtype("aten.add.Tensor", {i32}, make_attrs({{"other", 0.5}})), DType::Float32);
  EXPECT_EQ(result_dtype("aten.mul.Tensor", {f16}, make_attrs({{"other", 0.5}})), DType::Float16);
  EXPECT_EQ(result_dtype("aten.add.Tensor", {b}, make_attrs({{"other", true}})), DType::Bool);
  EXPECT_EQ(result_dtype("aten.add.Tensor", {b}, make_attrs({{"other", int64_t{2}}})), DType::Int64);
  // 0-d tensors behave like scalars against tensors with dims.
  EXPECT_EQ(result_dtype("aten.add.Tensor", {f16, floats({}, {1})}), DType::Float16);
  EXPECT_EQ(result_dtype("aten.add.Tensor", {ints({2}, {1, 2}), floats({}, {1})}), DType::Float32);
  EXPECT_EQ(result_dtype("aten.add.Tensor", {floats({}, {1}, DType::Float16), floats({}, {1})}), DType::Float32);
  // Tensor pairs.
  EXPECT_EQ(result_dtype("aten.add.Tensor", {bf16, f16}), DType::Float32);
  EXPECT_EQ(result_dtype("aten.add.Tensor", {ints({1}, {1}, DType::UInt8), ints({1}, {1}, DType::Int8)}), DType::Int16);
  EXPECT_EQ(result_dtype("aten.mul.Tensor", {i32, f16}), DType::Float16);
  EXPECT_EQ(result_dtype("aten.add.Tensor", {b, i32}), DType::Int32);
}

TEST(ElementwiseAdd, ZeroDimOperands) {
  const auto r = run_op("aten.add.Tensor", {floats({}, {2}), floats({}, {0.5})});
  EXPECT_EQ(r.meta(), meta({}, DType::Float32));
  expect_floats(r.out(), {2.5});
  expect_floats(run_op("aten.mul.Tensor", {floats({2}, {1, 2}), floats({}, {3})}).out(), {3, 6});
}

TEST(ElementwiseSub, TensorScalarAndReverse) {
  expect_floats(
      run_op("aten.sub.Tensor", {floats({3}, {5, 6, 7}), floats({1}, {1})}, make_attrs({{"alpha", 2.0}})).out(),
      {3, 4, 5});
  expect_floats(run_op("aten.sub.Tensor", {floats({2}, {1, 2})}, make_attrs({{"other", 0.5}})).out(), {0.5, 1.5});
  expect_ints(run_op("aten.sub_.Tensor", {ints({2}, {1, 2}), ints({2}, {10, 20})}).out(), {-9, -18});
  // rsub(self, other, alpha) = other - alpha * self.
  const auto r =
      run_op("aten.rsub.Scalar", {ints({2}, {1, 2})}, make_attrs({{"other", int64_t{10}}, {"alpha", int64_t{2}}}));
  EXPECT_EQ(r.canonical, "rsub");
  expect_ints(r.out(), {8, 6});
  expect_floats(run_op("aten.rsub.Tensor", {floats({2}, {1, 2}), floats({2}, {5, 5})}).out(), {4, 3});
  expect_floats(run_op("aten.rsub.Scalar", {floats({2}, {0.25, 1})}, make_attrs({{"other", 1.0}})).out(), {0.75, 0});
}

TEST(ElementwiseSub, RejectsBoolOperands) {
  EXPECT_THROW(run_op("aten.sub.Tensor", {bools({2}, {1, 0}), bools({2}, {1, 1})}), Error);
}

TEST(ElementwiseMul, ScalarsAndBroadcast) {
  expect_floats(run_op("aten.mul.Tensor", {floats({2}, {3, -4})}, make_attrs({{"other", 0.0883883}})).out(),
                {3 * 0.0883883, -4 * 0.0883883});
  expect_floats(run_op("aten.mul.Scalar", {floats({2}, {3, -4})}, make_attrs({{"other", int64_t{2}}})).out(), {6, -8});
  expect_ints(run_op("aten.mul_.Tensor", {ints({2, 1}, {3, 4}), ints({3}, {1, 2, 3})}).out(), {3, 6, 9, 4, 8, 12});
  // int64 * float scalar turns float32.
  const auto r = run_op("aten.mul.Tensor", {ints({2}, {3, 4})}, make_attrs({{"other", 0.5}}));
  EXPECT_EQ(r.meta().dtype, DType::Float32);
  expect_floats(r.out(), {1.5, 2});
}

TEST(ElementwiseDiv, TrueDivisionOfIntegersGivesFloat) {
  const auto r = run_op("aten.div.Tensor", {ints({3}, {7, -7, 1}), ints({3}, {2, 2, 0})});
  EXPECT_EQ(r.meta(), meta({3}, DType::Float32));
  expect_floats(r.out(), {3.5, -3.5, kInf});
  expect_floats(run_op("aten.div.Tensor", {floats({3}, {1, -1, 0})}, make_attrs({{"other", 0.0}})).out(),
                {kInf, -kInf, kNaN});
  expect_floats(run_op("aten.div.Scalar", {floats({2}, {3, 1})}, make_attrs({{"other", int64_t{4}}})).out(),
                {0.75, 0.25});
}

TEST(ElementwiseDiv, RoundingModes) {
  const Tensor a = ints({4}, {7, -7, 7, -7});
  const Tensor b = ints({4}, {2, 2, -2, -2});
  const auto trunc = run_op("aten.div.Tensor_mode", {a, b}, make_attrs({{"rounding_mode", std::string("trunc")}}));
  EXPECT_EQ(trunc.meta().dtype, DType::Int64);
  expect_ints(trunc.out(), {3, -3, -3, 3});
  expect_ints(run_op("aten.div.Tensor_mode", {a, b}, make_attrs({{"rounding_mode", std::string("floor")}})).out(),
              {3, -4, -4, 3});
  expect_floats(run_op("aten.div.Tensor_mode", {floats({4}, {7, -7, 7, -7}), floats({4}, {2, 2, -2, -2})},
                       make_attrs({{"rounding_mode", std::string("floor")}}))
                    .out(),
                {3, -4, -4, 3});
  expect_floats(run_op("aten.div.Tensor_mode", {floats({2}, {7.5, -7.5})},
                       make_attrs({{"other", 2.0}, {"rounding_mode", std::string("trunc")}}))
                    .out(),
                {3, -3});
  // A null rounding_mode is true division.
  expect_floats(run_op("aten.div.Tensor_mode", {a, b}, make_attrs({{"rounding_mode", NoneValue{}}})).out(),
                {3.5, -3.5, -3.5, 3.5});
  expect_ints(run_op("aten.floor_divide.default", {a, b}).out(), {3, -4, -4, 3});
}

TEST(ElementwiseDiv, RejectsBadRoundingModeAndIntegerDivisionByZero) {
  EXPECT_THROW(run_op("aten.div.Tensor_mode", {floats({1}, {1}), floats({1}, {2})},
                      make_attrs({{"rounding_mode", std::string("ceil")}})),
               Error);
  EXPECT_THROW(run_op("aten.div.Tensor_mode", {ints({1}, {1}), ints({1}, {0})},
                      make_attrs({{"rounding_mode", std::string("trunc")}})),
               Error);
}

TEST(ElementwiseRemainder, FollowsDivisorSignWhileFmodFollowsDividend) {
  expect_ints(run_op("aten.remainder.Tensor", {ints({4}, {-7, 7, 7, -6}), ints({4}, {3, -3, 3, 3})}).out(),
              {2, -2, 1, 0});
  expect_floats(run_op("aten.remainder.Scalar", {floats({3}, {-7, 7, 5.5})}, make_attrs({{"other", 3.0}})).out(),
                {2, 1, 2.5});
  expect_ints(run_op("aten.fmod.Tensor", {ints({2}, {-7, 7}), ints({2}, {3, -3})}).out(), {-1, 1});
  expect_floats(run_op("aten.fmod.Scalar", {floats({2}, {-7.5, 7.5})}, make_attrs({{"other", 2.0}})).out(),
                {-1.5, 1.5});
}

TEST(ElementwisePow, ScalarExponentBaseAndTensors) {
  const auto squared =
      run_op("aten.pow.Tensor_Scalar", {ints({3}, {2, -3, 3037000499})}, make_attrs({{"exponent", int64_t{2}}}));
  EXPECT_EQ(squared.meta().dtype, DType::Int64);
  expect_ints(squared.out(), {4, 9, int64_t{3037000499} * 3037000499});
  const auto root = run_op("aten.pow.Tensor_Scalar", {ints({2}, {4, 9})}, make_attrs({{"exponent", 0.5}}));
  EXPECT_EQ(root.meta().dtype, DType::Float32);
  expect_floats(root.out(), {2, 3});
  expect_floats(run_op("aten.pow.Tensor_Scalar", {floats({3}, {2, -2, 4})}, make_attrs({{"exponent", -1.0}})).out(),
                {0.5, -0.5, 0.25});
  // pow.Scalar: the scalar is the base.
  const auto powers = run_op("aten.pow.Scalar", {ints({3}, {0, 3, 10})}, make_attrs({{"self", int64_t{2}}}));
  EXPECT_EQ(powers.meta().dtype, DType::Int64);
  expect_ints(powers.out(), {1, 8, 1024});
  expect_floats(run_op("aten.pow.Scalar", {floats({2}, {1, 0.5})}, make_attrs({{"self", 4.0}})).out(), {4, 2});
  expect_ints(run_op("aten.pow.Tensor_Tensor", {ints({5}, {2, -1, 1, 0, 3}), ints({5}, {-1, -3, -2, -1, 2})}).out(),
              {0, -1, 1, 0, 9});
  expect_floats(run_op("aten.pow.Tensor_Tensor", {floats({2, 1}, {2, 3}), floats({2}, {2, 3})}).out(), {4, 8, 9, 27});
}

TEST(ElementwisePow, RejectsNegativeIntegerExponentForIntegers) {
  EXPECT_THROW(run_op("aten.pow.Tensor_Scalar", {ints({1}, {2})}, make_attrs({{"exponent", int64_t{-1}}})), Error);
  EXPECT_THROW(run_op("aten.pow.Tensor_Scalar", {floats({1}, {2})}), Error);
}

TEST(ElementwiseMaximum, PropagatesNaN) {
  expect_floats(run_op("aten.maximum.default", {floats({3}, {1, kNaN, 5}), floats({3}, {2, 0, kNaN})}).out(),
                {2, kNaN, kNaN});
  expect_floats(run_op("aten.minimum.default", {floats({3}, {1, kNaN, 5}), floats({1}, {2})}).out(), {1, kNaN, 2});
  expect_ints(run_op("aten.maximum.default", {ints({2}, {-5, 9}), ints({2}, {3, 4})}).out(), {3, 9});
}

TEST(ElementwiseCompare, TensorAndScalarSpellingsGiveBool) {
  const Tensor a = floats({4}, {1, 2, 3, kNaN});
  const auto eq = run_op("aten.eq.Scalar", {a}, make_attrs({{"other", 2.0}}));
  EXPECT_EQ(eq.meta(), meta({4}, DType::Bool));
  expect_bools(eq.out(), {0, 1, 0, 0});
  expect_bools(run_op("aten.ne.Scalar", {a}, make_attrs({{"other", 2.0}})).out(), {1, 0, 1, 1});
  expect_bools(run_op("aten.lt.Scalar", {a}, make_attrs({{"other", int64_t{2}}})).out(), {1, 0, 0, 0});
  expect_bools(run_op("aten.le.Scalar", {a}, make_attrs({{"other", 2.0}})).out(), {1, 1, 0, 0});
  expect_bools(run_op("aten.gt.Tensor", {a, floats({1}, {2})}).out(), {0, 0, 1, 0});
  expect_bools(run_op("aten.ge.Tensor", {a, floats({4}, {0, 2, 4, 0})}).out(), {1, 1, 0, 0});
  // Broadcast int64 [2,1] against float [3].
  const auto le = run_op("aten.le.Tensor", {ints({2, 1}, {1, 2}), floats({3}, {0.5, 1.5, 2})});
  EXPECT_EQ(le.meta(), meta({2, 3}, DType::Bool));
  expect_bools(le.out(), {0, 1, 1, 0, 0, 1});
}

TEST(ElementwiseCompare, Int64ComparesExactly) {
  const int64_t big = int64_t{1} << 53;
  expect_bools(run_op("aten.gt.Scalar", {ints({2}, {big + 1, big})}, make_attrs({{"other", big}})).out(), {1, 0});
  expect_bools(run_op("aten.eq.Tensor", {ints({2}, {big + 1, big}), ints({2}, {big, big})}).out(), {0, 1});
}

TEST(ElementwiseLogical, AndOrXorOnBoolIntAndFloat) {
  const Tensor a = bools({4}, {0, 0, 1, 1});
  const Tensor b = bools({4}, {0, 1, 0, 1});
  expect_bools(run_op("aten.logical_and.default", {a, b}).out(), {0, 0, 0, 1});
  expect_bools(run_op("aten.logical_or.default", {a, b}).out(), {0, 1, 1, 1});
  expect_bools(run_op("aten.logical_xor.default", {a, b}).out(), {0, 1, 1, 0});
  const auto mixed = run_op("aten.logical_and.default", {floats({3}, {0, 0.5, kNaN}), ints({3}, {3, 3, 3})});
  EXPECT_EQ(mixed.meta().dtype, DType::Bool);
  expect_bools(mixed.out(), {0, 1, 1});
  expect_bools(run_op("aten.logical_not.default", {floats({3}, {0, -2, kNaN})}).out(), {1, 0, 0});
}

TEST(ElementwiseBitwise, AndOrOnBoolAndInt) {
  const auto both = run_op("aten.__and__.Tensor", {bools({2, 1}, {1, 0}), bools({2}, {1, 0})});
  EXPECT_EQ(both.meta(), meta({2, 2}, DType::Bool));
  expect_bools(both.out(), {1, 0, 0, 0});
  expect_bools(run_op("aten.__or__.Tensor", {bools({3}, {1, 0, 0}), bools({3}, {0, 0, 1})}).out(), {1, 0, 1});
  expect_ints(run_op("aten.bitwise_and.Tensor", {ints({2}, {12, -1}), ints({2}, {10, 6})}).out(), {8, 6});
  expect_ints(run_op("aten.bitwise_or.Scalar", {ints({2}, {12, 1})}, make_attrs({{"other", int64_t{3}}})).out(),
              {15, 3});
  expect_ints(run_op("aten.bitwise_xor.Tensor", {ints({2}, {12, 5}), ints({2}, {10, 5})}).out(), {6, 0});
  expect_bools(run_op("aten.bitwise_not.default", {bools({2}, {1, 0})}).out(), {0, 1});
  expect_ints(run_op("aten.bitwise_not.default", {ints({2}, {0, 5})}).out(), {-1, -6});
  EXPECT_THROW(run_op("aten.bitwise_and.Tensor", {floats({1}, {1}), floats({1}, {1})}), Error);
  EXPECT_THROW(run_op("aten.bitwise_not.default", {floats({1}, {1})}), Error);
}

TEST(ElementwiseUnary, MathFunctions) {
  const Tensor x = floats({4}, {-1, 0, 1, 2});
  const auto exp = run_op("aten.exp.default", {x});
  EXPECT_EQ(exp.meta(), meta({4}, DType::Float32));
  expect_floats(exp.out(), {std::exp(-1.0), 1, std::exp(1.0), std::exp(2.0)});
  expect_floats(run_op("aten.log.default", {floats({4}, {1, std::numbers::e_v<float>, 0, -1})}).out(),
                {0, 1, -kInf, kNaN});
  expect_floats(run_op("aten.sqrt.default", {floats({3}, {4, 2, -1})}).out(), {2, std::sqrt(2.0), kNaN});
  expect_floats(run_op("aten.rsqrt.default", {floats({3}, {4, 0.25, 0})}).out(), {0.5, 2, kInf});
  expect_floats(run_op("aten.reciprocal.default", {floats({3}, {4, -0.5, 0})}).out(), {0.25, -2, kInf});
  expect_floats(run_op("aten.sin.default", {x}).out(), {std::sin(-1.0), 0, std::sin(1.0), std::sin(2.0)});
  expect_floats(run_op("aten.cos.default", {x}).out(), {std::cos(-1.0), 1, std::cos(1.0), std::cos(2.0)});
  expect_floats(run_op("aten.tanh.default", {x}).out(), {std::tanh(-1.0), 0, std::tanh(1.0), std::tanh(2.0)});
  expect_floats(run_op("aten.sigmoid.default", {x}).out(),
                {1 / (1 + std::exp(1.0)), 0.5, 1 / (1 + std::exp(-1.0)), 1 / (1 + std::exp(-2.0))});
  expect_floats(run_op("aten.erf.default", {x}).out(), {std::erf(-1.0), 0, std::erf(1.0), std::erf(2.0)});
  // Integer inputs of float functions give float32.
  const auto from_int = run_op("aten.exp_.default", {ints({2}, {0, 1})});
  EXPECT_EQ(from_int.meta().dtype, DType::Float32);
  expect_floats(from_int.out(), {1, std::exp(1.0)});
  EXPECT_EQ(run_op("aten.rsqrt.default", {floats({1}, {4}, DType::BFloat16)}).meta().dtype, DType::BFloat16);
}

TEST(ElementwiseUnary, SignAndRounding) {
  const auto neg = run_op("aten.neg.default", {ints({3}, {5, -(int64_t{1} << 60), 0})});
  EXPECT_EQ(neg.meta().dtype, DType::Int64);
  expect_ints(neg.out(), {-5, int64_t{1} << 60, 0});
  expect_floats(run_op("aten.neg.default", {floats({2}, {1.5, -2})}).out(), {-1.5, 2});
  EXPECT_THROW(run_op("aten.neg.default", {bools({1}, {1})}), Error);
  expect_ints(run_op("aten.abs.default", {ints({2}, {-3, 4})}).out(), {3, 4});
  expect_floats(run_op("aten.abs.default", {floats({2}, {-3.5, 4})}).out(), {3.5, 4});
  expect_floats(run_op("aten.sign.default", {floats({4}, {-2, 0, 3, kNaN})}).out(), {-1, 0, 1, 0});
  expect_ints(run_op("aten.sign.default", {ints({3}, {-9, 0, 9})}).out(), {-1, 0, 1});
  const Tensor x = floats({6}, {0.5, 1.5, 2.5, -0.5, -1.7, 2.2});
  expect_floats(run_op("aten.round.default", {x}).out(), {0, 2, 2, -0.0, -2, 2});  // halves go to even
  expect_floats(run_op("aten.floor.default", {x}).out(), {0, 1, 2, -1, -2, 2});
  expect_floats(run_op("aten.ceil.default", {x}).out(), {1, 2, 3, -0.0, -1, 3});
  expect_floats(
      run_op("aten.round.decimals", {floats({3}, {1.2345f, 2.675f, 1250})}, make_attrs({{"decimals", int64_t{2}}}))
          .out(),
      {1.23, 2.68, 1250});
  expect_floats(
      run_op("aten.round.decimals", {floats({2}, {1250, 1351})}, make_attrs({{"decimals", int64_t{-2}}})).out(),
      {1200, 1400});
  expect_ints(run_op("aten.floor.default", {ints({2}, {-3, 3})}).out(), {-3, 3});
}

TEST(ElementwiseActivation, ReluFamily) {
  const Tensor x = floats({5}, {-4, -1, 0, 1, 7});
  expect_floats(run_op("aten.relu.default", {x}).out(), {0, 0, 0, 1, 7});
  expect_floats(run_op("aten.relu_.default", {floats({2}, {kNaN, -1})}).out(), {kNaN, 0});
  expect_ints(run_op("aten.relu.default", {ints({2}, {-3, 3})}).out(), {0, 3});
  const auto relu6 = run_op("aten.relu6.default", {x});
  EXPECT_EQ(relu6.canonical, "hardtanh");
  expect_floats(relu6.out(), {0, 0, 0, 1, 6});
  expect_floats(run_op("aten.hardtanh.default", {x}).out(), {-1, -1, 0, 1, 1});
  expect_floats(run_op("aten.hardtanh_.default", {x}, make_attrs({{"min_val", -2.0}, {"max_val", int64_t{3}}})).out(),
                {-2, -1, 0, 1, 3});
  expect_floats(run_op("aten.leaky_relu.default", {x}).out(), {-0.04, -0.01, 0, 1, 7});
  expect_floats(run_op("aten.leaky_relu_.default", {x}, make_attrs({{"negative_slope", 0.5}})).out(),
                {-2, -0.5, 0, 1, 7});
  expect_floats(run_op("aten.hardswish.default", {x}).out(), {0, -1.0 / 3, 0, 4.0 / 6, 7});
  expect_floats(run_op("aten.hardsigmoid_.default", {x}).out(), {0, 2.0 / 6, 0.5, 4.0 / 6, 1});
  expect_floats(run_op("aten.elu.default", {x}).out(), {std::expm1(-4.0), std::expm1(-1.0), 0, 1, 7});
  expect_floats(
      run_op("aten.elu.default", {x}, make_attrs({{"alpha", 2.0}, {"scale", 3.0}, {"input_scale", 0.5}})).out(),
      {6 * std::expm1(-2.0), 6 * std::expm1(-0.5), 0, 3, 21});
}

TEST(ElementwiseActivation, SmoothActivations) {
  const Tensor x = floats({4}, {-1, 0, 1, 2});
  const auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  const auto gelu_exact = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
  const auto gelu_tanh = [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
  };
  expect_floats(run_op("aten.gelu.default", {x}).out(), {gelu_exact(-1), 0, gelu_exact(1), gelu_exact(2)});
  expect_floats(run_op("aten.gelu.default", {x}, make_attrs({{"approximate", std::string("tanh")}})).out(),
                {gelu_tanh(-1), 0, gelu_tanh(1), gelu_tanh(2)});
  EXPECT_NEAR(gelu_exact(1), 0.8413447460685429, 1e-12);
  expect_floats(run_op("aten.silu.default", {x}).out(), {-sigmoid(-1), 0, sigmoid(1), 2 * sigmoid(2)});
  expect_floats(run_op("aten.silu_.default", {x}).out(), {-sigmoid(-1), 0, sigmoid(1), 2 * sigmoid(2)});
  expect_floats(run_op("aten.softplus.default", {floats({4}, {-1, 0, 1, 25})}).out(),
                {std::log1p(std::exp(-1.0)), std::log(2.0), std::log1p(std::exp(1.0)), 25});
  // beta 2, threshold 4: 1*2 <= 4 -> log1p(exp(2))/2; 3*2 > 4 -> identity.
  expect_floats(
      run_op("aten.softplus.default", {floats({2}, {1, 3})}, make_attrs({{"beta", 2.0}, {"threshold", 4.0}})).out(),
      {std::log1p(std::exp(2.0)) / 2, 3});
  const auto mish = [](double v) { return v * std::tanh(std::log1p(std::exp(v))); };
  expect_floats(run_op("aten.mish.default", {x}).out(), {mish(-1), 0, mish(1), mish(2)});
  EXPECT_THROW(run_op("aten.gelu.default", {x}, make_attrs({{"approximate", std::string("fast")}})), Error);
}

TEST(ElementwiseClamp, ScalarBoundsEitherMayBeNull) {
  const Tensor x = floats({5}, {-3, -1, 0.5, 2, kNaN});
  expect_floats(run_op("aten.clamp.default", {x}, make_attrs({{"min", -1.0}, {"max", 1.0}})).out(),
                {-1, -1, 0.5, 1, kNaN});
  expect_floats(run_op("aten.clamp.default", {x}, make_attrs({{"min", NoneValue{}}, {"max", 0.0}})).out(),
                {-3, -1, 0, 0, kNaN});
  expect_floats(run_op("aten.clamp_min.default", {x}, make_attrs({{"min", 0.0}})).out(), {0, 0, 0.5, 2, kNaN});
  expect_floats(run_op("aten.clamp_max.default", {x}, make_attrs({{"max", int64_t{-2}}})).out(),
                {-3, -2, -2, -2, kNaN});
  expect_ints(
      run_op("aten.clamp.default", {ints({3}, {-5, 3, 9})}, make_attrs({{"min", int64_t{0}}, {"max", int64_t{5}}}))
          .out(),
      {0, 3, 5});
  const auto promoted = run_op("aten.clamp.default", {ints({3}, {1, 5, 9})}, make_attrs({{"min", 2.5}}));
  EXPECT_EQ(promoted.meta().dtype, DType::Float32);
  expect_floats(promoted.out(), {2.5, 5, 9});
  EXPECT_THROW(run_op("aten.clamp.default", {x}, make_attrs({{"min", NoneValue{}}})), Error);
}

TEST(ElementwiseClamp, TensorBoundsBroadcast) {
  const auto both =
      run_op("aten.clamp.Tensor", {floats({2, 2}, {-5, 5, -5, 5}), floats({2, 1}, {-1, -2}), floats({2}, {1, 2})});
  EXPECT_EQ(both.meta(), meta({2, 2}, DType::Float32));
  expect_floats(both.out(), {-1, 2, -2, 2});
  expect_floats(run_op("aten.clamp_min.Tensor", {floats({3}, {-5, 0, 5}), floats({1}, {1})}).out(), {1, 1, 5});
  expect_floats(run_op("aten.clamp_max.Tensor", {floats({3}, {-5, 0, 5}), floats({1}, {1})}).out(), {-5, 0, 1});
}

TEST(ElementwiseWhere, AllFourSpellings) {
  const Tensor cond = bools({2, 1}, {1, 0});
  const auto self = run_op("aten.where.self", {cond, floats({3}, {1, 2, 3}), floats({2, 3}, {10, 20, 30, 40, 50, 60})});
  EXPECT_EQ(self.meta(), meta({2, 3}, DType::Float32));
  expect_floats(self.out(), {1, 2, 3, 40, 50, 60});
  // The causal mask pattern: bf16 scores with a huge negative fill keep bf16.
  const auto other = run_op("aten.where.ScalarOther", {bools({3}, {1, 0, 1}), floats({3}, {1, 2, 3}, DType::BFloat16)},
                            make_attrs({{"other", -3.3895313892515355e+38}}));
  EXPECT_EQ(other.meta(), meta({3}, DType::BFloat16));
  expect_floats(other.out(), {1, -3.3895313892515355e+38, 3});
  const auto scalar_self = run_op("aten.where.ScalarSelf", {bools({3}, {1, 0, 1}), ints({3}, {4, 5, 6})},
                                  make_attrs({{"self", int64_t{-1}}}));
  EXPECT_EQ(scalar_self.meta().dtype, DType::Int64);
  expect_ints(scalar_self.out(), {-1, 5, -1});
  const auto promoted =
      run_op("aten.where.ScalarSelf", {bools({2}, {1, 0}), ints({2}, {4, 5})}, make_attrs({{"self", 0.5}}));
  EXPECT_EQ(promoted.meta().dtype, DType::Float32);
  expect_floats(promoted.out(), {0.5, 5});
  const auto scalars =
      run_op("aten.where.Scalar", {bools({3}, {1, 0, 0})}, make_attrs({{"self", 1.0}, {"other", 0.0}}));
  EXPECT_EQ(scalars.meta(), meta({3}, DType::Float32));
  expect_floats(scalars.out(), {1, 0, 0});
  const auto int_scalars =
      run_op("aten.where.Scalar", {bools({2}, {0, 1})}, make_attrs({{"self", int64_t{7}}, {"other", int64_t{8}}}));
  EXPECT_EQ(int_scalars.meta().dtype, DType::Int64);
  expect_ints(int_scalars.out(), {8, 7});
}

TEST(ElementwiseWhere, RejectsNonBoolConditionAndMissingOperand) {
  EXPECT_THROW(run_op("aten.where.self", {floats({2}, {1, 0}), floats({2}, {1, 2}), floats({2}, {3, 4})}), Error);
  EXPECT_THROW(run_op("aten.where.ScalarOther", {bools({2}, {1, 0}), floats({2}, {1, 2})}), Error);
  EXPECT_THROW(run_op("aten.where.self", {bools({3}, {1, 0, 1}), floats({2}, {1, 2}), floats({2}, {3, 4})}), Error);
}

TEST(ElementwiseMaskedFill, ScalarAndTensorValues) {
  const auto r = run_op("aten.masked_fill.Scalar", {floats({2, 3}, {1, 2, 3, 4, 5, 6}), bools({3}, {0, 1, 0})},
                        make_attrs({{"value", -kInf * 1.0}}));
  EXPECT_EQ(r.meta(), meta({2, 3}, DType::Float32));
  expect_floats(r.out(), {1, -kInf, 3, 4, -kInf, 6});
  // The fill value takes the tensor's dtype (1.5 truncates for int64).
  const auto truncated =
      run_op("aten.masked_fill.Scalar", {ints({3}, {1, 2, 3}), bools({3}, {1, 0, 1})}, make_attrs({{"value", 1.5}}));
  EXPECT_EQ(truncated.meta().dtype, DType::Int64);
  expect_ints(truncated.out(), {1, 2, 1});
  expect_floats(
      run_op("aten.masked_fill.Tensor", {floats({3}, {1, 2, 3}), bools({3}, {0, 0, 1}), floats({}, {9})}).out(),
      {1, 2, 9});
  // The mask broadcasts the output up.
  EXPECT_EQ(run_op("aten.masked_fill.Scalar", {floats({3}, {1, 2, 3}), bools({2, 3}, {0, 0, 0, 1, 1, 1})},
                   make_attrs({{"value", 0.0}}))
                .meta(),
            meta({2, 3}, DType::Float32));
  EXPECT_THROW(run_op("aten.masked_fill.Tensor", {floats({2}, {1, 2}), bools({2}, {0, 1}), floats({1}, {9})}), Error);
  EXPECT_THROW(
      run_op("aten.masked_fill.Scalar", {floats({2}, {1, 2}), floats({2}, {0, 1})}, make_attrs({{"value", 0.0}})),
      Error);
}
