// Coverage per backend as data, where each node runs, and the partitioner: maximal convex partitions without
// cycles (checked on random DAGs against an exhaustive search), transfers only where a value changes side, the
// report, and docs/ops.md generated from the coverage.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/graph_edit.h"
#include "compiler/partition.h"
#include "npusim/op_registry.h"
#include "runtime/backend.h"
#include "runtime/coverage.h"
#include "unit/graph_test_util.h"
#include "work_dir.h"

namespace npusim {
namespace {

using compiler::Side;

// ====================================================================================================================
// Building graphs by hand

using test::GraphBuilder;
using test::make_attrs;

compiler::Target test_target(std::set<std::string> ops, std::string fallback = "cpu") {
  compiler::Target target;
  target.name = "npu-test";
  target.backend = "cpu";
  target.all_ops = false;
  target.ops = std::move(ops);
  target.fallback = std::move(fallback);
  return target;
}

bool contains(const std::string& text, const std::string& fragment) { return text.find(fragment) != std::string::npos; }

// ====================================================================================================================
// Coverage

TEST(Coverage, CpuCoversEveryRegistryOpAndMarksItsKernels) {
  const BackendCoverage cpu = backend_coverage("cpu");
  EXPECT_EQ(cpu.backend, "cpu");
  EXPECT_EQ(cpu.compute_dtypes, (std::vector<DType>{DType::Float32, DType::Float16, DType::BFloat16}));
  EXPECT_TRUE(cpu.dtypes.empty());  // every dtype
  const std::vector<std::string> kernels = make_backend("cpu")->capabilities().ops;
  size_t registry_ops = 0;
  for (const OpDef* def : OpRegistry::instance().all()) {
    ++registry_ops;
    const OpCoverage* op = cpu.find(def->name);
    ASSERT_NE(op, nullptr) << def->name;
    const bool has_kernel = std::find(kernels.begin(), kernels.end(), def->name) != kernels.end();
    EXPECT_EQ(op->kernel, has_kernel) << def->name;
    EXPECT_TRUE(op->dtypes.empty() && op->attrs.empty()) << def->name;
  }
  EXPECT_EQ(cpu.ops.size(), registry_ops);
  EXPECT_EQ(cpu.find("frobnicate"), nullptr);
}

TEST(Coverage, ReferenceRunsEveryOpWithFloat32Storage) {
  const BackendCoverage reference = backend_coverage("reference");
  EXPECT_EQ(reference.ops.size(), OpRegistry::instance().all().size());
  EXPECT_TRUE(reference.supports_compute_dtype(DType::Float32));
  EXPECT_FALSE(reference.supports_compute_dtype(DType::BFloat16));
  GraphBuilder b;
  b.output(b.op("relu", {b.input("x", {2})}));
  const Node& relu = b.graph().nodes[0];
  EXPECT_FALSE(reference.unsupported_reason(b.graph(), relu, DType::Float32));
  const auto reason = reference.unsupported_reason(b.graph(), relu, DType::BFloat16);
  ASSERT_TRUE(reason);
  EXPECT_TRUE(contains(*reason, "does not store activations as bfloat16")) << *reason;
  EXPECT_EQ(coverage_backend_names(), (std::vector<std::string>{"cpu", "cuda", "reference"}));
  EXPECT_THROW(backend_coverage("tpu"), Error);
}

TEST(Coverage, OtherBackendsCoverWhatTheirCapabilitiesSay) {
  BackendCapabilities caps;
  caps.name = "npu";
  caps.compute_dtypes = {DType::Float16};
  caps.ops = {"relu", "add"};
  const BackendCoverage kernels_only = coverage_from_capabilities(caps);
  EXPECT_EQ(kernels_only.backend, "npu");
  EXPECT_EQ(kernels_only.compute_dtypes, std::vector<DType>{DType::Float16});
  ASSERT_EQ(kernels_only.ops.size(), 2u);
  EXPECT_TRUE(kernels_only.find("relu")->kernel && kernels_only.find("add")->kernel);
  caps.reference_fallback = true;
  const BackendCoverage with_fallback = coverage_from_capabilities(caps);
  EXPECT_EQ(with_fallback.ops.size(), OpRegistry::instance().all().size());
  EXPECT_TRUE(with_fallback.find("add")->kernel);
  EXPECT_FALSE(with_fallback.find("cumsum")->kernel);
}

TEST(Coverage, DeclaredDtypesAndAttributeRangesDecide) {
  const BackendCoverage npu = parse_coverage(R"({"backend": "npu", "compute_dtypes": ["float32", "float16"],
      "dtypes": ["float32", "float16", "int64", "bool"],
      "ops": ["relu", {"op": "softmax", "attrs": {"dim": {"min": -1, "max": -1}}},
              {"op": "cumsum", "dtypes": ["int64"]},
              {"op": "amax", "attrs": {"dim": {"min": -2, "max": 0}}}]})",
                                             "npu.json");
  EXPECT_EQ(npu.ops.size(), 4u);
  EXPECT_EQ(npu.find("softmax")->attrs[0].describe(), "dim in [-1, -1]");
  GraphBuilder b;
  const ValueId x = b.input("x", {2, 3});
  const ValueId ids = b.input("ids", {4}, DType::Int64);
  const ValueId small = b.input("small", {4}, DType::Int32);
  b.op("relu", {x});
  b.op("softmax", {x}, make_attrs({{"dim", int64_t{-1}}}));
  b.op("softmax", {x}, make_attrs({{"dim", int64_t{1}}}));
  b.op("cumsum", {x}, make_attrs({{"dim", int64_t{1}}}));
  b.op("cumsum", {ids}, make_attrs({{"dim", int64_t{0}}}));
  b.op("amax", {x}, make_attrs({{"dim", std::vector<int64_t>{-1, 0}}}));
  b.op("amax", {x}, make_attrs({{"dim", std::vector<int64_t>{0, 1}}}));
  b.op("neg", {x});
  b.op("relu", {small});
  const Graph& g = b.graph();
  auto reason = [&](size_t node, DType compute = DType::Float32) {
    return npu.unsupported_reason(g, g.nodes[node], compute).value_or("");
  };
  EXPECT_EQ(reason(0), "");
  EXPECT_EQ(reason(0, DType::Float16), "");  // x is stored as float16 there
  EXPECT_TRUE(contains(reason(0, DType::BFloat16), "does not store activations as bfloat16")) << reason(0);
  EXPECT_EQ(reason(1), "");
  EXPECT_TRUE(contains(reason(2), "only with dim in [-1, -1]: attribute dim = 1 is outside")) << reason(2);
  EXPECT_TRUE(contains(reason(3), "does not run 'cumsum' on float32 ('x')")) << reason(3);
  EXPECT_EQ(reason(4), "");
  EXPECT_EQ(reason(5), "");  // every element of a list attribute is in range
  EXPECT_TRUE(contains(reason(6), "dim in [-2, 0]")) << reason(6);
  EXPECT_TRUE(contains(reason(7), "has no kernel for op 'neg'")) << reason(7);
  EXPECT_TRUE(contains(reason(8), "on int32 ('small')")) << reason(8);
}

