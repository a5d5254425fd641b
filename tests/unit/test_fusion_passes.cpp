// The fusion passes: where each fires and where it must not, on small graphs built here and on the fixture
// models, and that a fused graph computes what the unfused one does.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/graph_edit.h"
#include "compiler/pass.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "npusim/op_registry.h"
#include "runtime/compare.h"
#include "runtime/random_fill.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "runtime/weight_transforms.h"
#include "unit/graph_test_util.h"

namespace npusim {
namespace {

const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";
constexpr float kInf = std::numeric_limits<float>::infinity();

// ====================================================================================================================
// Building graphs by hand

using test::GraphBuilder;
using test::make_attrs;

// ====================================================================================================================
// Running and inspecting graphs

size_t count(const Graph& graph, const std::string& op) {
  size_t n = 0;
  for (const Node& node : graph.nodes) n += node.op == op;
  return n;
}

const Node& only(const Graph& graph, const std::string& op) {
  for (const Node& node : graph.nodes)
    if (node.op == op) return node;
  throw std::runtime_error("no " + op + " node");
}

std::string value_name(const Graph& graph, ValueId id) { return graph.value(id).name; }

// Runs the named passes alone, in pipeline order, checking the graph after each.
Graph after(Graph graph, const std::vector<std::string>& passes, compiler::PassContext* log = nullptr) {
  compiler::PassContext context;
  std::vector<compiler::Pass> selected;
  for (const compiler::Pass& pass : compiler::all_passes())
    for (const std::string& name : passes)
      if (name == pass.name) selected.push_back(pass);
  EXPECT_EQ(selected.size(), passes.size());
  compiler::run_pass_list(graph, selected, context);
  if (log) *log = context;
  return graph;
}

Graph after_all(Graph graph, const std::set<std::string>& disabled = {}) {
  compiler::PassContext context;
  compiler::PassOptions options;
  options.disabled = disabled;
  compiler::run_passes(graph, options, context);
  return graph;
}

// Deterministic values in [-2, 2] that differ from element to element and from tensor to tensor.
Tensor pattern(const TensorMeta& meta, double seed) {
  Tensor t(DType::Float32, meta.shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.mutable_data<float>()[i] = static_cast<float>(2.0 * std::sin(0.37 * static_cast<double>(i) + seed));
  return t.to(meta.dtype);
}

using Feeds = std::map<std::string, Tensor>;

// Weights by name: the given tensors, else the patterned values; derived weights from their transforms.
NamedTensors run(const Graph& graph, const Feeds& weights, const Feeds& inputs) {
  std::vector<std::pair<ValueId, Tensor>> bound;
  for (ValueId id : graph.weights) {
    const Value& value = graph.value(id);
    if (value.transform) continue;
    const auto it = weights.find(value.weight_key);
    bound.emplace_back(id, it != weights.end() ? it->second : pattern(value.meta, static_cast<double>(id)));
  }
  add_derived_weights(graph, bound);
  return ReferenceExecutor(graph, bound).run(inputs);
}

// Inputs with patterned values, by name.
Feeds patterned_inputs(const Graph& graph) {
  Feeds feeds;
  double seed = 0.5;
  for (ValueId id : graph.inputs) feeds[graph.value(id).name] = pattern(graph.value(id).meta, seed += 1.0);
  return feeds;
}

// Every output agrees within `tolerance` relative to the output's scale; names and order are kept.
void expect_same_outputs(const NamedTensors& expected, const NamedTensors& actual, double tolerance = 1e-5) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i].first, actual[i].first);
    const Comparison c = compare_tensors(actual[i].second, expected[i].second);
    EXPECT_LE(c.max_abs_diff, tolerance * std::max(1.0, c.max_abs_reference))
        << expected[i].first << ": " << c.summary();
  }
}

void expect_fusion_keeps_outputs(const Graph& unfused, const Graph& fused, const Feeds& inputs,
                                 const Feeds& weights = {}) {
  expect_same_outputs(run(unfused, weights, inputs), run(fused, weights, inputs));
}

// Two graphs with the same nodes, in the same order, reading the same values.
void expect_unchanged(const Graph& before, const Graph& after) {
  ASSERT_EQ(before.nodes.size(), after.nodes.size());
  for (size_t n = 0; n < before.nodes.size(); ++n) {
    EXPECT_EQ(before.nodes[n].op, after.nodes[n].op);
    EXPECT_EQ(before.nodes[n].inputs, after.nodes[n].inputs);
    EXPECT_EQ(before.nodes[n].outputs, after.nodes[n].outputs);
  }
  EXPECT_EQ(before.values.size(), after.values.size());
  EXPECT_EQ(before.outputs, after.outputs);
}

// ====================================================================================================================
// fuse_conv_activation

const std::vector<std::pair<std::string, AttrValue>> kSame3x3 = {{"padding", std::vector<int64_t>{1, 1}}};

