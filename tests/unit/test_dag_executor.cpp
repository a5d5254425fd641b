// The DAG executor: a program split around an op its target lacks runs partition by partition, each prepared
// once as its own program, and gives the reference's results and exactly the single-backend results; integer
// values cross partitions exactly; the profiler sees every kernel of the program.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/graph_edit.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "npusim/op_registry.h"
#include "runtime/backend.h"
#include "runtime/compare.h"
#include "runtime/dag_executor.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "unit/graph_test_util.h"
#include "work_dir.h"

namespace npusim {
namespace {

using compiler::Side;

const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";

using test::GraphBuilder;
using test::make_attrs;

// Deterministic values in [-2, 2] that differ from element to element and from tensor to tensor.
Tensor pattern(const Shape& shape, double seed) {
  Tensor t(DType::Float32, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.mutable_data<float>()[i] = static_cast<float>(2.0 * std::sin(0.37 * static_cast<double>(i) + seed));
  return t;
}

std::string write_target(const std::string& name, const std::string& json) {
  const std::string path = test::work_dir() + "/" + name;
  std::ofstream(path) << json;
  return path;
}

// Every registry op but `missing`, as a target JSON on the CPU backend.
std::string target_without(const std::string& name, const std::set<std::string>& missing,
                           const std::string& fallback = "cpu") {
  std::string ops;
  for (const OpDef* def : OpRegistry::instance().all())
    if (!missing.count(def->name)) ops += (ops.empty() ? "\"" : ", \"") + def->name + "\"";
  return write_target(name + ".json", R"({"name": ")" + name + R"(", "backend": "cpu", "fallback": ")" + fallback +
                                          R"(", "ops": [)" + ops + "]}");
}

void expect_identical(const NamedTensors& actual, const NamedTensors& expected, const std::string& label) {
  ASSERT_EQ(actual.size(), expected.size()) << label;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first) << label;
    EXPECT_EQ(actual[i].second.dtype(), expected[i].second.dtype()) << label << " " << actual[i].first;
    ASSERT_EQ(actual[i].second.shape(), expected[i].second.shape()) << label << " " << actual[i].first;
    ASSERT_EQ(actual[i].second.nbytes(), expected[i].second.nbytes());
    EXPECT_EQ(std::memcmp(actual[i].second.bytes(), expected[i].second.bytes(), actual[i].second.nbytes()), 0)
        << label << " " << actual[i].first << ": " << compare_tensors(actual[i].second, expected[i].second).summary();
  }
}

void expect_close(const NamedTensors& actual, const NamedTensors& expected, double tolerance,
                  const std::string& label) {
  ASSERT_EQ(actual.size(), expected.size()) << label;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first) << label;
    const Comparison c = compare_tensors(actual[i].second, expected[i].second);
    EXPECT_LE(c.max_abs_diff, tolerance * std::max(1.0, c.max_abs_reference))
        << label << " " << actual[i].first << ": " << c.summary();
  }
}

// x [3, 4] -> linear(w [5, 4], b [5]) -> relu (r) -> cumsum along 1 (c, the op the target lacks) -> mul(c, r)
// -> softmax along 1; outputs the softmax and r.
struct SplitModel {
  GraphBuilder b;
  ValueId x, w, bias, linear, relu, cumsum, mul, softmax;
  SplitModel() {
    x = b.input("x", {3, 4});
    w = b.weight("fc.weight", {5, 4});
    bias = b.weight("fc.bias", {5});
    linear = b.op("linear", {x, w, bias});
    relu = b.op("relu", {linear});
    cumsum = b.op("cumsum", {relu}, make_attrs({{"dim", int64_t{1}}}));
    mul = b.op("mul", {cumsum, relu});
    softmax = b.op("softmax", {mul}, make_attrs({{"dim", int64_t{1}}}));
    b.output(softmax);
    b.output(relu);
  }
  std::vector<std::pair<ValueId, Tensor>> weights(const Graph& graph) const {
    std::vector<std::pair<ValueId, Tensor>> bound;
    for (ValueId id : graph.weights) bound.emplace_back(id, pattern(graph.value(id).meta.shape, id * 0.7));
    return bound;
  }
  std::map<std::string, Tensor> inputs() const { return {{"x", pattern({3, 4}, 0.25)}}; }
};