TEST(Coverage, BadDeclarationsAreErrors) {
  auto expect_error = [](const std::string& json, const std::string& fragment) {
    try {
      parse_coverage(json, "c.json");
      ADD_FAILURE() << "accepted " << json;
    } catch (const Error& error) {
      EXPECT_TRUE(contains(error.what(), "c.json")) << error.what();
      EXPECT_TRUE(contains(error.what(), fragment)) << json << " -> " << error.what();
    }
  };
  expect_error("{", "not valid JSON");
  expect_error("[]", "must be a JSON object");
  expect_error(R"({"ops": "*"})", "missing string field 'backend'");
  expect_error(R"({"backend": "b", "speed": 1})", "unknown field 'speed'");
  expect_error(R"({"backend": "b", "dtypes": ["float33"]})", "unknown dtype \"float33\"");
  expect_error(R"({"backend": "b", "compute_dtypes": ["int64"]})", "must be float32, float16 or bfloat16");
  expect_error(R"({"backend": "b", "ops": "some"})", "'ops' must be");
  expect_error(R"({"backend": "b", "ops": [3]})", "each entry of 'ops'");
  expect_error(R"({"backend": "b", "ops": ["frobnicate"]})", "unknown op 'frobnicate'");
  expect_error(R"({"backend": "b", "ops": ["relu", "relu"]})", "listed twice");
  expect_error(R"({"backend": "b", "ops": [{"op": "relu", "speed": 2}]})", "unknown field 'speed'");
  expect_error(R"({"backend": "b", "ops": [{"op": "softmax", "attrs": {"dim": {"min": 1, "max": 0}}}]})", "is empty");
  expect_error(R"({"backend": "b", "ops": [{"op": "softmax", "attrs": {"dim": {"low": 1}}}]})", "unknown field 'low'");
  expect_error(R"({"backend": "b", "ops": [{"op": "softmax", "attrs": {"dim": {"min": "a"}}}]})", "must be a number");
  expect_error(R"({"backend": "b", "ops": [{"op": "softmax", "attrs": {"dim": 1}}]})", "must be an object");
}

