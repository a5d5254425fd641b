// The ops that fusion passes create: shape inference, attribute checks and reference values computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// ====================================================================================================================
// fused_conv2d

// x = 1..9 in [1, 1, 3, 3]; w = [[1, 0], [0, -1]] gives x[i][j] - x[i+1][j+1] = -4 everywhere.
Tensor conv_x() { return floats({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}); }
Tensor conv_w() { return floats({1, 1, 2, 2}, {1, 0, 0, -1}); }

TEST(FusedConv2d, BiasResidualAndRelu) {
  const Tensor residual = floats({1, 1, 2, 2}, {0, 2, 5, 3});
  const Attrs attrs = make_attrs({{"has_bias", true}, {"has_residual", true}, {"activation", std::string("relu")}});
  // -4 + 1 + residual = -3, -1, 2, 0
  expect_values(run_op("fused_conv2d", {conv_x(), conv_w(), floats({1}, {1}), residual}, attrs).out(), {0, 0, 2, 0});
}

TEST(FusedConv2d, ResidualWithoutActivationOrBias) {
  const Tensor residual = floats({1, 1, 2, 2}, {0, 2, 5, 3});
  expect_values(run_op("fused_conv2d", {conv_x(), conv_w(), residual}, make_attrs({{"has_residual", true}})).out(),
                {-4, -2, 1, -1});
}

TEST(FusedConv2d, ActivationsTakeTheirParameters) {
  const Tensor bias = floats({1}, {5.5});  // outputs 1.5 everywhere
  const Attrs clipped =
      make_attrs({{"has_bias", true}, {"activation", std::string("hardtanh")}, {"min_val", 0.0}, {"max_val", 1.0}});
  expect_values(run_op("fused_conv2d", {conv_x(), conv_w(), bias}, clipped).out(), {1, 1, 1, 1});
  const Attrs leaky = make_attrs({{"activation", std::string("leaky_relu")}, {"negative_slope", 0.5}});  // -4 -> -2
  expect_values(run_op("fused_conv2d", {conv_x(), conv_w()}, leaky).out(), {-2, -2, -2, -2});
  const Attrs smooth = make_attrs({{"has_bias", true}, {"activation", std::string("silu")}});
  expect_values(run_op("fused_conv2d", {conv_x(), conv_w(), bias}, smooth).out(),
                {silu(1.5), silu(1.5), silu(1.5), silu(1.5)});
}

TEST(FusedConv2d, ConvolutionAttributesApply) {
  // 1x1 kernel 2, stride 2: 2 * x at (0,0), (0,2), (2,0), (2,2); then -10 and relu.
  const Attrs attrs =
      make_attrs({{"stride", std::vector<int64_t>{2, 2}}, {"has_bias", true}, {"activation", std::string("relu")}});
  const Tensor out = run_op("fused_conv2d", {conv_x(), floats({1, 1, 1, 1}, {2}), floats({1}, {-10})}, attrs).out();
  EXPECT_EQ(out.shape(), (Shape{1, 1, 2, 2}));
  expect_values(out, {0, 0, 4, 8});
}

TEST(FusedConv2d, RejectsInconsistentInputs) {
  const TensorMeta x{{1, 1, 3, 3}, DType::Float32}, w{{1, 1, 2, 2}, DType::Float32};
  const TensorMeta bias{{1}, DType::Float32};
  EXPECT_THROW(infer_op("fused_conv2d", {x, w}, make_attrs({{"has_bias", true}})), Error);
  EXPECT_THROW(infer_op("fused_conv2d", {x, w, {{1, 1, 3, 3}, DType::Float32}}, make_attrs({{"has_residual", true}})),
               Error);
  EXPECT_THROW(infer_op("fused_conv2d", {x, w}, make_attrs({{"activation", std::string("swish")}})), Error);
  EXPECT_THROW(infer_op("fused_conv2d", {x, w, bias}, make_attrs({{"activation", std::string("relu")}})), Error);
  EXPECT_EQ(infer_op("fused_conv2d", {x, w, bias}, make_attrs({{"has_bias", true}}))[0].shape, (Shape{1, 1, 2, 2}));
}

// ====================================================================================================================
// fused_batch_norm

