// The CPU backend as a runtime: memory plans (in place, views, plans it must repair), storage dtypes, inputs and
// outputs, weights (bound, folded constants, derived at load time), errors, profiling and the fallback count.
// Op-by-op numerics live in test_conformance.
#include <gtest/gtest.h>

#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/packed_gemm.h"
#include "backends/cpu/storage.h"
#include "compiler/graph_edit.h"
#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "npusim/op_registry.h"
#include "runtime/reference_executor.h"
#include "unit/error_expectations.h"

namespace npusim {
namespace {

AttrValue I(int64_t v) { return AttrValue{v}; }
AttrValue F(double v) { return AttrValue{v}; }
AttrValue S(const char* v) { return AttrValue{std::string(v)}; }

// Builds small graphs node by node with the registry's shape inference.
class Builder {
 public:
  Builder() { graph_.source = "test.json"; }

  ValueId input(const std::string& name, Shape shape, DType dtype = DType::Float32) {
    const ValueId id = compiler::add_value(graph_, name, {std::move(shape), dtype}, ValueKind::GraphInput);
    graph_.inputs.push_back(id);
    return id;
  }

  ValueId weight(const std::string& key, Shape shape, DType dtype = DType::Float32) {
    const ValueId id = compiler::add_value(graph_, key, {std::move(shape), dtype}, ValueKind::Weight);
    graph_.value(id).weight_key = key;
    graph_.weights.push_back(id);
    return id;
  }

  std::vector<ValueId> nodes(const std::string& op, const std::string& name, std::vector<ValueId> inputs,
                             std::initializer_list<std::pair<const char*, AttrValue>> values = {}) {
    const OpDef* def = OpRegistry::instance().find(op);
    Attrs attrs;
    for (const auto& [key, value] : values) attrs.set(key, value);
    OpRegistry::instance().normalize_attrs(*def, nullptr, attrs, name);
    std::vector<TensorMeta> metas;
    for (ValueId id : inputs) metas.push_back(graph_.value(id).meta);
    const std::vector<TensorMeta> outputs = def->infer(attrs, metas);
    std::vector<std::string> names;
    for (size_t i = 0; i < outputs.size(); ++i) names.push_back(name + (i ? "_" + std::to_string(i) : ""));
    Node node = compiler::make_node(graph_, op, name, attrs, std::move(inputs), outputs, names);
    const std::vector<ValueId> result = node.outputs;
    graph_.nodes.push_back(std::move(node));
    compiler::renumber_producers(graph_);
    return result;
  }

  ValueId node(const std::string& op, const std::string& name, std::vector<ValueId> inputs,
               std::initializer_list<std::pair<const char*, AttrValue>> values = {}) {
    return nodes(op, name, std::move(inputs), values).at(0);
  }

  Graph finish(std::vector<ValueId> outputs) {
    graph_.outputs = std::move(outputs);
    return graph_;
  }