TEST(Coverage, TableShowsWhereATargetRunsEachOp) {
  const std::vector<BackendCoverage> backends = builtin_coverages();
  const compiler::Target target = test_target({"relu", "add"});
  const std::string table = format_coverage_table(backends, &target);
  auto row = [&](const std::string& op) {
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind(op + " ", 0) == 0) return line;
    return std::string();
  };
  EXPECT_TRUE(contains(table, "target npu-test: backend cpu, 2 ops, fallback cpu")) << table;
  EXPECT_TRUE(row("relu").ends_with(" yes")) << row("relu");
  EXPECT_TRUE(row("cumsum").ends_with(" fallback cpu")) << row("cumsum");
  EXPECT_TRUE(contains(row("cumsum"), " kernel ") || contains(row("cumsum"), " generic ")) << row("cumsum");
  const compiler::Target alone = test_target({"relu"}, "");
  const std::string strict = format_coverage_table(backends, &alone);
  EXPECT_TRUE(contains(strict, "fallback none")) << strict;
  std::istringstream lines(strict);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("cumsum ", 0) == 0) EXPECT_TRUE(line.ends_with(" no")) << line;
}

// docs/ops.md is generated, never edited: regenerate with `npusim ops --markdown > docs/ops.md`.
TEST(Coverage, DocsOpsMdIsUpToDate) {
  const std::filesystem::path path =
      std::filesystem::path(NPUSIM_TEST_DATA).parent_path().parent_path() / "docs" / "ops.md";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path << " is missing: run `npusim ops --markdown > docs/ops.md`";
  std::stringstream text;
  text << file.rdbuf();
  const std::string expected = coverage_markdown(builtin_coverages());
  EXPECT_TRUE(text.str() == expected) << path << " is out of date: run `npusim ops --markdown > docs/ops.md`";
  for (const OpDef* def : OpRegistry::instance().all()) EXPECT_TRUE(contains(expected, "| `" + def->name + "` |"));
}

// ====================================================================================================================
// Placement

TEST(Placement, UnlistedOpsGoToTheFallbackOrNowhere) {
  GraphBuilder b;
  const ValueId x = b.input("x", {2, 3});
  b.output(b.op("cumsum", {b.op("relu", {x})}, make_attrs({{"dim", int64_t{1}}})));
  const auto placed = compiler::place_nodes(b.graph(), test_target({"relu"}), DType::Float32);
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0].side, Side::Target);
  EXPECT_EQ(placed[0].reason, "");
  EXPECT_EQ(placed[1].side, Side::Fallback);
  EXPECT_EQ(placed[1].reason, "target 'npu-test' does not list op 'cumsum'");

  const auto strict = compiler::place_nodes(b.graph(), test_target({"relu"}, ""), DType::Float32);
  EXPECT_FALSE(strict[1].side);
  EXPECT_TRUE(contains(strict[1].reason, "the target has no fallback")) << strict[1].reason;
  try {
    compiler::partition_graph(b.graph(), test_target({"relu"}, ""), DType::Float32, strict);
    FAIL() << "a node without a backend must be an error";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "node 'cumsum_1' (cumsum)")) << error.what();
  }

  // The reference fallback keeps float32 storage: a bfloat16 program cannot fall back to it.
  const auto bf16 = compiler::place_nodes(b.graph(), test_target({"relu"}, "reference"), DType::BFloat16);
  EXPECT_EQ(bf16[0].side, Side::Target);
  EXPECT_FALSE(bf16[1].side);
  EXPECT_TRUE(contains(bf16[1].reason, "fallback: backend 'reference' does not store activations as bfloat16"))
      << bf16[1].reason;

  // A coverage limit moves a listed op to the fallback.
  const BackendCoverage npu =
      parse_coverage(R"({"backend": "cpu", "ops": [{"op": "relu", "dtypes": ["int64"]}, "cumsum"]})", "npu");
  const BackendCoverage cpu = backend_coverage("cpu");
  const auto limited = compiler::place_nodes(b.graph(), test_target({"relu", "cumsum"}), DType::Float32, npu, &cpu);
  EXPECT_EQ(limited[0].side, Side::Fallback);
  EXPECT_TRUE(contains(limited[0].reason, "does not run 'relu' on float32")) << limited[0].reason;
  EXPECT_EQ(limited[1].side, Side::Target);
}

