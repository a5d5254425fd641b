// The compiler pipeline: every pass on and off gives the reference's result, BatchNorm folding keeps the bias
// of bias-free convs, targets report what they lack, and bisect finds a deliberately broken fusion.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "compiler/compile.h"
#include "compiler/graph_edit.h"
#include "compiler/pass.h"
#include "graph_test_util.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "npusim/op_registry.h"
#include "runtime/backend.h"
#include "runtime/bisect.h"
#include "runtime/compare.h"
#include "runtime/random_fill.h"
#include "runtime/reference_executor.h"
#include "runtime/weight_store.h"
#include "runtime/weight_transforms.h"
#include "work_dir.h"

namespace npusim {
namespace {

const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";

std::vector<std::pair<ValueId, Tensor>> random_weights(const Graph& graph) {
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (ValueId id : graph.weights) {
    const Value& value = graph.value(id);
    if (value.transform) continue;
    weights.emplace_back(
        id, graph.constants.count(value.weight_key) ? graph.constants.at(value.weight_key) : random_weight(value, 3));
  }
  add_derived_weights(graph, weights);
  return weights;
}

std::vector<std::pair<ValueId, Tensor>> tiny_weights(const Graph& graph) {
  WeightStore store;
  store.add_file(kFixtures + "/qwen_tiny/model.safetensors");
  store.set_config(ModelConfig::load(kFixtures + "/qwen_tiny/config.json"));
  return store.bind(graph).tensors;
}

std::map<std::string, Tensor> tiny_inputs(const Graph& graph) {
  std::map<std::string, Tensor> inputs;
  for (ValueId id : graph.inputs) {
    const Value& value = graph.value(id);
    Tensor t(value.meta.dtype, value.meta.shape);
    if (value.name == "input_ids")
      for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<int64_t>()[i] = (i * 37 + 11) % 512;
    else if (value.name == "attention_mask" && value.meta.dtype == DType::Int64)
      for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<int64_t>()[i] = 1;
    else if (value.name == "position_ids" || value.name == "cache_position")
      for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<int64_t>()[i] = value.meta.shape.back() == 1 ? 5 : i;
    else
      t = random_input(value, 1);
    if (value.name == "attention_mask" && value.meta.dtype != DType::Int64) {  // additive decode mask
      t = Tensor(DType::Float32, value.meta.shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = i <= 5 ? 0.0f : -INFINITY;
    }
    inputs[value.name] = t;
  }
  return inputs;
}

struct Model {
  std::string path;
  bool real_weights;
};

NamedTensors run_compiled(const Graph& graph, const compiler::CompileOptions& options, bool real_weights,
                          const std::map<std::string, Tensor>& inputs) {
  const Program program = compiler::compile_graph(graph, options);
  auto backend = make_backend("cpu");
  auto prepared = backend->prepare(program, real_weights ? tiny_weights(program.graph) : random_weights(program.graph));
  return prepared->run(inputs);
}

void expect_close(const NamedTensors& actual, const NamedTensors& expected, const std::string& label) {
  ASSERT_EQ(actual.size(), expected.size()) << label;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first) << label;
    const Comparison c = compare_tensors(actual[i].second, expected[i].second);
    EXPECT_LE(c.max_abs_diff, 1e-4 * std::max(1.0, c.max_abs_reference))
        << label << " " << actual[i].first << ": " << c.summary();
  }
}

TEST(Compiler, EveryPassOnAndOffMatchesTheReference) {
  for (const Model& model : {Model{"/ir/resnet18_ir.json", false}, Model{"/qwen_tiny/prefill_ir.json", true},
                             Model{"/qwen_tiny/decode_ir.json", true}}) {
    const Graph graph = read_torch_ir(kFixtures + model.path);
    const auto inputs = model.real_weights
                            ? tiny_inputs(graph)
                            : std::map<std::string, Tensor>{{"x", random_input(graph.value(graph.inputs[0]), 2)}};
    const ReferenceExecutor reference(graph, model.real_weights ? tiny_weights(graph) : random_weights(graph));
    const NamedTensors expected = reference.run(inputs);

    expect_close(run_compiled(graph, {}, model.real_weights, inputs), expected, model.path + " all passes");
    compiler::CompileOptions none;
    for (const compiler::Pass& pass : compiler::all_passes()) none.disabled_passes.insert(pass.name);
    expect_close(run_compiled(graph, none, model.real_weights, inputs), expected, model.path + " no passes");
    for (const compiler::Pass& pass : compiler::all_passes()) {
      compiler::CompileOptions off;
      off.disabled_passes.insert(pass.name);
      expect_close(run_compiled(graph, off, model.real_weights, inputs), expected,
                   model.path + " without " + pass.name);
      compiler::CompileOptions only = none;
      only.disabled_passes.erase(pass.name);
      expect_close(run_compiled(graph, only, model.real_weights, inputs), expected, model.path + " only " + pass.name);
    }
  }
}

// conv (no bias) -> batch_norm with non-trivial statistics: the folded shift must survive as a new bias.
TEST(Compiler, BatchNormFoldIntoBiasFreeConvKeepsTheShift) {
  const std::string ir =
      R"({"model_name": "ConvBn", "graph_inputs": [{"name": "x", "shape": [1, 2, 5, 5], "dtype": "float32"}],
    "graph_outputs": [{"name": "batch_norm", "shape": [1, 3, 5, 5], "dtype": "float32"}],
    "weights": [{"name": "conv.weight", "shape": [3, 2, 3, 3], "dtype": "float32"},
                {"name": "bn.weight", "shape": [3], "dtype": "float32"}, {"name": "bn.bias", "shape": [3], "dtype": "float32"},
                {"name": "bn.running_mean", "shape": [3], "dtype": "float32"}, {"name": "bn.running_var", "shape": [3], "dtype": "float32"}],
    "weight_name_mapping": {"p_conv_weight": "conv.weight", "p_bn_weight": "bn.weight", "p_bn_bias": "bn.bias",
                            "b_bn_running_mean": "bn.running_mean", "b_bn_running_var": "bn.running_var"},
    "nodes": [
      {"name": "conv2d", "op_type": "aten.conv2d.default",
       "inputs": [{"name": "x", "shape": [1, 2, 5, 5], "dtype": "float32", "producer_node": "x", "producer_output_idx": 0},
                  {"name": "p_conv_weight", "shape": [3, 2, 3, 3], "dtype": "float32"}],
       "outputs": [{"name": "conv2d", "shape": [1, 3, 5, 5], "dtype": "float32"}], "attrs": {"padding": [1, 1]}},
      {"name": "batch_norm", "op_type": "aten.batch_norm.default",
       "inputs": [{"name": "conv2d", "shape": [1, 3, 5, 5], "dtype": "float32", "producer_node": "conv2d", "producer_output_idx": 0},
                  {"name": "p_bn_weight", "shape": [3], "dtype": "float32"}, {"name": "p_bn_bias", "shape": [3], "dtype": "float32"},
                  {"name": "b_bn_running_mean", "shape": [3], "dtype": "float32"}, {"name": "b_bn_running_var", "shape": [3], "dtype": "float32"}],
       "outputs": [{"name": "batch_norm", "shape": [1, 3, 5, 5], "dtype": "float32"}],
       "attrs": {"training": false, "momentum": 0.1, "eps": 1e-05}}]})";
  const Graph graph = parse_torch_ir(ir, "convbn.json");
  std::vector<std::pair<ValueId, Tensor>> weights;
  const float stats[4][3] = {{1.5f, -0.5f, 2.0f}, {0.3f, -1.0f, 0.7f}, {2.0f, -3.0f, 0.5f}, {4.0f, 0.25f, 9.0f}};
  for (size_t w = 0; w < graph.weights.size(); ++w) {
    const Value& value = graph.value(graph.weights[w]);
    Tensor t = random_weight(value, 5);
    if (w > 0) {
      t = Tensor(DType::Float32, {3});
      for (int c = 0; c < 3; ++c) t.mutable_data<float>()[c] = stats[w - 1][c];
    }
    weights.emplace_back(graph.weights[w], t);
  }
  const std::map<std::string, Tensor> inputs = {{"x", random_input(graph.value(graph.inputs[0]), 9)}};
  const NamedTensors expected = ReferenceExecutor(graph, weights).run(inputs);

  const Program program = compiler::compile_graph(graph, {});
  ASSERT_EQ(program.graph.nodes.size(), 1u);
  const Node& conv = program.graph.nodes[0];
  ASSERT_EQ(conv.inputs.size(), 3u) << "the folded conv must carry the folded bias";
  // Bind by key: the compiled graph's value ids differ from the source graph's.
  std::vector<std::pair<ValueId, Tensor>> compiled_weights;
  for (ValueId id : program.graph.weights)
    for (size_t w = 0; w < graph.weights.size(); ++w)
      if (program.graph.value(id).weight_key == graph.value(graph.weights[w]).weight_key)
        compiled_weights.emplace_back(id, weights[w].second);
  add_derived_weights(program.graph, compiled_weights);
  const NamedTensors actual = make_backend("cpu")->prepare(program, compiled_weights)->run(inputs);
  const Comparison c = compare_tensors(actual[0].second, expected[0].second);
  EXPECT_LT(c.max_abs_diff, 1e-5) << c.summary();
  EXPECT_GT(c.max_abs_reference, 1.0);  // the statistics really shift the output
}