struct Compiled {
  Program program;
  compiler::CompileReport report;
};

Compiled compile(const Graph& graph, const std::string& target, DType dtype = DType::Float32) {
  Compiled compiled;
  compiler::CompileOptions options;
  options.target = target;
  options.compute_dtype = dtype;
  compiled.program = compiler::compile_graph(graph, options, &compiled.report);
  return compiled;
}

TEST(DagExecutor, SplitRunMatchesTheReferenceAndTheSingleBackendRun) {
  const SplitModel model;
  const NamedTensors expected = ReferenceExecutor(model.b.graph(), model.weights(model.b.graph())).run(model.inputs());
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    const std::string label = std::string(dtype_name(dtype));
    const Compiled c = compile(model.b.graph(), target_without("no-cumsum", {"cumsum"}), dtype);
    const compiler::PartitionPlan& plan = c.report.partitions;
    ASSERT_EQ(plan.partitions.size(), 3u) << label;
    EXPECT_EQ(plan.partitions[1].side, Side::Fallback);
    const auto weights = model.weights(c.program.graph);
    DagExecutor split(c.program, plan, weights);
    const NamedTensors single = make_backend("cpu")->prepare(c.program, weights)->run(model.inputs());
    const NamedTensors actual = split.run(model.inputs());
    expect_identical(actual, single, label + " split vs single backend");
    expect_close(actual, expected, dtype == DType::Float32 ? 1e-5 : 3e-2, label + " split vs reference");
    expect_identical(split.run(model.inputs()), actual, label + " second run");  // prepared once, runs again

    // Each partition is its own program: its nodes, its inputs and outputs, its own memory plan.
    ASSERT_EQ(split.stage_count(), 3u);
    const Program& fallback = split.stage_program(1);
    ASSERT_EQ(fallback.graph.nodes.size(), 1u);
    EXPECT_EQ(fallback.graph.nodes[0].op, "cumsum");
    ASSERT_EQ(fallback.graph.inputs.size(), 1u);
    EXPECT_EQ(fallback.graph.value(fallback.graph.inputs[0]).name, "relu_1");
    ASSERT_EQ(fallback.graph.outputs.size(), 1u);
    EXPECT_EQ(fallback.graph.value(fallback.graph.outputs[0]).name, "cumsum_2");
    EXPECT_EQ(fallback.graph.values.size(), 2u);
    EXPECT_TRUE(fallback.graph.weights.empty());
    EXPECT_EQ(fallback.compute_dtype, dtype);
    EXPECT_EQ(fallback.plan.values.size(), fallback.graph.values.size());
    EXPECT_EQ(fallback.plan.persistent_bytes, 2 * 15 * static_cast<int64_t>(dtype_size(dtype)));
    const Program& first = split.stage_program(0);
    EXPECT_EQ(first.graph.weights.size(), 2u);
    ASSERT_EQ(first.graph.outputs.size(), 1u);  // relu: read by the fallback, the last partition and the outputs
    EXPECT_EQ(first.graph.value(first.graph.outputs[0]).name, "relu_1");
    size_t nodes = 0;
    for (size_t s = 0; s < split.stage_count(); ++s) nodes += split.stage_program(s).graph.nodes.size();
    EXPECT_EQ(nodes, c.program.graph.nodes.size());
    EXPECT_GT(split.planned_bytes(), 0);
    EXPECT_GT(split.allocated_bytes(), 0);
  }
}