// ====================================================================================================================
// Partitions

// x -> relu (a) -> cumsum (c, fallback) -> add(c, a) -> neg; outputs neg and a.
struct SplitGraph {
  GraphBuilder b;
  ValueId x, a, c, sum, neg;
  SplitGraph(DType dtype = DType::Float32) {
    x = b.input("x", {2, 3}, dtype);
    a = b.op("relu", {x});
    c = b.op("cumsum", {a}, make_attrs({{"dim", int64_t{1}}}));
    sum = b.op("add", {c, a});
    neg = b.op("neg", {sum});
    b.output(neg);
    b.output(a);
  }
};

TEST(Partition, SplitsAroundAFallbackOpWithTransfers) {
  SplitGraph s;
  const compiler::Target target = test_target({"relu", "add", "neg"});
  const compiler::PartitionPlan plan = compiler::partition_graph(s.b.graph(), target, DType::Float32);
  ASSERT_EQ(plan.partitions.size(), 3u);
  const auto& p = plan.partitions;
  EXPECT_EQ(p[0].side, Side::Target);
  EXPECT_EQ(p[0].nodes, (std::vector<int32_t>{0}));
  EXPECT_EQ(p[0].inputs, (std::vector<ValueId>{s.x}));
  EXPECT_EQ(p[0].outputs, (std::vector<ValueId>{s.a}));
  EXPECT_EQ(p[1].side, Side::Fallback);
  EXPECT_EQ(p[1].backend, "cpu");
  EXPECT_EQ(p[1].nodes, (std::vector<int32_t>{1}));
  EXPECT_EQ(p[1].inputs, (std::vector<ValueId>{s.a}));
  EXPECT_EQ(p[1].outputs, (std::vector<ValueId>{s.c}));
  EXPECT_EQ(p[2].side, Side::Target);
  EXPECT_EQ(p[2].nodes, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(p[2].inputs, (std::vector<ValueId>{s.c, s.a}));
  EXPECT_EQ(p[2].outputs, (std::vector<ValueId>{s.neg}));  // sum stays inside
  EXPECT_EQ(plan.partition_of_node, (std::vector<int32_t>{0, 1, 2, 2}));
  EXPECT_EQ(plan.fallback_nodes(), 1u);
  EXPECT_EQ(plan.label(p[0]), "npu-test (cpu)");
  EXPECT_EQ(plan.label(p[1]), "fallback (cpu)");

  // a goes to the fallback once; partition 2 reads a on the target side, where it already is: no transfer.
  ASSERT_EQ(plan.transfers.size(), 2u);
  EXPECT_EQ(plan.transfers[0].value, s.a);
  EXPECT_EQ(plan.transfers[0].from_partition, 0);
  EXPECT_EQ(plan.transfers[0].before_partition, 1);
  EXPECT_EQ(plan.transfers[0].to, Side::Fallback);
  EXPECT_EQ(plan.transfers[0].bytes, 6 * 4);
  EXPECT_EQ(plan.transfers[1].value, s.c);
  EXPECT_EQ(plan.transfers[1].from_partition, 1);
  EXPECT_EQ(plan.transfers[1].before_partition, 2);
  EXPECT_EQ(plan.transfers[1].to, Side::Target);
  EXPECT_EQ(plan.transfer_bytes(), 48);

  // Bytes as stored: floats in the compute dtype, integers in their own.
  EXPECT_EQ(compiler::partition_graph(s.b.graph(), target, DType::BFloat16).transfer_bytes(), 24);
  SplitGraph ints(DType::Int64);
  EXPECT_EQ(compiler::partition_graph(ints.b.graph(), target, DType::BFloat16).transfer_bytes(), 2 * 6 * 8);

  const std::string text = compiler::format_partitions(s.b.graph(), plan);
  EXPECT_TRUE(contains(text, "partitions: 3 (2 on npu-test, 1 on the fallback cpu), 2 transfers of 48 B")) << text;
  EXPECT_TRUE(contains(text, "#1 fallback (cpu): 1 op: cumsum x1\n      nodes: cumsum_1\n      reads: relu_0\n"))
      << text;
  EXPECT_TRUE(contains(text, "#2 npu-test (cpu): 2 ops: add x1, neg x1\n      reads: cumsum_1, relu_0\n")) << text;
  EXPECT_TRUE(contains(text, "#0 -> #1 (fallback)  24 B")) << text;
  EXPECT_TRUE(contains(text, "#1 -> #2 (target)  24 B")) << text;
}

TEST(Partition, OneSideIsOnePartitionAndNoTransfers) {
  SplitGraph s;
  const compiler::PartitionPlan all =
      compiler::partition_graph(s.b.graph(), compiler::load_target("cpu"), DType::Float32);
  ASSERT_EQ(all.partitions.size(), 1u);
  EXPECT_EQ(all.partitions[0].nodes, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(all.partitions[0].inputs, (std::vector<ValueId>{s.x}));
  EXPECT_EQ(all.partitions[0].outputs, (std::vector<ValueId>{s.neg, s.a}));  // graph output order
  EXPECT_TRUE(all.transfers.empty());
  // Nothing the target lists: everything on the fallback, still one partition.
  const compiler::PartitionPlan none = compiler::partition_graph(s.b.graph(), test_target({}), DType::Float32);
  ASSERT_EQ(none.partitions.size(), 1u);
  EXPECT_EQ(none.partitions[0].side, Side::Fallback);
  EXPECT_TRUE(none.transfers.empty());
  GraphBuilder empty;
  empty.output(empty.input("x", {2}));
  EXPECT_TRUE(compiler::partition_graph(empty.graph(), test_target({}), DType::Float32).partitions.empty());
}

// Starting on the target would give [t1] [f1] [t2]; starting on the fallback gives [f1] [t1 t2].
TEST(Partition, StartsOnTheSideThatGivesFewerPartitions) {
  GraphBuilder b;
  const ValueId x = b.input("x", {3});
  const ValueId f1 = b.op("cumsum", {x}, make_attrs({{"dim", int64_t{0}}}));
  const ValueId t1 = b.op("relu", {x});
  const ValueId t2 = b.op("add", {f1, t1});
  b.output(t2);
  const compiler::PartitionPlan plan =
      compiler::partition_graph(b.graph(), test_target({"relu", "add"}), DType::Float32);
  ASSERT_EQ(plan.partitions.size(), 2u);
  EXPECT_EQ(plan.partitions[0].side, Side::Fallback);
  EXPECT_EQ(plan.partitions[0].nodes, (std::vector<int32_t>{0}));
  EXPECT_EQ(plan.partitions[1].nodes, (std::vector<int32_t>{1, 2}));
  ASSERT_EQ(plan.transfers.size(), 1u);
  EXPECT_EQ(plan.transfers[0].value, f1);
}

// ---- random DAGs ----

struct RandomDag {
  Graph graph;
  std::vector<compiler::NodePlacement> placements;
};

// Nodes read one or two earlier values (the graph input or node outputs); each node's side is random.
RandomDag random_dag(std::mt19937& rng, int nodes, double target_share) {
  GraphBuilder b;
  std::vector<ValueId> values{b.input("x", {2})};
  std::bernoulli_distribution on_target(target_share), binary(0.5);
  RandomDag dag;
  for (int n = 0; n < nodes; ++n) {
    // Prefer recent values so the DAGs are deep as well as wide.
    std::uniform_int_distribution<size_t> pick(values.size() > 4 && binary(rng) ? values.size() - 4 : 0,
                                               values.size() - 1);
    const ValueId first = values[pick(rng)];
    const ValueId out = binary(rng) ? b.op("add", {first, values[pick(rng)]}) : b.op("neg", {first});
    values.push_back(out);
    dag.placements.push_back({on_target(rng) ? Side::Target : Side::Fallback, ""});
  }
  dag.graph = b.graph();
  std::vector<bool> read(dag.graph.values.size(), false);
  for (const Node& node : dag.graph.nodes)
    for (ValueId id : node.inputs) read[static_cast<size_t>(id)] = true;
  for (ValueId id : values)
    if (!read[static_cast<size_t>(id)] || std::bernoulli_distribution(0.1)(rng)) dag.graph.outputs.push_back(id);
  return dag;
}

// The fewest one-side stretches of any topological order: exhaustive over sets of done nodes.
size_t fewest_partitions(const Graph& graph, const std::vector<Side>& sides) {
  const size_t n = graph.nodes.size();
  std::vector<uint32_t> preds(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (ValueId id : graph.nodes[i].inputs)
      if (graph.value(id).producer >= 0) preds[i] |= 1u << graph.value(id).producer;
  const uint32_t full = (1u << n) - 1;
  // best[mask][side]: fewest further stretches once `mask` is done and the last node ran on `side`.
  std::vector<std::array<size_t, 2>> best(size_t{1} << n, {SIZE_MAX, SIZE_MAX});
  best[full] = {0, 0};
  for (uint32_t mask = full; mask-- > 0;)
    for (size_t last = 0; last < 2; ++last)
      for (size_t i = 0; i < n; ++i) {
        if ((mask >> i & 1u) || (preds[i] & ~mask)) continue;
        const size_t side = static_cast<size_t>(sides[i]);
        const size_t rest = best[mask | 1u << i][side];
        if (rest != SIZE_MAX) best[mask][last] = std::min(best[mask][last], rest + (side != last));
      }
  size_t fewest = n == 0 ? 0 : SIZE_MAX;
  for (size_t i = 0; i < n; ++i)
    if (preds[i] == 0) fewest = std::min(fewest, 1 + best[1u << i][static_cast<size_t>(sides[i])]);
  return fewest;
}

// Any path between two nodes of one partition stays inside it.
void expect_convex(const Graph& graph, const compiler::PartitionPlan& plan) {
  const size_t n = graph.nodes.size();
  std::vector<std::vector<bool>> reaches(n, std::vector<bool>(n, false));
  for (size_t i = n; i-- > 0;)
    for (size_t j = i + 1; j < n; ++j) {
      bool direct = false;
      for (ValueId id : graph.nodes[j].inputs) direct = direct || graph.value(id).producer == static_cast<int32_t>(i);
      if (!direct) continue;
      reaches[i][j] = true;
      for (size_t k = j + 1; k < n; ++k) reaches[i][k] = reaches[i][k] || reaches[j][k];
    }
  const auto& part = plan.partition_of_node;
  for (size_t a = 0; a < n; ++a)
    for (size_t mid = 0; mid < n; ++mid)
      for (size_t c = 0; c < n; ++c)
        if (reaches[a][mid] && reaches[mid][c] && part[a] == part[c])
          ASSERT_EQ(part[mid], part[a]) << "path " << a << " -> " << mid << " -> " << c << " leaves its partition";
}

TEST(Partition, RandomDagsGiveConvexAcyclicMaximalAndFewestPartitions) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 400; ++trial) {
    const int nodes = trial < 300 ? 1 + trial % 12 : 20 + trial % 60;
    const double share = std::array<double, 3>{0.2, 0.5, 0.8}[static_cast<size_t>(trial % 3)];
    const RandomDag dag = random_dag(rng, nodes, share);
    const Graph& g = dag.graph;
    const compiler::Target target = test_target({});
    const compiler::PartitionPlan plan = compiler::partition_graph(g, target, DType::Float32, dag.placements);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(nodes) + " nodes");

    // Every node in exactly one partition of its side, in graph order.
    std::vector<int> seen(g.nodes.size(), 0);
    for (size_t p = 0; p < plan.partitions.size(); ++p) {
      const compiler::Partition& partition = plan.partitions[p];
      ASSERT_FALSE(partition.nodes.empty());
      EXPECT_TRUE(std::is_sorted(partition.nodes.begin(), partition.nodes.end()));
      for (int32_t node : partition.nodes) {
        ++seen[static_cast<size_t>(node)];
        EXPECT_EQ(plan.partition_of_node[static_cast<size_t>(node)], static_cast<int32_t>(p));
        EXPECT_EQ(partition.side, dag.placements[static_cast<size_t>(node)].side);
      }
      if (p > 0) EXPECT_NE(partition.side, plan.partitions[p - 1].side) << "neighbours on one side would merge";
    }
    EXPECT_EQ(seen, std::vector<int>(g.nodes.size(), 1));

    // No cycle: every edge runs forward in partition order.
    for (size_t n = 0; n < g.nodes.size(); ++n)
      for (ValueId id : g.nodes[n].inputs)
        if (const int32_t producer = g.value(id).producer; producer >= 0)
          EXPECT_LE(plan.partition_of_node[static_cast<size_t>(producer)], plan.partition_of_node[n]);
    expect_convex(g, plan);

    // Maximal: a node could not have joined an earlier partition of its side, because something it reads is
    // computed after that partition.
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      const int32_t mine = plan.partition_of_node[n];
      for (int32_t earlier = 0; earlier < mine; ++earlier) {
        if (plan.partitions[static_cast<size_t>(earlier)].side != plan.partitions[static_cast<size_t>(mine)].side)
          continue;
        bool blocked = false;
        for (ValueId id : g.nodes[n].inputs)
          if (const int32_t producer = g.value(id).producer; producer >= 0)
            blocked = blocked || plan.partition_of_node[static_cast<size_t>(producer)] > earlier;
        EXPECT_TRUE(blocked) << "node " << n << " could join partition " << earlier;
      }
    }

    if (nodes <= 12) {
      std::vector<Side> sides;
      for (const auto& placement : dag.placements) sides.push_back(*placement.side);
      EXPECT_EQ(plan.partitions.size(), fewest_partitions(g, sides));
    }

    // Transfers: exactly the values read on the other side from where they were made, once per side, before
    // the first reader there; partition inputs: exactly what is read from outside.
    std::set<std::pair<ValueId, Side>> expected_transfers;
    std::map<std::pair<ValueId, Side>, int32_t> first_reader;
    for (size_t p = 0; p < plan.partitions.size(); ++p) {
      const compiler::Partition& partition = plan.partitions[p];
      std::set<ValueId> outside;
      for (int32_t n : partition.nodes)
        for (ValueId id : g.nodes[static_cast<size_t>(n)].inputs) {
          const int32_t producer = g.value(id).producer;
          const int32_t from = producer < 0 ? -1 : plan.partition_of_node[static_cast<size_t>(producer)];
          if (from == static_cast<int32_t>(p)) continue;
          outside.insert(id);
          if (from >= 0 && plan.partitions[static_cast<size_t>(from)].side != partition.side) {
            expected_transfers.insert({id, partition.side});
            first_reader.emplace(std::make_pair(id, partition.side), static_cast<int32_t>(p));
          }
        }
      EXPECT_EQ(std::set<ValueId>(partition.inputs.begin(), partition.inputs.end()), outside);
      EXPECT_EQ(partition.inputs.size(), outside.size());
    }
    std::set<std::pair<ValueId, Side>> actual_transfers;
    for (const compiler::Transfer& t : plan.transfers) {
      EXPECT_TRUE(actual_transfers.insert({t.value, t.to}).second) << "value " << t.value << " moved twice";
      EXPECT_EQ(t.before_partition, (first_reader[{t.value, t.to}]));
      EXPECT_EQ(t.bytes, 8);  // [2] float32
      EXPECT_NE(plan.partitions[static_cast<size_t>(t.from_partition)].side, t.to);
    }
    EXPECT_EQ(actual_transfers, expected_transfers);
  }
}