TEST(FuseConvActivation, BiasResidualAndActivations) {
  GraphBuilder b;
  const ValueId x = b.input("x", {1, 2, 5, 5});
  const ValueId r = b.input("r", {1, 3, 5, 5});
  const ValueId conv = b.op("conv2d", {x, b.weight("w", {3, 2, 3, 3}), b.weight("b", {3})}, make_attrs(kSame3x3));
  const ValueId y = b.op("relu", {b.op("add", {r, conv})});
  const ValueId conv2 = b.op("conv2d", {y, b.weight("w2", {4, 3, 1, 1})});
  b.output(b.op("hardtanh", {conv2}, make_attrs({{"min_val", 0.0}, {"max_val", 6.0}})));
  compiler::PassContext log;
  const Graph fused = after(b.graph(), {"fuse_conv_activation"}, &log);

  ASSERT_EQ(count(fused, "fused_conv2d"), 2u);
  EXPECT_EQ(fused.nodes.size(), 2u);
  const Node& first = fused.nodes[0];
  EXPECT_EQ(first.inputs, (std::vector<ValueId>{x, b.graph().nodes[0].inputs[1], b.graph().nodes[0].inputs[2], r}));
  EXPECT_TRUE(first.attrs.get_bool("has_bias"));
  EXPECT_TRUE(first.attrs.get_bool("has_residual"));
  EXPECT_EQ(first.attrs.get_string("activation"), "relu");
  EXPECT_EQ(first.attrs.get_ints("padding"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(first.outputs[0], y);
  const Node& second = fused.nodes[1];
  EXPECT_FALSE(second.attrs.get_bool("has_bias"));
  EXPECT_FALSE(second.attrs.get_bool("has_residual"));
  EXPECT_EQ(second.attrs.get_string("activation"), "hardtanh");
  EXPECT_EQ(second.attrs.get_float("max_val"), 6.0);
  EXPECT_EQ(second.outputs[0], b.graph().outputs[0]);
  ASSERT_EQ(log.log.size(), 1u);
  EXPECT_EQ(log.log[0], "fuse_conv_activation: 2 conv2d fused (2 with an activation, 1 with a residual add)");
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseConvActivation, ResidualFromAnotherConvStaysAnInput) {
  // The downsample block: add(conv(a), conv(b)) -> relu; the first conv absorbs the add, the second stays.
  GraphBuilder b;
  const ValueId x = b.input("x", {1, 2, 4, 4});
  const ValueId main = b.op("conv2d", {x, b.weight("w1", {3, 2, 1, 1})});
  const ValueId side = b.op("conv2d", {x, b.weight("w2", {3, 2, 1, 1}), b.weight("b2", {3})});
  b.output(b.op("relu", {b.op("add", {main, side})}));
  const Graph fused = after(b.graph(), {"fuse_conv_activation"});
  EXPECT_EQ(count(fused, "fused_conv2d"), 1u);
  EXPECT_EQ(count(fused, "conv2d"), 1u);
  EXPECT_EQ(fused.nodes.back().op, "fused_conv2d");
  EXPECT_EQ(fused.nodes.back().inputs.back(), side);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseConvActivation, LeavesSharedOrUnfusableConvolutionsAlone) {
  GraphBuilder b;
  const ValueId x = b.input("x", {1, 2, 4, 4});
  const ValueId shared = b.op("conv2d", {x, b.weight("w1", {2, 2, 1, 1})});
  b.output(b.op("relu", {shared}));
  b.output(b.op("neg", {shared}));  // a second reader of the conv output
  const ValueId alone = b.op("conv2d", {x, b.weight("w2", {2, 2, 1, 1})});
  b.output(b.op("add", {alone, b.weight("per_channel", {2, 1, 1})}));  // not a same-shape residual
  const ValueId seen = b.op("conv2d", {x, b.weight("w3", {2, 2, 1, 1})});
  b.output(seen);  // a graph output cannot be absorbed
  b.output(b.op("relu", {seen}));
  b.output(b.op("conv2d", {x, b.weight("w4", {2, 2, 1, 1})}));
  compiler::PassContext log;
  expect_unchanged(b.graph(), after(b.graph(), {"fuse_conv_activation"}, &log));
  EXPECT_TRUE(log.log.empty());
}

// ====================================================================================================================
// fuse_batchnorm_activation

// batch_norm's parameters as weights [channels] (gamma, beta, mean, var), with their values: var positive.
std::vector<ValueId> batch_norm_params(GraphBuilder& b, const std::string& prefix, int64_t channels, Feeds& values) {
  std::vector<ValueId> ids;
  for (const char* part : {"gamma", "beta", "mean", "var"}) {
    const std::string name = prefix + part;
    ids.push_back(b.weight(name, {channels}));
    Tensor t(DType::Float32, {channels});
    for (int64_t c = 0; c < channels; ++c)
      t.mutable_data<float>()[c] = static_cast<float>(name == prefix + "var" ? 0.5 + 0.25 * c : 0.3 * c - 0.4);
    values[name] = t;
  }
  return ids;
}

TEST(FuseBatchnormActivation, ActivationAfterAStandingBatchNormJoinsIt) {
  GraphBuilder b;
  Feeds weights;
  const ValueId x = b.input("x", {1, 3, 4, 4});
  std::vector<ValueId> first{x}, second{b.op("relu", {x})};
  for (ValueId id : batch_norm_params(b, "bn1_", 3, weights)) first.push_back(id);
  for (ValueId id : batch_norm_params(b, "bn2_", 3, weights)) second.push_back(id);
  b.output(b.op("relu", {b.op("batch_norm", first)}));
  b.output(b.op("hardtanh", {b.op("batch_norm", second)}, make_attrs({{"min_val", 0.0}, {"max_val", 0.25}})));
  compiler::PassContext log;
  const Graph fused = after(b.graph(), {"fuse_batchnorm_activation"}, &log);
  ASSERT_EQ(count(fused, "fused_batch_norm"), 2u);
  EXPECT_EQ(count(fused, "batch_norm") + count(fused, "hardtanh"), 0u);
  EXPECT_EQ(count(fused, "relu"), 1u);  // the one before the second batch_norm
  const Node& clipped = fused.nodes.back();
  EXPECT_EQ(clipped.attrs.get_string("activation"), "hardtanh");
  EXPECT_EQ(clipped.attrs.get_float("max_val"), 0.25);
  EXPECT_EQ(clipped.inputs, second);
  EXPECT_EQ(fused.outputs, b.graph().outputs);
  ASSERT_EQ(log.log.size(), 1u);
  EXPECT_EQ(log.log[0], "fuse_batchnorm_activation: 2 batch_norm fused with its activation");
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()), weights);
}