TEST(DagExecutor, ReferenceBackendAsTheFallback) {
  const SplitModel model;
  const NamedTensors expected = ReferenceExecutor(model.b.graph(), model.weights(model.b.graph())).run(model.inputs());
  const Compiled c = compile(model.b.graph(), target_without("no-cumsum-ref", {"cumsum"}, "reference"));
  ASSERT_EQ(c.report.partitions.partitions.size(), 3u);
  EXPECT_EQ(c.report.partitions.partitions[1].backend, "reference");
  DagExecutor split(c.program, c.report.partitions, model.weights(c.program.graph));
  expect_close(split.run(model.inputs()), expected, 1e-6, "reference fallback");
  EXPECT_EQ(split.fallback_nodes(), (std::vector<std::string>{"cumsum_2 (cumsum)"}));
  EXPECT_EQ(make_partition_backend("reference")->capabilities().name, "reference");
  EXPECT_THROW(make_partition_backend("tpu"), Error);
}

// ids + 1 on the target, cumsum on the fallback, minus ids on the target: values beyond 2^53 survive only if the
// integers never pass through a float.
TEST(DagExecutor, IntegerValuesCrossPartitionsExactly) {
  GraphBuilder b;
  const ValueId ids = b.input("ids", {4}, DType::Int64);
  const ValueId plus = b.op("add", {ids}, make_attrs({{"other", int64_t{1}}}));
  const ValueId sums = b.op("cumsum", {plus}, make_attrs({{"dim", int64_t{0}}}));
  b.output(b.op("sub", {sums, ids}));
  const int64_t big = int64_t{1} << 53, huge = int64_t{1} << 60;
  Tensor in(DType::Int64, {4});
  const std::vector<int64_t> values = {big + 1, 3, -7, huge + 5};
  std::copy(values.begin(), values.end(), in.mutable_data<int64_t>());
  // plus = {2^53+2, 4, -6, 2^60+6}; sums = {2^53+2, 2^53+6, 2^53, 2^53+2^60+6}; minus ids:
  const std::vector<int64_t> expected = {1, big + 3, big + 7, big + 1};
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    const Compiled c = compile(b.graph(), target_without("no-cumsum", {"cumsum"}), dtype);
    ASSERT_EQ(c.report.partitions.partitions.size(), 3u);
    ASSERT_EQ(c.report.partitions.transfers.size(), 2u);
    EXPECT_EQ(c.report.partitions.transfer_bytes(), 2 * 4 * 8);
    DagExecutor split(c.program, c.report.partitions, {});
    split.set_profiling(true);
    const NamedTensors out = split.run({{"ids", in}});
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].second.dtype(), DType::Int64);
    EXPECT_EQ(std::vector<int64_t>(out[0].second.data<int64_t>(), out[0].second.data<int64_t>() + 4), expected);
    ASSERT_EQ(split.last_profile().transfers.size(), 2u);
    EXPECT_EQ(split.last_profile().transfers[0].bytes, 32);
  }
}

TEST(DagExecutor, PassThroughOutputsAndMissingInputs) {
  GraphBuilder b;
  const ValueId x = b.input("x", {2});
  const ValueId w = b.weight("w", {2});
  b.output(b.op("neg", {b.op("cumsum", {b.op("relu", {x})}, make_attrs({{"dim", int64_t{0}}}))}));
  b.output(x);
  b.output(w);
  const Compiled c = compile(b.graph(), target_without("no-cumsum", {"cumsum"}));
  ASSERT_EQ(c.report.partitions.partitions.size(), 3u);
  Tensor weight(DType::Float32, {2});
  weight.mutable_data<float>()[0] = 5.0f;
  weight.mutable_data<float>()[1] = -6.0f;
  DagExecutor split(c.program, c.report.partitions, {{w, weight}});
  Tensor in(DType::Float32, {2});
  in.mutable_data<float>()[0] = -1.0f;
  in.mutable_data<float>()[1] = 2.0f;
  const NamedTensors out = split.run({{"x", in}});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].second.data<float>()[0], -0.0f);  // -cumsum(relu(x)) = -{0, 2}
  EXPECT_EQ(out[0].second.data<float>()[1], -2.0f);
  EXPECT_EQ(out[1].first, "x");
  EXPECT_EQ(out[1].second.data<float>()[1], 2.0f);
  EXPECT_EQ(out[2].first, "w");
  EXPECT_EQ(out[2].second.data<float>()[1], -6.0f);
  try {
    split.run({});
    FAIL() << "a missing input must be an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("missing input 'x'"), std::string::npos) << error.what();
  }
}