// ====================================================================================================================
// Compiling with partitions

std::string write_target(const std::string& name, const std::string& json) {
  const std::string path = test::work_dir() + "/" + name;
  std::ofstream(path) << json;
  return path;
}

TEST(CompileWithPartitions, ReportListsPartitionsAndNoFallbackListsTheOps) {
  SplitGraph s;
  compiler::CompileOptions options;
  options.target = write_target(
      "npu_lite.json", R"({"name": "npu-lite", "backend": "cpu", "ops": ["relu", "add", "neg"], "fallback": "cpu"})");
  options.disabled_passes = {"fusions"};
  compiler::CompileReport report;
  const Program program = compiler::compile_graph(s.b.graph(), options, &report);
  EXPECT_EQ(report.partitions.partitions.size(), 3u);
  EXPECT_EQ(report.partitions.transfers.size(), 2u);
  const std::string text = compiler::format_report(program, report, compiler::load_target(options.target));
  EXPECT_TRUE(contains(text, "cumsum                           1  on FALLBACK cpu")) << text;
  EXPECT_TRUE(contains(text, "partitions: 3 (2 on npu-lite, 1 on the fallback cpu), 2 transfers of 48 B")) << text;
  EXPECT_TRUE(contains(text, "#1 fallback (cpu): 1 op: cumsum x1")) << text;

  options.allow_fallback = false;
  try {
    compiler::compile_graph(s.b.graph(), options);
    FAIL() << "--no-fallback must turn the fallback into an error";
  } catch (const Error& error) {
    EXPECT_TRUE(
        contains(error.what(), "cannot compile for target 'npu-lite' without fallback (ops it cannot run: cumsum)"))
        << error.what();
    EXPECT_TRUE(contains(error.what(), "node 'cumsum_1' (cumsum)")) << error.what();
  }

  // A bfloat16 program cannot fall back to the float32 reference backend: an error naming the node, fallback or not.
  options.allow_fallback = true;
  options.compute_dtype = DType::BFloat16;
  options.target =
      write_target("npu_ref.json",
                   R"({"name": "npu-ref", "backend": "cpu", "ops": ["relu", "add", "neg"], "fallback": "reference"})");
  try {
    compiler::compile_graph(s.b.graph(), options);
    FAIL() << "the reference fallback has no bfloat16 storage";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "node 'cumsum_1' (cumsum)")) << error.what();
    EXPECT_TRUE(contains(error.what(), "does not store activations as bfloat16")) << error.what();
  }
}