 private:
  Graph graph_;
};

Program program_for(Graph graph, DType storage = DType::Float32) {
  Program program;
  program.compute_dtype = storage;
  program.plan = compiler::plan_memory(graph, storage);
  program.graph = std::move(graph);
  return program;
}

Tensor floats(Shape shape, std::vector<float> values) {
  Tensor t(DType::Float32, std::move(shape));
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

Tensor int64s(Shape shape, std::vector<int64_t> values) {
  Tensor t(DType::Int64, std::move(shape));
  std::copy(values.begin(), values.end(), t.mutable_data<int64_t>());
  return t;
}

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> values;
  for (int64_t i = 0; i < t.numel(); ++i) values.push_back(t.element_as_double(i));
  return values;
}

std::unique_ptr<PreparedProgram> prepare(const Program& program,
                                         const std::vector<std::pair<ValueId, Tensor>>& weights = {}, int threads = 0) {
  cpu::CpuBackend backend({.threads = threads, .poison_memory = true});
  return backend.prepare(program, weights);
}

using test::expect_error;

// x -> add 1 -> relu -> mul 2, every step planned in place over the previous one.
Graph chain() {
  Builder b;
  const ValueId x = b.input("x", {2, 3});
  const ValueId sum = b.node("add", "add", {x}, {{"other", F(1.0)}});
  const ValueId relu = b.node("relu", "relu", {sum});
  return b.finish({b.node("mul", "mul", {relu}, {{"other", F(2.0)}})});
}

TEST(CpuBackend, MakeBackendKnowsCpuAndNamesUnknownBackends) {
  EXPECT_EQ(make_backend("cpu")->capabilities().name, "cpu");
  expect_error([] { make_backend("tpu"); }, {"'tpu'", "cpu"});
}

TEST(CpuBackend, CapabilitiesListKernelsAndTheFallback) {
  const BackendCapabilities caps = make_backend("cpu")->capabilities();
  for (const char* op : {"conv2d", "fused_conv2d", "linear", "matmul", "softmax", "rms_norm", "attention", "cat"})
    EXPECT_TRUE(caps.has_kernel(op)) << op;
  EXPECT_FALSE(caps.has_kernel("cumsum"));
  EXPECT_TRUE(caps.supports("cumsum"));  // on the reference fallback
  EXPECT_FALSE(caps.supports("no_such_op"));
  EXPECT_EQ(caps.compute_dtypes, (std::vector<DType>{DType::Float32, DType::Float16, DType::BFloat16}));
}

TEST(CpuBackend, RunsAnInPlaceChainInEveryStorageDtype) {
  const Graph graph = chain();
  const Program fp32 = program_for(graph);
  EXPECT_TRUE(fp32.plan.values[static_cast<size_t>(graph.nodes[1].outputs[0])].in_place);
  for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
    const auto prepared = prepare(program_for(graph, storage));
    EXPECT_TRUE(prepared->fallback_nodes().empty());
    const NamedTensors out = prepared->run({{"x", floats({2, 3}, {1, -2, 3, -4, 5.5, -6})}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].first, "mul");
    EXPECT_EQ(out[0].second.dtype(), DType::Float32);
    EXPECT_EQ(out[0].second.shape(), (Shape{2, 3}));
    EXPECT_EQ(values_of(out[0].second), (std::vector<double>{4, 0, 8, 0, 13, 0}));
  }
}

TEST(CpuBackend, ReportsPlannedAndAllocatedBytes) {
  const Program program = program_for(chain());
  const auto prepared = prepare(program);
  EXPECT_EQ(prepared->planned_bytes(), program.plan.arena_bytes + program.plan.persistent_bytes);
  EXPECT_GE(prepared->allocated_bytes(), prepared->planned_bytes());
  EXPECT_EQ(program.plan.persistent_bytes, 2 * 6 * 4);  // x and the output
}

TEST(CpuBackend, MovesValuesAPlanWouldCorrupt) {
  // x -> add -> a -> transpose -> b -> mul -> out, with b wrongly placed over a: a transpose cannot run in place.
  Builder builder;
  const ValueId x = builder.input("x", {2, 3});
  const ValueId a = builder.node("add", "add", {x}, {{"other", F(1.0)}});
  const ValueId t = builder.node("transpose", "transpose", {a}, {{"dim0", I(0)}, {"dim1", I(1)}});
  const Graph graph = builder.finish({builder.node("mul", "mul", {t}, {{"other", F(10.0)}})});
  Program program = program_for(graph);
  auto& slots = program.plan.values;
  ASSERT_EQ(slots[static_cast<size_t>(a)].placement, compiler::Placement::Arena);
  ASSERT_EQ(slots[static_cast<size_t>(t)].placement, compiler::Placement::Arena);
  slots[static_cast<size_t>(t)].offset = slots[static_cast<size_t>(a)].offset;
  const NamedTensors out = prepare(program)->run({{"x", floats({2, 3}, {0, 1, 2, 3, 4, 5})}});
  EXPECT_EQ(values_of(out[0].second), (std::vector<double>{10, 40, 20, 50, 30, 60}));
}

TEST(CpuBackend, ViewsShareTheirInputsMemory) {
  Builder builder;
  const ValueId x = builder.input("x", {2, 3});
  const ValueId a = builder.node("add", "add", {x}, {{"other", F(1.0)}});
  const ValueId r = builder.node("reshape", "reshape", {a}, {{"shape", AttrValue{std::vector<int64_t>{3, 2}}}});
  const Graph graph = builder.finish({builder.node("mul", "mul", {r}, {{"other", F(2.0)}})});
  const Program program = program_for(graph);
  EXPECT_EQ(program.plan.values[static_cast<size_t>(r)].placement, compiler::Placement::View);
  const NamedTensors out = prepare(program)->run({{"x", floats({2, 3}, {0, 1, 2, 3, 4, 5})}});
  EXPECT_EQ(out[0].second.shape(), (Shape{3, 2}));
  EXPECT_EQ(values_of(out[0].second), (std::vector<double>{2, 4, 6, 8, 10, 12}));
}

TEST(CpuBackend, IntegersAreInt64AndBoolsBoolWhateverTheFloatStorage) {
  // The planner sizes the int32 value at 4 bytes an element; the backend stores it as int64 elsewhere.
  Builder builder;
  const ValueId x = builder.input("x", {4});
  const ValueId n = builder.node("to", "to", {x}, {{"dtype", S("torch.int32")}});
  const ValueId sum = builder.node("add", "add", {n}, {{"other", I(1)}});
  const ValueId negative = builder.node("lt", "lt", {x}, {{"other", F(0.0)}});
  const Graph graph = builder.finish({sum, negative});
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    const NamedTensors out = prepare(program_for(graph, storage))->run({{"x", floats({4}, {1.5, -2.75, 7.5, 0})}});
    EXPECT_EQ(out[0].second.dtype(), DType::Int64);
    EXPECT_EQ(values_of(out[0].second), (std::vector<double>{2, -1, 8, 1}));
    EXPECT_EQ(out[1].second.dtype(), DType::Bool);
    EXPECT_EQ(values_of(out[1].second), (std::vector<double>{0, 1, 0, 0}));
  }
}