// A cache updated in place run after run, through a program that runs whole; a split program refuses state.
TEST(DagExecutor, StateKeptBetweenRunsOfAWholeProgram) {
  GraphBuilder b;
  const ValueId cache = b.input("cache", {2});
  const ValueId x = b.input("x", {2});
  const ValueId next = b.op("add", {cache, x});
  b.output(next);
  b.output(b.op("neg", {next}));
  Tensor in(DType::Float32, {2});
  in.mutable_data<float>()[0] = 1.0f;
  in.mutable_data<float>()[1] = 2.0f;
  const Compiled whole = compile(b.graph(), "cpu");
  DagExecutor executor(whole.program, whole.report.partitions, {});
  executor.bind_state({{"cache", "add_0"}});
  executor.run({{"x", in}});
  const NamedTensors out = executor.run({{"x", in}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].first, "neg_1");
  EXPECT_EQ(out[0].second.data<float>()[0], -2.0f);
  EXPECT_EQ(out[0].second.data<float>()[1], -4.0f);
  const Tensor state = executor.read_state("cache");
  EXPECT_EQ(state.data<float>()[0], 2.0f);
  EXPECT_EQ(state.data<float>()[1], 4.0f);

  const Compiled split = compile(b.graph(), target_without("no-add", {"add"}));
  ASSERT_EQ(split.report.partitions.partitions.size(), 2u);
  DagExecutor partitioned(split.program, split.report.partitions, {});
  EXPECT_THROW(partitioned.bind_state({{"cache", "add_0"}}), Error);
  EXPECT_THROW(partitioned.read_state("cache"), Error);
}

TEST(DagExecutor, ProfileCountsEveryKernelOfTheProgram) {
  const SplitModel model;
  const Compiled c = compile(model.b.graph(), target_without("no-cumsum", {"cumsum"}));
  const compiler::PartitionPlan& plan = c.report.partitions;
  DagExecutor split(c.program, plan, model.weights(c.program.graph));
  split.set_profiling(true);
  split.run(model.inputs());
  const RunProfile& profile = split.last_profile();
  ASSERT_EQ(profile.kernels.size(), c.program.graph.nodes.size());
  EXPECT_EQ(split.last_timings().size(), c.program.graph.nodes.size());
  ASSERT_EQ(profile.partitions.size(), 3u);
  EXPECT_EQ(profile.partitions[1].label, "fallback (cpu)");
  EXPECT_EQ(profile.partitions[1].kernels, 1u);
  std::map<std::string, const KernelRecord*> by_node;
  for (const KernelRecord& k : profile.kernels) by_node[k.node] = &k;
  for (size_t n = 0; n < c.program.graph.nodes.size(); ++n) {
    const Node& node = c.program.graph.nodes[n];
    ASSERT_TRUE(by_node.count(node.name)) << node.name;
    const KernelRecord& k = *by_node[node.name];
    EXPECT_EQ(k.op, node.op);
    EXPECT_EQ(k.partition, plan.partition_of_node[n]) << node.name;
    const PartitionRecord& p = profile.partitions[static_cast<size_t>(k.partition)];
    EXPECT_GE(k.duration_us, 0.0);
    EXPECT_GE(k.start_us, p.start_us);
    EXPECT_LE(k.start_us + k.duration_us, p.start_us + p.duration_us + 1.0);
  }
  // relu [3, 5] fp32 reads and writes 15 floats; linear reads x, w and b and writes [3, 5]; 2·15·4 FLOPs.
  EXPECT_EQ(by_node["relu_1"]->bytes, 2 * 15 * 4);
  EXPECT_EQ(by_node["linear_0"]->bytes, (12 + 20 + 5 + 15) * 4);
  EXPECT_EQ(by_node["linear_0"]->flops, 2.0 * 15 * 4);
  EXPECT_EQ(by_node["relu_1"]->flops, 0.0);
  ASSERT_EQ(profile.transfers.size(), plan.transfers.size());
  for (size_t t = 0; t < plan.transfers.size(); ++t) {
    EXPECT_EQ(profile.transfers[t].bytes, plan.transfers[t].bytes);
    EXPECT_EQ(profile.transfers[t].to_partition, plan.transfers[t].before_partition);
  }
  EXPECT_GE(profile.total_us, profile.partitions.back().start_us);

  const std::string table = format_profile(profile);
  for (const char* fragment : {"kernel (op)", "cumsum", "linear", "total", "fallback (cpu)", "transfer (value)",
                               "relu_1", "#0 -> #1", "GFLOP/s"})
    EXPECT_NE(table.find(fragment), std::string::npos) << fragment << "\n" << table;

  // The whole program as one partition: the same count.
  const Compiled whole = compile(model.b.graph(), "cpu");
  DagExecutor single(whole.program, whole.report.partitions, model.weights(whole.program.graph));
  single.set_profiling(true);
  single.run(model.inputs());
  EXPECT_EQ(single.last_profile().kernels.size(), whole.program.graph.nodes.size());
  EXPECT_EQ(single.last_profile().partitions.size(), 1u);
  EXPECT_TRUE(single.last_profile().transfers.empty());
}