TEST(FuseBatchnormActivation, LeavesReadOrUnactivatedBatchNormsAlone) {
  GraphBuilder b;
  Feeds weights;
  const ValueId x = b.input("x", {1, 2, 3, 3});
  const auto bn = [&](const std::string& prefix) {
    std::vector<ValueId> inputs{x};
    for (ValueId id : batch_norm_params(b, prefix, 2, weights)) inputs.push_back(id);
    return b.op("batch_norm", inputs);
  };
  const ValueId shared = bn("a_");
  b.output(b.op("relu", {shared}));
  b.output(b.op("neg", {shared}));  // a second reader
  const ValueId seen = bn("b_");
  b.output(seen);  // a graph output
  b.output(b.op("relu", {seen}));
  b.output(b.op("exp", {bn("c_")}));  // not an activation a fused op ends with
  expect_unchanged(b.graph(), after(b.graph(), {"fuse_batchnorm_activation"}));
}

// ====================================================================================================================
// fuse_add_relu

TEST(FuseAddRelu, BroadcastingAddThenRelu) {
  GraphBuilder b;
  const ValueId a = b.input("a", {2, 3});
  const ValueId c = b.input("c", {3});
  b.output(b.op("relu", {b.op("add", {a, c})}));
  const Graph fused = after(b.graph(), {"fuse_add_relu"});
  ASSERT_EQ(fused.nodes.size(), 1u);
  EXPECT_EQ(fused.nodes[0].op, "add_relu");
  EXPECT_EQ(fused.nodes[0].inputs, (std::vector<ValueId>{a, c}));
  EXPECT_EQ(fused.outputs, b.graph().outputs);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseAddRelu, NotWhenTheSumIsReadElsewhereOrScaled) {
  GraphBuilder b;
  const ValueId a = b.input("a", {2, 3});
  const ValueId sum = b.op("add", {a, a});
  b.output(b.op("relu", {sum}));
  b.output(b.op("neg", {sum}));
  b.output(b.op("relu", {b.op("add", {a, a}, make_attrs({{"alpha", 2.0}}))}));
  b.output(b.op("relu", {b.scalar_op("add", a, 1.0)}));
  expect_unchanged(b.graph(), after(b.graph(), {"fuse_add_relu"}));
}

// ====================================================================================================================
// fuse_rms_norm

// The Hugging Face RMSNorm: x.to(fp32), pow 2, mean(-1, keepdim), + eps, rsqrt, x * r, .to(dtype), weight * .
ValueId hf_rms_norm(GraphBuilder& b, ValueId x, ValueId weight, bool casts, int64_t mean_dim = -1) {
  const ValueId x32 = casts ? b.op("to", {x}, make_attrs({{"dtype", std::string("torch.float32")}})) : x;
  const ValueId squares = b.scalar_op("pow", x32, 2.0, "exponent");
  const ValueId mean =
      b.op("mean", {squares}, make_attrs({{"dim", std::vector<int64_t>{mean_dim}}, {"keepdim", true}}));
  const ValueId r = b.op("rsqrt", {b.scalar_op("add", mean, 1e-6)});
  ValueId normed = b.op("mul", {x32, r});
  if (casts) normed = b.op("to", {normed}, make_attrs({{"dtype", std::string("torch.bfloat16")}}));
  return weight == kNoValue ? normed : b.op("mul", {weight, normed});
}

TEST(FuseRmsNorm, HuggingFaceChainWithCasts) {
  GraphBuilder b;
  const ValueId x = b.input("x", {2, 3, 8}, DType::BFloat16);
  const ValueId w = b.weight("norm.weight", {8});
  b.output(hf_rms_norm(b, x, w, true));
  const Graph fused = after(b.graph(), {"fuse_rms_norm"});
  ASSERT_EQ(fused.nodes.size(), 1u);
  const Node& norm = fused.nodes[0];
  EXPECT_EQ(norm.op, "rms_norm");
  EXPECT_EQ(norm.inputs, (std::vector<ValueId>{x, w}));
  EXPECT_EQ(norm.attrs.get_ints("normalized_shape"), (std::vector<int64_t>{8}));
  EXPECT_DOUBLE_EQ(norm.attrs.get_float("eps"), 1e-6);
  EXPECT_EQ(norm.outputs, b.graph().outputs);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseRmsNorm, WithoutWeightAndWithAPositiveLastDim) {
  GraphBuilder b;
  const ValueId x = b.input("x", {3, 5});
  b.output(hf_rms_norm(b, x, kNoValue, false, 1));
  const Graph fused = after(b.graph(), {"fuse_rms_norm"});
  ASSERT_EQ(fused.nodes.size(), 1u);
  EXPECT_EQ(fused.nodes[0].op, "rms_norm");
  EXPECT_EQ(fused.nodes[0].inputs, (std::vector<ValueId>{x}));
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseRmsNorm, NotOverAnotherDimOrAnotherTensorOrSharedSteps) {
  GraphBuilder b;
  const ValueId x = b.input("x", {4, 4});
  const ValueId y = b.input("y", {4, 4});
  b.output(hf_rms_norm(b, x, kNoValue, false, 0));  // mean over the first dim
  // The final mul reads y, not the x that was squared.
  const ValueId mean = b.op("mean", {b.scalar_op("pow", x, 2.0, "exponent")},
                            make_attrs({{"dim", std::vector<int64_t>{-1}}, {"keepdim", true}}));
  const ValueId r = b.op("rsqrt", {b.scalar_op("add", mean, 1e-6)});
  b.output(b.op("mul", {y, r}));
  // The reciprocal root is read outside the chain.
  const ValueId mean2 = b.op("mean", {b.scalar_op("pow", x, 2.0, "exponent")},
                             make_attrs({{"dim", std::vector<int64_t>{-1}}, {"keepdim", true}}));
  const ValueId r2 = b.op("rsqrt", {b.scalar_op("add", mean2, 1e-6)});
  b.output(b.op("mul", {x, r2}));
  b.output(r2);
  expect_unchanged(b.graph(), after(b.graph(), {"fuse_rms_norm"}));
}