TEST(CpuBackend, ChecksInputsByNameShapeAndKind) {
  const auto prepared = prepare(program_for(chain()));
  expect_error([&] { prepared->run({}); }, {"missing input 'x'"});
  expect_error([&] { prepared->run({{"x", floats({3, 2}, {0, 0, 0, 0, 0, 0})}}); }, {"'x'", "[3, 2]", "[2, 3]"});
  expect_error([&] { prepared->run({{"x", int64s({2, 3}, {0, 0, 0, 0, 0, 0})}}); }, {"'x'", "int64"});
  expect_error(
      [&] {
        prepared->run({{"x", floats({2, 3}, {0, 0, 0, 0, 0, 0})}, {"y", floats({1}, {0})}});
      },
      {"'y'", "not an input"});
  // Other float widths are converted.
  const Tensor bf16 = floats({2, 3}, {1, 2, 3, 4, 5, 6}).to(DType::BFloat16);
  EXPECT_EQ(values_of(prepared->run({{"x", bf16}})[0].second), (std::vector<double>{4, 6, 8, 10, 12, 14}));
}

TEST(CpuBackend, RunsAgainWithNewInputs) {
  const auto prepared = prepare(program_for(chain()));
  EXPECT_EQ(values_of(prepared->run({{"x", floats({2, 3}, {1, 1, 1, 1, 1, 1})}})[0].second),
            (std::vector<double>{4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(values_of(prepared->run({{"x", floats({2, 3}, {0, 1, 2, 3, 4, -9})}})[0].second),
            (std::vector<double>{2, 4, 6, 8, 10, 0}));
}

TEST(CpuBackend, KernelErrorsNameTheNode) {
  Builder builder;
  const ValueId table = builder.weight("table", {4, 2});
  const ValueId ids = builder.input("ids", {3}, DType::Int64);
  const Graph graph = builder.finish({builder.node("embedding", "embed_tokens", {table, ids})});
  const auto prepared = prepare(program_for(graph), {{table, floats({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7})}});
  EXPECT_EQ(values_of(prepared->run({{"ids", int64s({3}, {3, 0, 1})}})[0].second),
            (std::vector<double>{6, 7, 0, 1, 2, 3}));
  expect_error(
      [&] {
        prepared->run({{"ids", int64s({3}, {0, 4, 1})}});
      },
      {"test.json", "'embed_tokens'", "index 4 is out of range"});
}

TEST(CpuBackend, CountsNodesOnTheReferenceFallback) {
  Builder builder;
  const ValueId x = builder.input("x", {4});
  const ValueId sums = builder.node("cumsum", "running_total", {x}, {{"dim", I(0)}});
  const Graph graph = builder.finish({builder.node("mul", "double", {sums}, {{"other", F(2.0)}})});
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    const auto prepared = prepare(program_for(graph, storage));
    EXPECT_EQ(prepared->fallback_nodes(), (std::vector<std::string>{"running_total (cumsum)"}));
    EXPECT_EQ(values_of(prepared->run({{"x", floats({4}, {1, 2, 3, -4})}})[0].second),
              (std::vector<double>{2, 6, 12, 4}));
  }
}

TEST(CpuBackend, ProfilingTimesEveryKernel) {
  const Graph graph = chain();
  const auto prepared = prepare(program_for(graph));
  const Tensor x = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  prepared->run({{"x", x}});
  for (const KernelTiming& timing : prepared->last_timings()) EXPECT_EQ(timing.milliseconds, 0.0);
  prepared->set_profiling(true);
  prepared->run({{"x", x}});
  const std::vector<KernelTiming> timings = prepared->last_timings();
  ASSERT_EQ(timings.size(), graph.nodes.size());
  for (size_t i = 0; i < timings.size(); ++i) {
    EXPECT_EQ(timings[i].node, graph.nodes[i].name);
    EXPECT_EQ(timings[i].op, graph.nodes[i].op);
    EXPECT_GE(timings[i].milliseconds, 0.0);
  }
}

TEST(CpuBackend, ChecksWeights) {
  Builder builder;
  const ValueId x = builder.input("x", {1, 3});
  const ValueId weight = builder.weight("fc.weight", {2, 3});
  const Graph graph = builder.finish({builder.node("linear", "fc", {x, weight})});
  const Program program = program_for(graph);
  expect_error([&] { prepare(program); }, {"'fc.weight'", "'fc'", "no value"});
  expect_error(
      [&] {
        prepare(program, {{weight, floats({3, 2}, {0, 0, 0, 0, 0, 0})}});
      },
      {"'fc.weight'", "[3, 2]", "[2, 3]"});
  expect_error([&] { prepare(program, {{x, floats({1, 3}, {0, 0, 0})}}); }, {"not a weight"});
  // A bf16 checkpoint tensor is converted once.
  const auto prepared = prepare(program, {{weight, floats({2, 3}, {1, 0, 0, 0, 1, 1}).to(DType::BFloat16)}});
  EXPECT_EQ(values_of(prepared->run({{"x", floats({1, 3}, {2, 3, 4})}})[0].second), (std::vector<double>{2, 7}));
}

TEST(CpuBackend, UsesFoldedConstantsAndDerivesFoldedWeights) {
  // conv (no bias) -> batch_norm, folded by the compiler into a conv with load-time weight and bias.
  Builder builder;
  const ValueId x = builder.input("x", {1, 1, 2, 2});
  const ValueId kernel = builder.weight("conv.weight", {2, 1, 1, 1});
  const ValueId gamma = builder.weight("bn.weight", {2});
  const ValueId beta = builder.weight("bn.bias", {2});
  const ValueId mean = builder.weight("bn.running_mean", {2});
  const ValueId var = builder.weight("bn.running_var", {2});
  const ValueId conv = builder.node("conv2d", "conv", {x, kernel});
  Graph graph = builder.finish({builder.node("batch_norm", "bn", {conv, gamma, beta, mean, var}, {{"eps", F(0.0)}})});
  const std::vector<std::pair<ValueId, Tensor>> weights = {{kernel, floats({2, 1, 1, 1}, {1, 2})},
                                                           {gamma, floats({2}, {2, 1})},
                                                           {beta, floats({2}, {1, -1})},
                                                           {mean, floats({2}, {1, 0})},
                                                           {var, floats({2}, {4, 1})}};
  const Tensor input = floats({1, 1, 2, 2}, {1, 2, 3, 4});
  // channel 0: (x - 1) * 2 / 2 + 1 = x; channel 1: 2x - 1
  const std::vector<double> expected{1, 2, 3, 4, 1, 3, 5, 7};
  compiler::PassContext context;
  compiler::fold_batchnorm(graph, context);
  ASSERT_EQ(graph.nodes.size(), 1u);
  EXPECT_EQ(values_of(prepare(program_for(graph), weights)->run({{"x", input}})[0].second), expected);

  // The same graph with the kernel as a constant embedded in the graph instead of a bound weight.
  graph.constants["conv.weight"] = weights[0].second;
  const std::vector<std::pair<ValueId, Tensor>> without_kernel(weights.begin() + 1, weights.end());
  EXPECT_EQ(values_of(prepare(program_for(graph), without_kernel)->run({{"x", input}})[0].second), expected);
}

// Preparing counts its time and the weights it packs: a 3x3 convolution over 8 channels (too few for Winograd)
// packs its 16 x 72 weight as A, 3 panels of 6 rows x 72 depths; the packed weights outlive the backend object and
// the result matches the reference executor, element by element.
TEST(CpuBackend, ReportsThePrepareCostAndPackedBytes) {
  Builder builder;
  const ValueId x = builder.input("x", {1, 8, 12, 12});
  const ValueId kernel = builder.weight("conv.weight", {16, 8, 3, 3});
  const Graph graph =
      builder.finish({builder.node("conv2d", "conv", {x, kernel}, {{"padding", AttrValue{std::vector<int64_t>{1}}}})});
  Tensor w(DType::Float32, {16, 8, 3, 3}), input(DType::Float32, {1, 8, 12, 12});
  for (int64_t i = 0; i < w.numel(); ++i) w.mutable_data<float>()[i] = static_cast<float>((i * 37 % 19) - 9) / 8.0f;
  for (int64_t i = 0; i < input.numel(); ++i)
    input.mutable_data<float>()[i] = static_cast<float>((i * 53 % 23) - 11) / 4.0f;
  std::unique_ptr<PreparedProgram> prepared = prepare(program_for(graph), {{kernel, w}}, 2);
  const PrepareCost cost = prepared->prepare_cost();
  EXPECT_GT(cost.milliseconds, 0.0);
  EXPECT_EQ(cost.packed_bytes, int64_t{3 * 6 * 72 * 4});
  const Tensor actual = prepared->run({{"x", input}})[0].second;
  const ReferenceExecutor reference(graph, {{kernel, w}});
  const Tensor expected = reference.run({{"x", input}})[0].second;
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_NEAR(actual.element_as_double(i), expected.element_as_double(i), 1e-4) << i;
}

// A bf16 linear weight that products read on the AVX2 tile is packed at prepare time too, and counted.
TEST(CpuBackend, CountsBf16WeightsPackedForTheAvx2Tile) {
  if (!cpu::gemm_kernel_supported(cpu::GemmKernelChoice::Avx2)) GTEST_SKIP() << "needs AVX2";
  Builder builder;
  const ValueId x = builder.input("x", {9, 24}, DType::BFloat16);
  const ValueId weight = builder.weight("fc.weight", {20, 24}, DType::BFloat16);
  const Graph graph = builder.finish({builder.node("linear", "fc", {x, weight})});
  Tensor w(DType::Float32, {20, 24}), input(DType::Float32, {9, 24});
  for (int64_t i = 0; i < w.numel(); ++i) w.mutable_data<float>()[i] = static_cast<float>((i * 37 % 19) - 9) / 8.0f;
  for (int64_t i = 0; i < input.numel(); ++i)
    input.mutable_data<float>()[i] = static_cast<float>((i * 53 % 23) - 11) / 4.0f;
  const Tensor w16 = w.to(DType::BFloat16), input16 = input.to(DType::BFloat16);
  cpu::set_gemm_kernel_choice(cpu::GemmKernelChoice::Avx2);
  std::unique_ptr<PreparedProgram> prepared = prepare(program_for(graph, DType::BFloat16), {{weight, w16}}, 2);
  EXPECT_EQ(prepared->prepare_cost().packed_bytes, int64_t{2 * 24 * 16 * 2});  // two panels of 16 columns
  const Tensor actual = prepared->run({{"x", input16}})[0].second;
  prepared.reset();
  cpu::set_gemm_kernel_choice(cpu::GemmKernelChoice::Best);
  EXPECT_EQ(cpu::prepacked_weight_bytes(), 0);
  const Tensor expected = ReferenceExecutor(graph, {{weight, w16}}).run({{"x", input16}})[0].second;
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_NEAR(actual.element_as_double(i), expected.element_as_double(i),
                1e-6 + std::abs(expected.element_as_double(i)) / 128)  // bf16 outputs, rounded apart
        << i;
}

TEST(CpuBackend, ThreadCountsDoNotChangeResults) {
  Builder builder;
  const ValueId x = builder.input("x", {64, 96});
  const ValueId weight = builder.weight("w", {160, 96});
  const ValueId y = builder.node("linear", "fc", {x, weight});
  const Graph graph = builder.finish({builder.node("softmax", "softmax", {y}, {{"dim", I(-1)}})});
  Tensor input(DType::Float32, {64, 96}), w(DType::Float32, {160, 96});
  for (int64_t i = 0; i < input.numel(); ++i)
    input.mutable_data<float>()[i] = static_cast<float>((i * 37 % 101) - 50) / 25.0f;
  for (int64_t i = 0; i < w.numel(); ++i) w.mutable_data<float>()[i] = static_cast<float>((i * 53 % 89) - 44) / 40.0f;
  for (const DType storage : {DType::Float32, DType::BFloat16}) {
    const Program program = program_for(graph, storage);
    const Tensor one = prepare(program, {{weight, w}}, 1)->run({{"x", input}})[0].second;
    const Tensor four = prepare(program, {{weight, w}}, 4)->run({{"x", input}})[0].second;
    EXPECT_EQ(values_of(one), values_of(four));
  }
}

TEST(CpuBackend, UpdatesACacheInPlace) {
  Builder builder;
  const ValueId cache = builder.input("cache", {1, 4, 2});
  const ValueId position = builder.input("position", {1}, DType::Int64);
  const ValueId update = builder.input("update", {1, 1, 2});
  const Graph graph = builder.finish({builder.node("index_copy", "store", {cache, position, update}, {{"dim", I(1)}})});
  const auto prepared = prepare(program_for(graph));
  const NamedTensors out = prepared->run({{"cache", floats({1, 4, 2}, {1, 1, 2, 2, 3, 3, 4, 4})},
                                          {"position", int64s({1}, {2})},
                                          {"update", floats({1, 1, 2}, {9, 8})}});
  EXPECT_EQ(values_of(out[0].second), (std::vector<double>{1, 1, 2, 2, 9, 8, 4, 4}));
  expect_error(
      [&] {
        prepared->run({{"cache", floats({1, 4, 2}, {0, 0, 0, 0, 0, 0, 0, 0})},
                       {"position", int64s({1}, {4})},
                       {"update", floats({1, 1, 2}, {9, 8})}});
      },
      {"'store'", "index 4 is out of range"});
}

TEST(CpuBackend, RejectsWhatItCannotRun) {
  Graph graph = chain();
  expect_error([&] { prepare(program_for(graph, DType::Float64)); }, {"compute dtype", "float64"});
  Program bad_plan = program_for(graph);
  bad_plan.plan.values.pop_back();
  expect_error([&] { prepare(bad_plan); }, {"memory plan"});
  Node unknown;
  unknown.name = "frob";
  unknown.op = unknown.source_op = "aten.frobnicate.default";
  unknown.inputs = graph.outputs;
  unknown.outputs = {compiler::add_value(graph, "frob", {{2, 3}, DType::Float32}, ValueKind::NodeOutput)};
  graph.nodes.push_back(unknown);
  compiler::renumber_producers(graph);
  graph.outputs = unknown.outputs;
  expect_error([&] { prepare(program_for(graph)); }, {"unsupported", "aten.frobnicate.default"});
}

// The vectorized storage conversions give the bits of the core's scalar helpers (NaN stays NaN).
TEST(CpuBackend, StorageConversionsMatchTheCoreHelpers) {
  std::vector<float> values = {0.0f,  -0.0f, 1.0f,  -1.5f,    65504.0f,  65520.0f,
                               1e-8f, 6e-8f, 3e38f, INFINITY, -INFINITY, NAN};
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65537) {
    const auto word = static_cast<uint32_t>(bits);
    float value;
    std::memcpy(&value, &word, sizeof value);
    values.push_back(value);
  }
  const auto count = static_cast<int64_t>(values.size());
  std::vector<uint16_t> half(values.size()), brain(values.size());
  cpu::from_float(values.data(), reinterpret_cast<std::byte*>(half.data()), cpu::Elem::F16, count);
  cpu::from_float(values.data(), reinterpret_cast<std::byte*>(brain.data()), cpu::Elem::BF16, count);
  std::vector<float> half_back(values.size()), brain_back(values.size());
  cpu::to_float(reinterpret_cast<const std::byte*>(half.data()), cpu::Elem::F16, half_back.data(), count);
  cpu::to_float(reinterpret_cast<const std::byte*>(brain.data()), cpu::Elem::BF16, brain_back.data(), count);
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      EXPECT_TRUE(std::isnan(half_back[i]) && std::isnan(brain_back[i])) << i;
      continue;
    }
    ASSERT_EQ(half[i], float_to_fp16(values[i])) << values[i];
    ASSERT_EQ(brain[i], float_to_bf16(values[i])) << values[i];
    const float expected_half = fp16_to_float(half[i]), expected_brain = bf16_to_float(brain[i]);
    ASSERT_EQ(std::memcmp(&half_back[i], &expected_half, sizeof(float)), 0) << values[i];
    ASSERT_EQ(std::memcmp(&brain_back[i], &expected_brain, sizeof(float)), 0) << values[i];
  }
}

}  // namespace
}  // namespace npusim