TEST(FusedBatchNorm, NormalizesThenActivates) {
  // Channel 0: (x - 1) / sqrt(4) * 2 + 0.5 = x - 0.5; channel 1: (x - 0) / sqrt(1) * -1 + 0 = -x.
  const Tensor x = floats({1, 2, 2}, {0, 3, 1, -2});
  const std::vector<Tensor> params = {floats({2}, {2, -1}), floats({2}, {0.5, 0}), floats({2}, {1, 0}),
                                      floats({2}, {4, 1})};
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  const Attrs relu = make_attrs({{"eps", 0.0}, {"activation", std::string("relu")}});
  expect_values(run_op("fused_batch_norm", inputs, relu).out(), {0, 2.5, 0, 2});
  const Attrs leaky = make_attrs({{"eps", 0.0}, {"activation", std::string("leaky_relu")}, {"negative_slope", 0.5}});
  expect_values(run_op("fused_batch_norm", inputs, leaky).out(), {-0.25, 2.5, -0.5, 2});
  expect_values(run_op("fused_batch_norm", inputs, make_attrs({{"eps", 0.0}})).out(), {-0.5, 2.5, -1, 2});
}

TEST(FusedBatchNorm, RejectsUnknownActivationsAndTraining) {
  const TensorMeta x{{1, 2, 3}, DType::Float32}, p{{2}, DType::Float32};
  EXPECT_THROW(infer_op("fused_batch_norm", {x, p, p}, make_attrs({{"activation", std::string("swish")}})), Error);
  EXPECT_THROW(infer_op("fused_batch_norm", {x, p, p}, make_attrs({{"training", true}})), Error);
  EXPECT_THROW(infer_op("fused_batch_norm", {x, {{3}, DType::Float32}, p}, {}), Error);
  EXPECT_EQ(infer_op("fused_batch_norm", {x, p, p}, make_attrs({{"activation", std::string("relu")}}))[0].shape,
            (Shape{1, 2, 3}));
}

// ====================================================================================================================
// add_relu, silu_mul

TEST(AddRelu, BroadcastsThenClamps) {
  const Tensor a = floats({2, 3}, {-1, 2, -3, 4, -5, 6});
  const Tensor b = floats({3}, {1, -3, 2});
  expect_values(run_op("add_relu", {a, b}).out(), {0, 0, 0, 5, 0, 8});
}

TEST(AddRelu, IntegersAndEmptyTensors) {
  const Tensor out = run_op("add_relu", {ints({3}, {-2, 0, 5}), ints({1}, {1})}).out();
  EXPECT_EQ(out.dtype(), DType::Int64);
  expect_values(out, {0, 1, 6});
  EXPECT_EQ(run_op("add_relu", {floats({0, 3}, {}), floats({3}, {1, 2, 3})}).out().shape(), (Shape{0, 3}));
}