// ====================================================================================================================
// fuse_silu_mul

TEST(FuseSiluMul, UpComputedAfterTheSilu) {
  GraphBuilder b;
  const ValueId h = b.input("h", {2, 4});
  const ValueId gate = b.op("linear", {h, b.weight("gate", {6, 4})});
  const ValueId activated = b.op("silu", {gate});
  const ValueId up = b.op("linear", {h, b.weight("up", {6, 4})});
  b.output(b.op("mul", {up, activated}));
  const Graph fused = after(b.graph(), {"fuse_silu_mul"});
  ASSERT_EQ(fused.nodes.size(), 3u);
  EXPECT_EQ(fused.nodes[2].op, "silu_mul");
  EXPECT_EQ(fused.nodes[2].inputs, (std::vector<ValueId>{gate, up}));
  EXPECT_EQ(fused.nodes[1].outputs[0], up);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseSiluMul, NotWhenTheActivationIsShared) {
  GraphBuilder b;
  const ValueId g = b.input("g", {4});
  const ValueId activated = b.op("silu", {g});
  b.output(b.op("mul", {activated, b.input("u", {4})}));
  b.output(b.op("neg", {activated}));
  const ValueId squared = b.op("silu", {g});
  b.output(b.op("mul", {squared, squared}));
  expect_unchanged(b.graph(), after(b.graph(), {"fuse_silu_mul"}));
}

// ====================================================================================================================
// fuse_rope

// q * cos + cat(-q[..., D/2:], q[..., :D/2]) * sin, with the operands in the given order.
ValueId hf_rope(GraphBuilder& b, ValueId x, ValueId cos, ValueId sin, int64_t width, bool swapped = false,
                int64_t split = -1) {
  if (split < 0) split = width / 2;
  const ValueId lower = b.op("slice", {x}, make_attrs({{"dim", int64_t{-1}}, {"start", int64_t{0}}, {"end", split}}));
  const ValueId upper = b.op(
      "slice", {x}, make_attrs({{"dim", int64_t{3}}, {"start", split}, {"end", std::numeric_limits<int64_t>::max()}}));
  const ValueId rotated = b.op("cat", {b.op("neg", {upper}), lower}, make_attrs({{"dim", int64_t{-1}}}));
  const ValueId direct = swapped ? b.op("mul", {cos, x}) : b.op("mul", {x, cos});
  const ValueId turned = swapped ? b.op("mul", {sin, rotated}) : b.op("mul", {rotated, sin});
  return swapped ? b.op("add", {turned, direct}) : b.op("add", {direct, turned});
}

TEST(FuseRope, QueriesAndKeysShareTheTables) {
  GraphBuilder b;
  const ValueId q = b.input("q", {1, 4, 3, 8});
  const ValueId k = b.input("k", {1, 2, 3, 8});
  const ValueId cos = b.op("unsqueeze", {b.input("cos", {1, 3, 8})}, make_attrs({{"dim", int64_t{1}}}));
  const ValueId sin = b.op("unsqueeze", {b.input("sin", {1, 3, 8})}, make_attrs({{"dim", int64_t{1}}}));
  b.output(hf_rope(b, q, cos, sin, 8));
  b.output(hf_rope(b, k, cos, sin, 8, true));
  const Graph fused = after(b.graph(), {"fuse_rope"});
  ASSERT_EQ(count(fused, "rope"), 2u);
  EXPECT_EQ(fused.nodes.size(), 4u);
  EXPECT_EQ(fused.nodes[2].inputs, (std::vector<ValueId>{q, cos, sin}));
  EXPECT_EQ(fused.nodes[3].inputs, (std::vector<ValueId>{k, cos, sin}));
  EXPECT_EQ(fused.outputs, b.graph().outputs);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseRope, NotForOtherSplitsOrSharedPieces) {
  GraphBuilder b;
  const ValueId q = b.input("q", {1, 2, 3, 8});
  const ValueId cos = b.input("cos", {1, 1, 3, 8});
  const ValueId sin = b.input("sin", {1, 1, 3, 8});
  b.output(hf_rope(b, q, cos, sin, 8, false, 3));
  b.output(hf_rope(b, q, cos, sin, 8));
  b.output(b.graph().nodes.back().inputs[1]);  // the rotated half times sin, read outside
  expect_unchanged(b.graph(), after(b.graph(), {"fuse_rope"}));
}