// ---- a real model: qwen_tiny decode with its norms, embedding and rotary embedding on the fallback ----

std::vector<std::pair<ValueId, Tensor>> tiny_weights(const Graph& graph) {
  WeightStore store;
  store.add_file(kFixtures + "/qwen_tiny/model.safetensors");
  store.set_config(ModelConfig::load(kFixtures + "/qwen_tiny/config.json"));
  return store.bind(graph).tensors;
}

TEST(DagExecutor, QwenTinyDecodeSplitMatchesTheSingleBackendRunAndTheReference) {
  const Graph graph = read_torch_ir(kFixtures + "/qwen_tiny/decode_ir.json");
  const SafetensorsFile reference = SafetensorsFile::open(kFixtures + "/qwen_tiny/decode_reference.safetensors");
  std::map<std::string, Tensor> inputs;
  for (ValueId id : graph.inputs) inputs[graph.value(id).name] = reference.get(graph.value(id).name);
  const std::string target = target_without("qwen-lite", {"rms_norm", "embedding", "rope", "index_copy"});
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    const std::string label = "qwen_tiny decode " + std::string(dtype_name(dtype));
    const Compiled c = compile(graph, target, dtype);
    const compiler::PartitionPlan& plan = c.report.partitions;
    EXPECT_GE(plan.partitions.size(), 5u) << label;
    EXPECT_GT(plan.fallback_nodes(), 4u) << label;
    EXPECT_FALSE(plan.transfers.empty()) << label;
    const auto weights = tiny_weights(c.program.graph);
    DagExecutor split(c.program, plan, weights);
    split.set_profiling(true);
    const NamedTensors actual = split.run(inputs);
    EXPECT_EQ(split.last_profile().kernels.size(), c.program.graph.nodes.size());
    expect_identical(actual, make_backend("cpu")->prepare(c.program, weights)->run(inputs), label);
    if (dtype != DType::Float32) continue;
    ASSERT_EQ(actual.size(), 5u);
    for (size_t i = 0; i < actual.size(); ++i) {
      const Comparison cmp = compare_tensors(actual[i].second, reference.get("out_" + std::to_string(i)));
      EXPECT_LE(cmp.max_abs_diff, 1e-4 * std::max(1.0, cmp.max_abs_reference))
          << label << " out_" << i << ": " << cmp.summary();
    }
  }
}

}  // namespace
}  // namespace npusim