TEST(Compiler, FusionsStayOffWhereTheirFusedOpHasNoKernel) {
  // relu(batch_norm(x)): the CPU backend has a fused_batch_norm kernel, the CUDA backend only its generic one.
  test::GraphBuilder b;
  std::vector<ValueId> inputs{b.input("x", {1, 2, 3, 3})};
  for (const char* name : {"gamma", "beta", "mean", "var"}) inputs.push_back(b.weight(name, {2}));
  b.output(b.op("relu", {b.op("batch_norm", inputs)}));
  const auto compiled = [&](const std::string& target, std::vector<std::string>& log) {
    compiler::CompileOptions options;
    options.target = target;
    compiler::CompileReport report;
    const Program program = compiler::compile_graph(b.graph(), options, &report);
    log = report.pass_log;
    std::vector<std::string> ops;
    for (const Node& node : program.graph.nodes) ops.push_back(node.op);
    return ops;
  };
  std::vector<std::string> log;
  EXPECT_EQ(compiled("cpu", log), std::vector<std::string>{"fused_batch_norm"});
  EXPECT_EQ(compiled("cuda", log), (std::vector<std::string>{"batch_norm", "relu"}));
  const std::string off = "fuse_batchnorm_activation: off: backend 'cuda' has no kernel for fused_batch_norm";
  EXPECT_NE(std::find(log.begin(), log.end(), off), log.end());
}