// ====================================================================================================================
// fuse_attention

// Hugging Face's repeat_kv: [B, H, S, D] -> unsqueeze(2) -> expand -> reshape [B, H * n, S, D].
ValueId repeat_kv(GraphBuilder& b, ValueId x, const Shape& shape, int64_t copies) {
  const ValueId inserted = b.op("unsqueeze", {x}, make_attrs({{"dim", int64_t{2}}}));
  const ValueId expanded =
      b.op("expand", {inserted},
           make_attrs({{"size", std::vector<int64_t>{shape[0], shape[1], copies, shape[2], shape[3]}}}));
  return b.op("reshape", {expanded},
              make_attrs({{"shape", std::vector<int64_t>{shape[0], shape[1] * copies, shape[2], shape[3]}}}));
}

// Eager attention: softmax(q k^T * scale + mask) v, over repeated keys and values.
ValueId eager_attention(GraphBuilder& b, ValueId q, ValueId k, ValueId v, ValueId mask, int64_t copies,
                        bool divide = false) {
  const Shape shape = b.graph().value(k).meta.shape;
  const ValueId keys = repeat_kv(b, k, shape, copies);
  const ValueId values = repeat_kv(b, v, Shape(b.graph().value(v).meta.shape), copies);
  const ValueId transposed = b.op("transpose", {keys}, make_attrs({{"dim0", int64_t{2}}, {"dim1", int64_t{3}}}));
  const ValueId raw = b.op("matmul", {q, transposed});
  const double features = static_cast<double>(shape.back());
  ValueId scores =
      divide ? b.scalar_op("div", raw, std::sqrt(features)) : b.scalar_op("mul", raw, 1 / std::sqrt(features));
  if (mask != kNoValue) scores = b.op("add", {scores, mask});
  const ValueId probabilities = b.op("softmax", {scores}, make_attrs({{"dim", int64_t{-1}}}));
  const ValueId cast = b.op("to", {probabilities}, make_attrs({{"dtype", std::string("torch.float32")}}));
  return b.op("matmul", {cast, values});
}

// A causal additive mask [1, 1, rows, columns]: query i (at position offset + i) sees keys 0..offset + i.
Tensor causal_mask(int64_t rows, int64_t columns, int64_t offset) {
  Tensor mask(DType::Float32, {1, 1, rows, columns});
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < columns; ++j) mask.mutable_data<float>()[i * columns + j] = j <= offset + i ? 0 : -kInf;
  return mask;
}

TEST(FuseAttention, GroupedQueryPrefillReadsUnrepeatedKeys) {
  GraphBuilder b;
  const ValueId q = b.input("q", {1, 4, 3, 8});
  const ValueId k = b.input("k", {1, 2, 3, 8});
  const ValueId v = b.input("v", {1, 2, 3, 8});
  const ValueId mask = b.input("mask", {1, 1, 3, 3});
  b.output(eager_attention(b, q, k, v, mask, 2));
  compiler::PassContext log;
  const Graph fused = after(b.graph(), {"fuse_attention"}, &log);
  ASSERT_EQ(fused.nodes.size(), 1u);
  const Node& attention = fused.nodes[0];
  EXPECT_EQ(attention.op, "attention");
  EXPECT_EQ(attention.inputs, (std::vector<ValueId>{q, k, v, mask}));
  EXPECT_NEAR(attention.attrs.get_float("scale"), 1 / std::sqrt(8.0), 1e-12);
  EXPECT_TRUE(attention.attrs.get_bool("has_mask"));
  EXPECT_FALSE(attention.attrs.get_bool("has_cache_position"));
  EXPECT_EQ(attention.outputs, b.graph().outputs);
  EXPECT_EQ(log.log.at(0),
            "fuse_attention: 1 attention fused (0 bounded by cache_position, 0 from "
            "scaled_dot_product_attention)");
  Feeds inputs = patterned_inputs(b.graph());
  inputs["mask"] = causal_mask(3, 3, 0);
  expect_fusion_keeps_outputs(b.graph(), fused, inputs);
}

TEST(FuseAttention, DecodeAgainstAStaticCacheIsBounded) {
  GraphBuilder b;
  const ValueId q = b.input("q", {1, 4, 1, 8});
  const ValueId position = b.input("cache_position", {1}, DType::Int64);
  const ValueId mask = b.input("mask", {1, 1, 1, 6});
  const auto write = [&](const std::string& name) {
    return b.op("index_copy", {b.input(name, {1, 2, 6, 8}), position, b.input(name + "_new", {1, 2, 1, 8})},
                make_attrs({{"dim", int64_t{2}}}));
  };
  const ValueId k = write("k_cache");
  const ValueId v = write("v_cache");
  b.output(eager_attention(b, q, k, v, mask, 2));
  b.output(k);
  b.output(v);
  compiler::PassContext log;
  const Graph fused = after(b.graph(), {"fuse_attention"}, &log);
  const Node& attention = only(fused, "attention");
  EXPECT_EQ(attention.inputs, (std::vector<ValueId>{q, k, v, mask, position}));
  EXPECT_TRUE(attention.attrs.get_bool("has_cache_position"));
  EXPECT_EQ(count(fused, "matmul") + count(fused, "softmax") + count(fused, "expand"), 0u);
  EXPECT_EQ(log.log.at(0),
            "fuse_attention: 1 attention fused (1 bounded by cache_position, 0 from "
            "scaled_dot_product_attention)");
  Feeds inputs = patterned_inputs(b.graph());
  Tensor at(DType::Int64, {1});
  at.mutable_data<int64_t>()[0] = 2;
  inputs["cache_position"] = at;
  inputs["mask"] = causal_mask(1, 6, 2);
  expect_fusion_keeps_outputs(b.graph(), fused, inputs);
}