TEST(AddRelu, RejectsShapesThatDoNotBroadcast) {
  EXPECT_THROW(infer_op("add_relu", {{{2}, DType::Float32}, {{3}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("add_relu", {{{2}, DType::Float32}}), Error);
}

TEST(SiluMul, GateThroughSiluTimesUp) {
  const Tensor gate = floats({2, 2}, {-2, 0, 1, 3});
  const Tensor up = floats({2}, {2, -1});
  expect_values(run_op("silu_mul", {gate, up}).out(), {2 * silu(-2), 0, 2 * silu(1), -silu(3)});
  const TensorMeta half{{2, 2}, DType::BFloat16};
  EXPECT_EQ(infer_op("silu_mul", {half, half})[0].dtype, DType::BFloat16);
  EXPECT_THROW(infer_op("silu_mul", {{{2, 2}, DType::Float32}, {{3}, DType::Float32}}), Error);
}

// ====================================================================================================================
// rope

TEST(Rope, RotatesHalvesAndBroadcastsOverHeads) {
  // Two heads, one position, four features; rotate_half(x) = (-x3, -x4, x1, x2).
  const Tensor x = floats({1, 2, 1, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor cos = floats({1, 1, 1, 4}, {0.5, 0.25, 0.5, 0.25});
  const Tensor sin = floats({1, 1, 1, 4}, {1, 2, 1, 2});
  expect_values(run_op("rope", {x, cos, sin}).out(), {-2.5, -7.5, 2.5, 5, -4.5, -14.5, 8.5, 14});
}

TEST(Rope, PositionsReadTheirOwnAngles) {
  // One head, two positions, two features: out = (x1 c - x2 s, x2 c + x1 s) per position.
  const Tensor x = floats({1, 2, 2}, {1, 2, 3, 4});
  const Tensor cos = floats({2, 2}, {1, 1, 0, 0});
  const Tensor sin = floats({2, 2}, {0, 0, 1, 1});
  expect_values(run_op("rope", {x, cos, sin}).out(), {1, 2, -4, 3});
}

TEST(Rope, RejectsOddWidthsAndTablesThatDoNotBroadcast) {
  const TensorMeta table{{1, 1, 1, 4}, DType::Float32};
  EXPECT_THROW(infer_op("rope", {{{1, 2, 1, 3}, DType::Float32}, table, table}), Error);
  EXPECT_THROW(infer_op("rope", {{{1, 2, 1, 4}, DType::Float32}, {{1, 1, 2, 4}, DType::Float32}, table}), Error);
  EXPECT_THROW(infer_op("rope", {{{1, 2, 1, 4}, DType::Int64}, table, table}), Error);
  EXPECT_EQ(infer_op("rope", {{{0, 2, 1, 4}, DType::Float32}, table, table})[0].shape, (Shape{0, 2, 1, 4}));
}

// ====================================================================================================================
// attention

// Two query heads sharing one key/value head; keys (1,0), (0,1), (1,1); values 1, 2, 3.
// Head 0 asks (ln 2, 0): scores (ln 2, 0, ln 2), weights (2, 1, 2) / 5. Head 1 asks (0, ln 3): weights (1, 3, 3) / 7.
Tensor attention_q() { return floats({1, 2, 1, 2}, {std::log(2.0f), 0, 0, std::log(3.0f)}); }
Tensor attention_k() { return floats({1, 1, 3, 2}, {1, 0, 0, 1, 1, 1}); }
Tensor attention_v() { return floats({1, 1, 3, 1}, {1, 2, 3}); }

TEST(Attention, GroupedQueryHeadsShareKeys) {
  const Tensor out =
      run_op("attention", {attention_q(), attention_k(), attention_v()}, make_attrs({{"scale", 1.0}})).out();
  EXPECT_EQ(out.shape(), (Shape{1, 2, 1, 1}));
  expect_values(out, {10.0 / 5, 16.0 / 7});
}

TEST(Attention, ScaleMultipliesScores) {
  // Head 1 with scale 2: weights (1, 9, 9) / 19.
  const Tensor out =
      run_op("attention", {attention_q(), attention_k(), attention_v()}, make_attrs({{"scale", 2.0}})).out();
  expect_values(out, {(4 + 2 + 12) / 9.0, (1 + 18 + 27) / 19.0});
}

TEST(Attention, DefaultScaleIsInverseSquareRootOfFeatures) {
  const Tensor q = floats({1, 1, 1, 2}, {0, 2 * std::log(3.0f) * std::sqrt(2.0f)});  // scaled: (0, 2 ln 3)
  const Tensor out = run_op("attention", {q, attention_k(), attention_v()}).out();
  expect_values(out, {(1 + 18 + 27) / 19.0});
}

TEST(Attention, AdditiveAndBoolMasksBroadcast) {
  const Attrs attrs = make_attrs({{"scale", 1.0}, {"has_mask", true}});
  const Tensor additive = floats({3}, {0, -kInf, 0});
  // Head 0: (2, 0, 2) / 4; head 1: (1, 0, 3) / 4.
  expect_values(run_op("attention", {attention_q(), attention_k(), attention_v(), additive}, attrs).out(), {2, 2.5});
  const Tensor keep = bools({1, 1, 1, 3}, {1, 0, 1});
  expect_values(run_op("attention", {attention_q(), attention_k(), attention_v(), keep}, attrs).out(), {2, 2.5});
}

TEST(Attention, CachePositionBoundsTheKeysRead) {
  // Positions 0..1 only, although nothing masks position 2: head 0 (2, 1) / 3, head 1 (1, 3) / 4.
  const Attrs attrs = make_attrs({{"scale", 1.0}, {"has_cache_position", true}});
  expect_values(run_op("attention", {attention_q(), attention_k(), attention_v(), ints({1}, {1})}, attrs).out(),
                {4.0 / 3, 7.0 / 4});
  const Attrs masked = make_attrs({{"scale", 1.0}, {"has_mask", true}, {"has_cache_position", true}});
  const Tensor mask = floats({1, 1, 1, 3}, {0, 0, -kInf});
  expect_values(run_op("attention", {attention_q(), attention_k(), attention_v(), mask, ints({1}, {1})}, masked).out(),
                {4.0 / 3, 7.0 / 4});
  // A position past the cache reads everything.
  expect_values(run_op("attention", {attention_q(), attention_k(), attention_v(), ints({2}, {0, 7})}, attrs).out(),
                {10.0 / 5, 16.0 / 7});
}

TEST(Attention, CausalRowsSeeOnlyEarlierPositions) {
  // Equal scores: row 0 reads value 1, row 1 averages 1 and 3.
  const Tensor zeros = floats({1, 2, 1}, {0, 0});
  const Tensor out =
      run_op("attention", {zeros, zeros, floats({1, 2, 1}, {1, 3})}, make_attrs({{"is_causal", true}})).out();
  EXPECT_EQ(out.shape(), (Shape{1, 2, 1}));
  expect_values(out, {1, 2});
}

TEST(Attention, FullyMaskedRowsGiveNanOrZeros) {
  const Tensor mask = floats({1, 1, 1, 3}, {-kInf, -kInf, -kInf});
  Attrs attrs = make_attrs({{"scale", 1.0}, {"has_mask", true}});
  expect_values(run_op("attention", {attention_q(), attention_k(), attention_v(), mask}, attrs).out(), {NAN, NAN});
  attrs.set("zero_masked_rows", true);
  expect_values(run_op("attention", {attention_q(), attention_k(), attention_v(), mask}, attrs).out(), {0, 0});
}

TEST(Attention, EmptyQueriesAndValuesWiderThanKeys) {
  const Tensor out =
      run_op("attention", {floats({1, 2, 0, 2}, {}), attention_k(), floats({1, 1, 3, 2}, {1, 1, 2, 2, 3, 3})}).out();
  EXPECT_EQ(out.shape(), (Shape{1, 2, 0, 2}));
  const Tensor wide = run_op("attention", {attention_q(), attention_k(), floats({1, 1, 3, 2}, {1, -1, 2, -2, 3, -3})},
                             make_attrs({{"scale", 1.0}}))
                          .out();
  expect_values(wide, {2, -2, 16.0 / 7, -16.0 / 7});
}

TEST(Attention, RejectsInconsistentShapesAndFlags) {
  const TensorMeta q{{1, 3, 1, 2}, DType::Float32}, kv{{1, 2, 4, 2}, DType::Float32};
  EXPECT_THROW(infer_op("attention", {q, kv, kv}), Error);  // 3 query heads over 2 key heads
  const TensorMeta q2{{1, 2, 1, 2}, DType::Float32};
  EXPECT_THROW(infer_op("attention", {q2, {{1, 2, 4, 3}, DType::Float32}, kv}), Error);
  EXPECT_THROW(infer_op("attention", {q2, kv, {{1, 2, 5, 2}, DType::Float32}}), Error);
  EXPECT_THROW(infer_op("attention", {q2, kv, kv, {{1, 1, 1, 4}, DType::Float32}}), Error);  // mask without flag
  EXPECT_THROW(infer_op("attention", {q2, kv, kv}, make_attrs({{"has_mask", true}})), Error);
  EXPECT_THROW(infer_op("attention", {q2, kv, kv, {{1, 1, 1, 5}, DType::Float32}}, make_attrs({{"has_mask", true}})),
               Error);
  EXPECT_THROW(infer_op("attention", {q2, kv, kv, {{1, 1, 1, 4}, DType::Float32}},
                        make_attrs({{"has_mask", true}, {"is_causal", true}})),
               Error);
  EXPECT_THROW(infer_op("attention", {q2, kv, kv, {{1}, DType::Float32}}, make_attrs({{"has_cache_position", true}})),
               Error);
  EXPECT_THROW(infer_op("attention", {{{1, 2}, DType::Float32}, {{1, 2}, DType::Float32}, {{1, 2}, DType::Float32}}),
               Error);
  EXPECT_THROW(infer_op("attention", {q2, {{2, 2, 4, 2}, DType::Float32}, {{2, 2, 4, 2}, DType::Float32}}), Error);
  const auto out = infer_op("attention", {q2, kv, kv, {{1}, DType::Int64}}, make_attrs({{"has_cache_position", true}}));
  EXPECT_EQ(out[0].shape, (Shape{1, 2, 1, 2}));
}

// ====================================================================================================================
// masked_softmax

TEST(MaskedSoftmax, AddsTheMaskThenNormalizesTheLastDim) {
  const Tensor scores = floats({2, 3}, {0, std::log(2.0f), std::log(3.0f), 1, 1, 1});
  const Tensor mask = floats({3}, {0, 0, -kInf});
  expect_values(run_op("masked_softmax", {scores, mask}).out(), {1.0 / 3, 2.0 / 3, 0, 0.5, 0.5, 0});
  expect_values(run_op("masked_softmax", {floats({1, 2}, {0, 0}), floats({2}, {-kInf, -kInf})}).out(), {NAN, NAN});
}

TEST(MaskedSoftmax, DtypeAttributeAndBadShapes) {
  const TensorMeta half{{2, 4}, DType::BFloat16};
  EXPECT_EQ(infer_op("masked_softmax", {half, half})[0].dtype, DType::BFloat16);
  EXPECT_EQ(infer_op("masked_softmax", {half, half}, make_attrs({{"dtype", std::string("torch.float32")}}))[0].dtype,
            DType::Float32);
  EXPECT_THROW(infer_op("masked_softmax", {half, {{3}, DType::BFloat16}}), Error);
  EXPECT_THROW(infer_op("masked_softmax", {half, half}, make_attrs({{"dtype", std::string("torch.int64")}})), Error);
}

// ====================================================================================================================
// elementwise_chain

TEST(ElementwiseChain, AppliesStepsInOrder) {
  const Tensor x = floats({2, 2}, {-1, 0, 0.5, 3});
  const Attrs attrs = make_attrs({{"ops", std::string("mul,add,relu")}, {"scalars", std::vector<double>{2, -1, 0}}});
  expect_values(run_op("elementwise_chain", {x}, attrs).out(), {0, 0, 0, 5});  // relu(2x - 1)
  const Attrs power = make_attrs({{"ops", std::string("pow,neg")}, {"scalars", std::vector<double>{2, 0}}});
  expect_values(run_op("elementwise_chain", {floats({2}, {-3, 2})}, power).out(), {-9, -4});
  const Attrs ratio = make_attrs({{"ops", std::string("div,exp,sub")}, {"scalars", std::vector<double>{2, 0, 1}}});
  expect_values(run_op("elementwise_chain", {floats({2}, {0, 2 * std::log(3.0f)})}, ratio).out(), {0, 2});
  EXPECT_EQ(run_op("elementwise_chain", {floats({0}, {})}, attrs).out().shape(), (Shape{0}));
}

TEST(ElementwiseChain, KeepsTheInputDtype) {
  const Attrs attrs = make_attrs({{"ops", std::string("neg,tanh")}, {"scalars", std::vector<double>{0, 0}}});
  EXPECT_EQ(infer_op("elementwise_chain", {{{3}, DType::BFloat16}}, attrs)[0], (TensorMeta{{3}, DType::BFloat16}));
}

TEST(ElementwiseChain, RejectsUnknownStepsAndMissingScalars) {
  const TensorMeta x{{3}, DType::Float32};
  EXPECT_THROW(infer_op("elementwise_chain", {x},
                        make_attrs({{"ops", std::string("neg,softmax")}, {"scalars", std::vector<double>{0, 0}}})),
               Error);
  EXPECT_THROW(infer_op("elementwise_chain", {x},
                        make_attrs({{"ops", std::string("neg,mul")}, {"scalars", std::vector<double>{0}}})),
               Error);
  EXPECT_THROW(infer_op("elementwise_chain", {x}, make_attrs({{"ops", std::string("neg")}})), Error);
  EXPECT_THROW(
      infer_op("elementwise_chain", {x}, make_attrs({{"ops", std::string("")}, {"scalars", std::vector<double>{0}}})),
      Error);
}

}  // namespace