TEST(Coverage, CudaRunsEveryOpWithItsKernelsMarkedAndTheBuiltinTargetFallsBackToCpu) {
  const BackendCoverage cuda = backend_coverage("cuda");
  EXPECT_EQ(cuda.backend, "cuda");
  EXPECT_EQ(cuda.ops.size(), OpRegistry::instance().all().size());
  EXPECT_EQ(cuda.compute_dtypes, (std::vector<DType>{DType::Float32, DType::Float16, DType::BFloat16}));
  for (const char* op : {"linear", "attention", "rms_norm", "conv2d", "add"}) {
    ASSERT_NE(cuda.find(op), nullptr) << op;
    EXPECT_TRUE(cuda.find(op)->kernel) << op;
  }
  ASSERT_NE(cuda.find("cumsum"), nullptr);
  EXPECT_FALSE(cuda.find("cumsum")->kernel);

  const compiler::Target target = compiler::load_target("cuda");
  EXPECT_EQ(target.name, "cuda");
  EXPECT_EQ(target.backend, "cuda");
  EXPECT_EQ(target.fallback, "cpu");
  EXPECT_TRUE(target.all_ops);
  const auto names = compiler::builtin_target_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cuda"), names.end());

  GraphBuilder b;
  b.output(b.op("cumsum", {b.op("relu", {b.input("x", {3})})}, make_attrs({{"dim", int64_t{0}}})));
  const compiler::PartitionPlan plan = compiler::partition_graph(b.graph(), target, DType::Float16);
  ASSERT_EQ(plan.partitions.size(), 1u);
  EXPECT_EQ(plan.partitions[0].backend, "cuda");
}

}  // namespace
}  // namespace npusim