TEST(FuseAttention, DividedScoresWithoutMask) {
  GraphBuilder b;
  const ValueId q = b.input("q", {2, 2, 5, 4});
  b.output(eager_attention(b, q, b.input("k", {2, 2, 7, 4}), b.input("v", {2, 2, 7, 4}), kNoValue, 1, true));
  const Graph fused = after(b.graph(), {"fuse_attention"});
  const Node& attention = only(fused, "attention");
  EXPECT_EQ(attention.inputs.size(), 3u);
  EXPECT_NEAR(attention.attrs.get_float("scale"), 0.5, 1e-12);
  EXPECT_FALSE(attention.attrs.get_bool("has_mask"));
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseAttention, ProbabilitiesReadOutsideLeaveAMaskedSoftmax) {
  GraphBuilder b;
  const ValueId q = b.input("q", {1, 2, 3, 4});
  const ValueId mask = b.input("mask", {1, 1, 3, 3});
  b.output(eager_attention(b, q, b.input("k", {1, 2, 3, 4}), b.input("v", {1, 2, 3, 4}), mask, 1));
  const ValueId probabilities = b.graph().nodes[b.graph().nodes.size() - 2].inputs[0];
  b.output(probabilities);
  const Graph fused = after(b.graph(), {"fuse_attention", "fuse_masked_softmax"});
  EXPECT_EQ(count(fused, "attention"), 0u);
  EXPECT_EQ(count(fused, "masked_softmax"), 1u);
  EXPECT_EQ(only(fused, "masked_softmax").outputs[0], probabilities);
  Feeds inputs = patterned_inputs(b.graph());
  inputs["mask"] = causal_mask(3, 3, 0);
  expect_fusion_keeps_outputs(b.graph(), fused, inputs);
}