TEST(Compiler, TargetWithoutAnOpReportsFallbackOrFails) {
  const Graph graph = read_torch_ir(kFixtures + "/qwen_tiny/decode_ir.json");
  const std::string path = test::work_dir() + "/no_softmax_target.json";
  {
    std::ofstream out(path);
    std::set<std::string> ops;
    for (const OpDef* def : OpRegistry::instance().all())
      if (def->name != "softmax" && def->name != "attention" && def->name != "masked_softmax") ops.insert(def->name);
    out << R"({"name": "no-softmax", "backend": "cpu", "fallback": "cpu", "ops": [)";
    bool first = true;
    for (const std::string& op : ops) out << (first ? "" : ",") << '"' << op << '"', first = false;
    out << "]}";
  }
  compiler::CompileOptions options;
  options.target = path;
  options.disabled_passes = {"fusions"};
  compiler::CompileReport report;
  const Program program = compiler::compile_graph(graph, options, &report);
  const std::string text = compiler::format_report(program, report, compiler::load_target(path));
  EXPECT_NE(text.find("FALLBACK"), std::string::npos) << text;
  EXPECT_NE(text.find("softmax"), std::string::npos) << text;
  options.allow_fallback = false;
  try {
    compiler::compile_graph(graph, options);
    FAIL() << "--no-fallback must turn the missing op into an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("softmax"), std::string::npos) << error.what();
  }
  EXPECT_THROW(compiler::load_target("/nonexistent/target.json"), Error);
  EXPECT_THROW(compiler::parse_target(R"({"name": "t", "alignment": 3})", "t.json"), Error);
}

TEST(Compiler, UnknownPassNameIsAnError) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  compiler::CompileOptions options;
  options.disabled_passes = {"fold_everything"};
  EXPECT_THROW(compiler::compile_graph(graph, options), Error);
}

// A fusion that gets the semantics wrong: relu becomes a clamp to [0, 0.5].
void broken_relu_fusion(Graph& graph, compiler::PassContext&) {
  for (Node& node : graph.nodes) {
    if (node.op != "relu") continue;
    Attrs attrs;
    attrs.set("min_val", 0.0);
    attrs.set("max_val", 0.5);
    node.op = "hardtanh";
    node.def = OpRegistry::instance().find("hardtanh");
    node.attrs = attrs;
    return;  // only the first one
  }
}

TEST(Compiler, BisectFindsTheBrokenFusionAndItsNode) {
  const Graph graph = read_torch_ir(kFixtures + "/ir/resnet18_ir.json");
  std::vector<compiler::Pass> passes = compiler::all_passes();
  passes.push_back({"broken_relu", "test only", true, broken_relu_fusion});
  const std::map<std::string, Tensor> inputs = {{"x", random_input(graph.value(graph.inputs[0]), 2)}};
  const BisectResult result = bisect_passes(graph, passes, random_weights, inputs, BisectOptions{});
  ASSERT_TRUE(result.first_bad.has_value()) << format_bisect(result);
  const BisectStep& bad = result.steps[*result.first_bad];
  EXPECT_EQ(bad.pass, "broken_relu") << format_bisect(result);
  EXPECT_EQ(bad.first_node_op, "hardtanh") << format_bisect(result);
  EXPECT_FALSE(result.steps.front().diverged) << format_bisect(result);
}

}  // namespace
}  // namespace npusim