TEST(FuseAttention, ScaledDotProductAttentionBecomesAttention) {
  GraphBuilder b;
  const ValueId q = b.input("q", {1, 4, 3, 8});
  const Shape kv{1, 2, 3, 8};
  const ValueId k = b.input("k", kv);
  const ValueId v = b.input("v", kv);
  b.output(b.op("scaled_dot_product_attention", {q, repeat_kv(b, k, kv, 2), repeat_kv(b, v, kv, 2)},
                make_attrs({{"is_causal", true}})));
  const Graph fused = after(b.graph(), {"fuse_attention"});
  ASSERT_EQ(fused.nodes.size(), 1u);
  const Node& attention = fused.nodes[0];
  EXPECT_EQ(attention.inputs, (std::vector<ValueId>{q, k, v}));
  EXPECT_TRUE(attention.attrs.get_bool("is_causal"));
  EXPECT_TRUE(attention.attrs.get_bool("zero_masked_rows"));
  EXPECT_NEAR(attention.attrs.get_float("scale"), 1 / std::sqrt(8.0), 1e-12);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

// ====================================================================================================================
// fuse_masked_softmax

TEST(FuseMaskedSoftmax, MaskFirstOrSecond) {
  GraphBuilder b;
  const ValueId scores = b.input("scores", {2, 3, 4});
  const ValueId mask = b.input("mask", {4});
  b.output(b.op("softmax", {b.op("add", {mask, scores})}, make_attrs({{"dim", int64_t{2}}})));
  b.output(b.op("softmax", {b.op("add", {scores, mask})}, make_attrs({{"dim", int64_t{1}}})));  // not the last dim
  const Graph fused = after(b.graph(), {"fuse_masked_softmax"});
  ASSERT_EQ(count(fused, "masked_softmax"), 1u);
  EXPECT_EQ(only(fused, "masked_softmax").inputs, (std::vector<ValueId>{scores, mask}));
  EXPECT_EQ(count(fused, "softmax"), 1u);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

// ====================================================================================================================
// fuse_elementwise

TEST(FuseElementwise, ChainsOfScalarAndUnarySteps) {
  GraphBuilder b;
  const ValueId x = b.input("x", {3, 5});
  const ValueId y = b.op("neg", {b.op("tanh", {b.scalar_op("add", b.scalar_op("mul", x, 2.0), 1.0)})});
  b.output(b.op("matmul", {y, b.input("m", {5, 2})}));
  const Graph fused = after(b.graph(), {"fuse_elementwise"});
  ASSERT_EQ(fused.nodes.size(), 2u);
  const Node& chain = fused.nodes[0];
  EXPECT_EQ(chain.op, "elementwise_chain");
  EXPECT_EQ(chain.attrs.get_string("ops"), "mul,add,tanh,neg");
  EXPECT_EQ(chain.attrs.get_floats("scalars"), (std::vector<double>{2, 1, 0, 0}));
  EXPECT_EQ(chain.inputs, (std::vector<ValueId>{x}));
  EXPECT_EQ(chain.outputs[0], y);
  expect_fusion_keeps_outputs(b.graph(), fused, patterned_inputs(b.graph()));
}

TEST(FuseElementwise, ChainsStopAtSharedValuesAndOutputs) {
  GraphBuilder b;
  const ValueId x = b.input("x", {4});
  const ValueId shared = b.op("exp", {b.scalar_op("pow", x, 2.0, "exponent")});  // pow, exp: a chain of two
  b.output(b.op("sigmoid", {shared}));
  b.output(b.op("relu", {shared}));
  const ValueId seen = b.op("neg", {x});
  b.output(seen);
  b.output(b.op("abs", {seen}));
  b.output(b.op("neg", {b.op("abs", {b.input("n", {4}, DType::Int64)})}));  // integers are not chained
  const Graph fused = after(b.graph(), {"fuse_elementwise"});
  ASSERT_EQ(count(fused, "elementwise_chain"), 1u);
  EXPECT_EQ(only(fused, "elementwise_chain").attrs.get_string("ops"), "pow,exp");
  EXPECT_EQ(fused.nodes.size(), b.graph().nodes.size() - 1);
  Feeds inputs = patterned_inputs(b.graph());
  expect_fusion_keeps_outputs(b.graph(), fused, inputs);
}

TEST(Fusions, LeaveAGraphWithoutPatternsUnchanged) {
  GraphBuilder b;
  const ValueId x = b.input("x", {2, 3});
  b.output(b.op("softmax", {b.op("matmul", {x, b.input("w", {3, 3})})}, make_attrs({{"dim", int64_t{-1}}})));
  std::vector<std::string> fusions;
  for (const compiler::Pass& pass : compiler::all_passes())
    if (pass.is_fusion) fusions.push_back(pass.name);
  compiler::PassContext log;
  expect_unchanged(b.graph(), after(b.graph(), fusions, &log));
  EXPECT_TRUE(log.log.empty());
}

// ====================================================================================================================
// The fixture models

TEST(FusionCounts, ResNet18) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  const Graph fused = after_all(graph);
  EXPECT_EQ(count(fused, "fused_conv2d"), 17u);
  EXPECT_EQ(count(fused, "conv2d"), 3u);  // the downsample convolutions feed a residual add
  EXPECT_EQ(count(fused, "relu") + count(fused, "add") + count(fused, "batch_norm"), 0u);
  size_t residual = 0, relu = 0;
  for (const Node& node : fused.nodes)
    if (node.op == "fused_conv2d") {
      residual += node.attrs.get_bool("has_residual");
      relu += node.attrs.get_string("activation") == "relu";
      EXPECT_TRUE(node.attrs.get_bool("has_bias"));  // the folded BatchNorm shift
    }
  EXPECT_EQ(residual, 8u);
  EXPECT_EQ(relu, 17u);
  ASSERT_EQ(fused.outputs.size(), graph.outputs.size());
  for (size_t i = 0; i < graph.outputs.size(); ++i)
    EXPECT_EQ(value_name(fused, fused.outputs[i]), value_name(graph, graph.outputs[i]));
}

TEST(FusionCounts, ResNet50) {
  const Graph fused = after_all(read_torch_ir(kFixtures + "/ir/resnet50_ir.json"));
  EXPECT_EQ(count(fused, "fused_conv2d"), 49u);  // 16 bottlenecks of three, and the stem
  EXPECT_EQ(count(fused, "conv2d"), 4u);
  EXPECT_EQ(count(fused, "relu") + count(fused, "add") + count(fused, "batch_norm"), 0u);
  size_t residual = 0;
  for (const Node& node : fused.nodes) residual += node.op == "fused_conv2d" && node.attrs.get_bool("has_residual");
  EXPECT_EQ(residual, 16u);
}

void expect_qwen15_counts(const Graph& graph, const Graph& fused) {
  EXPECT_EQ(count(fused, "rms_norm"), 57u);
  EXPECT_EQ(count(fused, "silu_mul"), 28u);
  EXPECT_EQ(count(fused, "rope"), 56u);
  EXPECT_EQ(count(fused, "attention"), 28u);
  for (const char* absorbed : {"pow", "mean", "rsqrt", "silu", "neg", "slice", "softmax", "matmul", "expand"})
    EXPECT_EQ(count(fused, absorbed), 0u) << absorbed;
  ASSERT_EQ(fused.outputs.size(), graph.outputs.size());
  for (size_t i = 0; i < graph.outputs.size(); ++i)
    EXPECT_EQ(value_name(fused, fused.outputs[i]), value_name(graph, graph.outputs[i]));
}

TEST(FusionCounts, Qwen15Prefill) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/qwen15_prefill_ir.json");
  const Graph fused = after_all(graph);
  expect_qwen15_counts(graph, fused);
  for (const Node& node : fused.nodes) {
    if (node.op != "attention") continue;
    EXPECT_TRUE(node.attrs.get_bool("has_mask"));
    EXPECT_FALSE(node.attrs.get_bool("has_cache_position"));
    EXPECT_EQ(fused.value(node.inputs[1]).meta.shape, (Shape{1, 2, 128, 128}));  // keys before the repeat
  }
}

TEST(FusionCounts, Qwen15DecodeAttentionIsBoundedByCachePosition) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/qwen15_decode_ir.json");
  const Graph fused = after_all(graph);
  expect_qwen15_counts(graph, fused);
  for (const Node& node : fused.nodes) {
    if (node.op != "attention") continue;
    ASSERT_EQ(node.inputs.size(), 5u);
    EXPECT_TRUE(node.attrs.get_bool("has_cache_position"));
    EXPECT_EQ(value_name(fused, node.inputs[4]), "cache_position");
    for (int i : {1, 2}) {
      const Value& cache = fused.value(node.inputs[static_cast<size_t>(i)]);
      EXPECT_EQ(fused.nodes[static_cast<size_t>(cache.producer)].op, "index_copy");
      EXPECT_EQ(cache.meta.shape, (Shape{1, 2, 2048, 128}));
    }
  }
}

// ====================================================================================================================
// Numerics on the fixture models: the fused graph against the graph as read

WeightBinding bind_qwen_tiny(const Graph& graph) {
  WeightStore store;
  store.add_file(kFixtures + "/qwen_tiny/model.safetensors");
  store.set_config(ModelConfig::load(kFixtures + "/qwen_tiny/config.json"));
  return store.bind(graph);
}

NamedTensors run_bound(const Graph& graph, const WeightBinding& binding, const Feeds& inputs) {
  std::vector<std::pair<ValueId, Tensor>> tensors = binding.tensors;
  add_derived_weights(graph, tensors);
  return ReferenceExecutor(graph, tensors).run(inputs);
}

Tensor int64_tensor(Shape shape, const std::vector<int64_t>& values) {
  Tensor t(DType::Int64, std::move(shape));
  std::copy(values.begin(), values.end(), t.mutable_data<int64_t>());
  return t;
}

Feeds qwen_tiny_prefill_inputs() {
  const SafetensorsFile reference = SafetensorsFile::open(kFixtures + "/qwen_tiny/reference.safetensors");
  const Tensor ids = reference.get("input_ids");
  const int64_t length = ids.shape().back();
  std::vector<int64_t> positions(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) positions[static_cast<size_t>(i)] = i;
  return {{"input_ids", ids},
          {"attention_mask", int64_tensor({1, length}, std::vector<int64_t>(static_cast<size_t>(length), 1))},
          {"position_ids", int64_tensor({1, length}, positions)},
          {"cache_position", int64_tensor({length}, positions)}};
}

Feeds qwen_tiny_decode_inputs(const Graph& graph) {
  const SafetensorsFile reference = SafetensorsFile::open(kFixtures + "/qwen_tiny/decode_reference.safetensors");
  Feeds inputs;
  for (ValueId id : graph.inputs) inputs[graph.value(id).name] = reference.get(graph.value(id).name);
  return inputs;
}

// The whole pipeline, and each fusion switched on alone (the bisecting workflow), against no fusion at all.
void expect_fusions_keep_outputs(const Graph& graph, const Feeds& inputs) {
  const Graph unfused = after_all(graph, {"fusions"});
  const WeightBinding binding = bind_qwen_tiny(unfused);
  const NamedTensors expected = run_bound(unfused, binding, inputs);
  const Graph fused = after_all(graph);
  EXPECT_GT(count(fused, "attention"), 0u);
  expect_same_outputs(expected, run_bound(fused, bind_qwen_tiny(fused), inputs), 1e-4);
  for (const compiler::Pass& pass : compiler::all_passes()) {
    if (!pass.is_fusion) continue;
    std::set<std::string> disabled;
    for (const compiler::Pass& other : compiler::all_passes())
      if (other.is_fusion && other.name != std::string(pass.name)) disabled.insert(other.name);
    SCOPED_TRACE(pass.name);
    const Graph one = after_all(graph, disabled);
    expect_same_outputs(expected, run_bound(one, bind_qwen_tiny(one), inputs), 1e-4);
  }
}

TEST(FusionNumerics, QwenTinyPrefill) {
  const Graph graph = read_torch_ir(kFixtures + "/qwen_tiny/prefill_ir.json");
  expect_fusions_keep_outputs(graph, qwen_tiny_prefill_inputs());
  // And the fused graph still matches the Hugging Face logits.
  const Graph fused = after_all(graph);
  const NamedTensors outputs = run_bound(fused, bind_qwen_tiny(fused), qwen_tiny_prefill_inputs());
  const SafetensorsFile reference = SafetensorsFile::open(kFixtures + "/qwen_tiny/reference.safetensors");
  const Comparison logits = compare_tensors(outputs[0].second, reference.get("logits"));
  EXPECT_LT(logits.max_abs_diff, 1e-4) << logits.summary();
}

TEST(FusionNumerics, QwenTinyDecode) {
  const Graph graph = read_torch_ir(kFixtures + "/qwen_tiny/decode_ir.json");
  const Feeds inputs = qwen_tiny_decode_inputs(graph);
  expect_fusions_keep_outputs(graph, inputs);
  const Graph fused = after_all(graph);
  const NamedTensors outputs = run_bound(fused, bind_qwen_tiny(fused), inputs);
  const SafetensorsFile reference = SafetensorsFile::open(kFixtures + "/qwen_tiny/decode_reference.safetensors");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Comparison c = compare_tensors(outputs[i].second, reference.get("out_" + std::to_string(i)));
    EXPECT_LT(c.max_abs_diff, 1e-4) << outputs[i].first << ": " << c.summary();
  }
}

TEST(FusionNumerics, ResNet18WithRandomWeights) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  Feeds weights;
  for (ValueId id : graph.weights) weights[graph.value(id).weight_key] = random_weight(graph.value(id), 7);
  Feeds inputs;
  for (ValueId id : graph.inputs) inputs[graph.value(id).name] = random_input(graph.value(id), 7);
  const Graph fused = after_all(graph);
  ASSERT_EQ(count(fused, "fused_conv2d"), 17u);
  expect_same_outputs(run(graph, weights, inputs), run(fused, weights, inputs), 1e-4);
}

}  // namespace
}  // namespace npusim
