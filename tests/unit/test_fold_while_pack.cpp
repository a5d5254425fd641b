// BatchNorm folded while the CPU backend packs: the per-output-channel factors applied by PackedMatrix::pack, the
// Winograd weight transform and the convolution kernel give, bit for bit, what folding first (scale_rows) and packing
// the folded copy gives; the backend keeps folded convolution weights as their sources; the weight store can leave
// the folds to the backend; the fold helpers compute hand-checked values and reject bad operands.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>

#include "backends/cpu/conv_winograd.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/packed_gemm.h"
#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "npusim/error.h"
#include "npusim/op_registry.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "runtime/weight_transforms.h"
#include "unit/error_expectations.h"
#include "unit/graph_test_util.h"
#include "unit/random_values.h"
#include "work_dir.h"

namespace npusim {
namespace {

using cpu::Elem;
using cpu::GemmSide;
using cpu::PackedMatrix;
using cpu::ThreadPool;

using test::random_tensor;

std::vector<double> random_scales(int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-3.0, 3.0);
  std::vector<double> scales(static_cast<size_t>(count));
  for (double& scale : scales) scale = dist(gen);
  return scales;
}

Tensor floats(Shape shape, std::vector<float> values) {
  Tensor t(DType::Float32, std::move(shape));
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

// Every element of `actual` has the bits of the same element of `expected`.
void expect_same_floats(const Tensor& actual, const Tensor& expected, const std::string& label) {
  ASSERT_EQ(actual.shape(), expected.shape()) << label;
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_EQ(actual.data<float>()[i], expected.data<float>()[i]) << label << " at " << i;
}

using test::expect_error;

// ---- the fold helpers ----

TEST(FoldWhilePack, ScaleRowsAndFoldScalesComputeHandCheckedValues) {
  const Tensor w = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  const std::vector<double> scales{0.5, -2.0};
  const Tensor folded = scale_rows(w, scales, 1);
  expect_same_floats(folded, floats({2, 3}, {0.5f, 1, 1.5f, -8, -10, -12}), "scale_rows");

  WeightTransform transform{"bn_fold_weight", {0, 1, 2}, {}};
  transform.params.set("eps", 1.0);
  // gamma / sqrt(var + eps): 2 / sqrt(15 + 1) = 0.5, 3 / sqrt(8 + 1) = 1.
  const std::vector<Tensor> sources{w, floats({2}, {2, 3}), floats({2}, {15, 8})};
  EXPECT_EQ(bn_fold_scales(transform, sources, 2, "w"), (std::vector<double>{0.5, 1.0}));
  // Without gamma (BatchNorm without affine): 1 / sqrt(3 + 1), 1 / sqrt(0 + 1).
  const std::vector<Tensor> no_gamma{w, Tensor(), floats({2}, {3, 0})};
  EXPECT_EQ(bn_fold_scales(transform, no_gamma, 2, "w"), (std::vector<double>{0.5, 1.0}));
  expect_same_floats(apply_weight_transform(transform, no_gamma, "w"), floats({2, 3}, {0.5f, 1, 1.5f, 4, 5, 6}),
                     "bn_fold_weight without gamma");

  // An empty weight folds to an empty weight.
  EXPECT_EQ(scale_rows(Tensor(DType::Float32, {0, 3}), {}, 2).shape(), (Shape{0, 3}));
}

TEST(FoldWhilePack, FoldHelpersRejectBadOperands) {
  const Tensor w = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_error([&] { scale_rows(w, std::vector<double>{1.0}); }, {"one scale per row", "[2, 3]", "1 scales"});
  expect_error([&] { scale_rows(w.to(DType::BFloat16), std::vector<double>{1.0, 1.0}); }, {"fp32", "bfloat16"});
  const WeightTransform transform{"bn_fold_weight", {0, 1, 2}, {}};
  expect_error(
      [&] {
        bn_fold_scales(transform, std::vector<Tensor>{w, Tensor(), floats({3}, {1, 1, 1})}, 2, "conv.w");
      },
      {"conv.w", "running_var has 3 values for 2 channels"});
}

TEST(FoldWhilePack, LargeFoldsGiveTheSameBitsOnAnyThreadCount) {
  const Tensor w = random_tensor({601, 512}, 3);  // past the size that splits the work
  const std::vector<double> scales = random_scales(601, 4);
  const Tensor one = scale_rows(w, scales, 1);
  for (int threads : {2, 3, 0}) expect_same_floats(scale_rows(w, scales, threads), one, std::to_string(threads));
  EXPECT_EQ(one.data<float>()[600 * 512 + 7], static_cast<float>(w.data<float>()[600 * 512 + 7] * scales[600]));
}

// ---- PackedMatrix::pack with line scales ----

void expect_same_packing(const PackedMatrix& actual, const PackedMatrix& expected, const std::string& label) {
  ASSERT_EQ(actual.bytes(), expected.bytes()) << label;
  std::vector<float> a(actual.bytes() / sizeof(float)), e(expected.bytes() / sizeof(float));
  std::memcpy(a.data(), actual.panel(0), actual.bytes());
  std::memcpy(e.data(), expected.panel(0), expected.bytes());
  for (size_t i = 0; i < e.size(); ++i) ASSERT_EQ(a[i], e[i]) << label << " at " << i;
}

TEST(FoldWhilePack, PackedLinesScaledWhilePackingEqualPackedFoldedLines) {
  ThreadPool pool(2);
  for (int64_t lines : {1, 5, 6, 7, 13, 16, 19, 35})
    for (int64_t depth : {1, 3, 8, 33, 64})
      for (ThreadPool* threads : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const std::string label =
            std::to_string(lines) + " lines x " + std::to_string(depth) + (threads ? " on 2 threads" : " on 1 thread");
        const Tensor w = random_tensor({lines, depth}, static_cast<uint32_t>(lines * 100 + depth));
        const std::vector<double> scales = random_scales(lines, static_cast<uint32_t>(lines + depth));
        const Tensor folded = scale_rows(w, scales, 1);
        // Rows of A (a convolution weight [Cout, patch]).
        expect_same_packing(
            PackedMatrix::pack(GemmSide::A, w.bytes(), Elem::F32, lines, depth, 0, false, threads, scales.data()),
            PackedMatrix::pack(GemmSide::A, folded.bytes(), Elem::F32, lines, depth, 0, false, threads), "A " + label);
        // Columns of B from a transposed weight [n, k] (a linear layer).
        expect_same_packing(
            PackedMatrix::pack(GemmSide::B, w.bytes(), Elem::F32, depth, lines, 0, true, threads, scales.data()),
            PackedMatrix::pack(GemmSide::B, folded.bytes(), Elem::F32, depth, lines, 0, true, threads),
            "B transposed " + label);
        // Columns of a plain B [k, n]: the scales go along the columns.
        const Tensor b = random_tensor({depth, lines}, static_cast<uint32_t>(depth * 7 + lines));
        Tensor b_folded(DType::Float32, {depth, lines});
        for (int64_t r = 0; r < depth; ++r)
          for (int64_t c = 0; c < lines; ++c)
            b_folded.mutable_data<float>()[r * lines + c] =
                static_cast<float>(b.data<float>()[r * lines + c] * scales[static_cast<size_t>(c)]);
        expect_same_packing(
            PackedMatrix::pack(GemmSide::B, b.bytes(), Elem::F32, depth, lines, 0, false, threads, scales.data()),
            PackedMatrix::pack(GemmSide::B, b_folded.bytes(), Elem::F32, depth, lines, 0, false, threads),
            "B " + label);
      }
}

TEST(FoldWhilePack, ScaledPackingNeedsFp32Lines) {
  const Tensor w = random_tensor({6, 4}, 1).to(DType::BFloat16);
  const std::vector<double> scales(6, 2.0);
  expect_error([&] { PackedMatrix::pack(GemmSide::A, w.bytes(), Elem::BF16, 6, 4, 0, false, nullptr, scales.data()); },
               {"fp32"});
}

// ---- Winograd with channel scales ----

// One sample through a Winograd convolution of `w` (fp32 [Cout, Cin, 3, 3]), scaled by `scales` when given.
Tensor run_winograd(const cpu::WinogradConv::Geometry& g, const Tensor& w, const Tensor& x, const double* scales,
                    int threads) {
  ThreadPool pool(threads);
  cpu::ScratchSpace scratch;
  const cpu::WinogradConv conv(g, w.bytes(), Elem::F32, scratch, &pool, scales);
  scratch.allocate(pool.size());
  std::vector<float> workspace(static_cast<size_t>(conv.workspace_floats()));
  Tensor out(DType::Float32, {g.out_channels, g.out_h * g.out_w});
  conv.run(x.data<float>(), workspace.data(), {out.mutable_bytes(), Elem::F32, g.out_h * g.out_w}, {}, pool, scratch);
  return out;
}

TEST(FoldWhilePack, WinogradWithChannelScalesEqualsWinogradOfTheFoldedWeight) {
  struct Case {
    int64_t cin, cout, height, width;
  };
  // F(2x2) (fewer than 144 output pixels) and F(4x4), odd channel counts, tiles as rows (5x6) and as columns.
  for (const Case& c : std::vector<Case>{{17, 19, 13, 11}, {16, 24, 14, 14}, {24, 17, 5, 6}, {19, 33, 20, 17}})
    for (int threads : {1, 2}) {
      const cpu::WinogradConv::Geometry g{c.cin, c.cout, c.height, c.width, 1, 1, c.height, c.width};
      ASSERT_TRUE(cpu::WinogradConv::suitable(g));
      const Tensor w = random_tensor({c.cout, c.cin, 3, 3}, static_cast<uint32_t>(c.cin * c.cout));
      const Tensor x = random_tensor({c.cin, c.height, c.width}, static_cast<uint32_t>(c.height));
      const std::vector<double> scales = random_scales(c.cout, static_cast<uint32_t>(c.cout));
      const std::string label = std::to_string(c.cin) + "->" + std::to_string(c.cout) + " " + std::to_string(c.height) +
                                "x" + std::to_string(c.width) + " threads " + std::to_string(threads);
      expect_same_floats(run_winograd(g, w, x, scales.data(), threads),
                         run_winograd(g, scale_rows(w, scales, 1), x, nullptr, threads), label);
    }
}

// ---- the convolution kernel with row scales ----

struct KernelRun {
  bool built = false;
  bool applied_scales = false;
  Tensor out;
};

// The backend's conv2d kernel on fp32 operands with a constant weight, given row scales for it or not.
KernelRun run_conv_kernel(const Attrs& attrs, const std::vector<Tensor>& inputs, const Shape& out_shape,
                          const std::vector<double>* scales, int threads) {
  Node node;
  node.name = "conv";
  node.op = "conv2d";
  node.attrs = attrs;
  ThreadPool pool(threads);
  cpu::ScratchSpace scratch;
  cpu::KernelContext ctx{node, {}, {}, pool, scratch, nullptr, {}, {}};
  std::vector<Tensor> storage = inputs;
  for (const Tensor& t : storage)
    ctx.inputs.push_back(cpu::Buffer{const_cast<std::byte*>(t.bytes()), Elem::F32, {t.shape(), DType::Float32}});
  KernelRun result;
  result.out = Tensor(DType::Float32, out_shape);
  for (int64_t i = 0; i < result.out.numel(); ++i) result.out.mutable_data<float>()[i] = NAN;
  ctx.outputs.push_back(cpu::Buffer{result.out.mutable_bytes(), Elem::F32, {out_shape, DType::Float32}});
  ctx.constant_inputs.assign(inputs.size(), false);
  ctx.constant_inputs[1] = true;
  if (scales) {
    ctx.row_scales.assign(inputs.size(), nullptr);
    ctx.row_scales[1] = scales->data();
  }
  const std::optional<cpu::Kernel> kernel = (*cpu::kernel_table().find("conv2d"))(ctx);
  if (!kernel) return result;
  result.built = true;
  result.applied_scales = kernel->applies_row_scales;
  scratch.allocate(pool.size());
  kernel->run();
  return result;
}

Attrs conv_attrs(int64_t stride, int64_t padding, int64_t groups) {
  Attrs attrs;
  attrs.set("stride", std::vector<int64_t>{stride});
  attrs.set("padding", std::vector<int64_t>{padding});
  attrs.set("groups", groups);
  const OpDef* def = OpRegistry::instance().find("conv2d");
  OpRegistry::instance().normalize_attrs(*def, nullptr, attrs, "test");
  return attrs;
}

TEST(FoldWhilePack, ConvKernelAppliesRowScalesAsTheFoldedWeightWould) {
  struct Case {
    std::string label;
    int64_t cin, cout, size, kernel, stride, padding, groups;
    bool bias;
  };
  const std::vector<Case> cases = {
      {"pointwise 7->13", 7, 13, 5, 1, 1, 0, 1, true},
      {"pointwise without bias", 9, 11, 4, 1, 1, 0, 1, false},
      {"3x3 stride 2", 5, 7, 9, 3, 2, 1, 1, true},
      {"3x3 Winograd", 16, 19, 12, 3, 1, 1, 1, true},
      {"3x3 Winograd without bias", 17, 16, 14, 3, 1, 1, 1, false},
      {"grouped", 6, 9, 6, 3, 1, 1, 3, true},
      {"7x7 stem", 3, 8, 16, 7, 2, 3, 1, false},
      {"depthwise", 4, 4, 5, 3, 1, 1, 4, true},
      {"depthwise multiplier 2 stride 2", 4, 8, 9, 3, 2, 1, 4, false},
  };
  for (const Case& c : cases)
    for (int threads : {1, 2}) {
      const std::string label = c.label + " threads " + std::to_string(threads);
      const Attrs attrs = conv_attrs(c.stride, c.padding, c.groups);
      const Tensor x = random_tensor({1, c.cin, c.size, c.size}, 1);
      const Tensor w = random_tensor({c.cout, c.cin / c.groups, c.kernel, c.kernel}, 2);
      const std::vector<double> scales = random_scales(c.cout, 3);
      std::vector<Tensor> scaled{x, w}, folded{x, scale_rows(w, scales, 1)};
      if (c.bias) {
        scaled.push_back(random_tensor({c.cout}, 4));
        folded.push_back(scaled.back());
      }
      const int64_t out_size = (c.size + 2 * c.padding - c.kernel) / c.stride + 1;
      const Shape out_shape{1, c.cout, out_size, out_size};
      const KernelRun with_scales = run_conv_kernel(attrs, scaled, out_shape, &scales, threads);
      const KernelRun plain = run_conv_kernel(attrs, folded, out_shape, nullptr, threads);
      ASSERT_TRUE(with_scales.built && plain.built) << label;
      EXPECT_TRUE(with_scales.applied_scales) << label;
      EXPECT_FALSE(plain.applied_scales) << label;
      expect_same_floats(with_scales.out, plain.out, label);
    }
}

// ---- the CPU backend: folded weights kept as their sources ----

struct BnCase {
  std::string label;
  int64_t cin, cout, size, kernel, groups;
  bool conv_bias;
  int bn_params;  // 2: mean and var only (no affine); 3: gamma, mean, var; 4: gamma, beta, mean, var
  bool relu;
};

struct BnGraph {
  Graph graph;
  std::vector<std::pair<ValueId, Tensor>> weights;  // the checkpoint's tensors (no folded ones)
  Tensor input;
};

BnGraph bn_graph(const BnCase& c, uint32_t seed) {
  test::GraphBuilder builder;
  BnGraph result;
  const ValueId x = builder.input("x", {1, c.cin, c.size, c.size});
  const ValueId w = builder.weight("conv.weight", {c.cout, c.cin / c.groups, c.kernel, c.kernel});
  result.weights.emplace_back(w, random_tensor({c.cout, c.cin / c.groups, c.kernel, c.kernel}, seed));
  std::vector<ValueId> conv_inputs{x, w};
  if (c.conv_bias) {
    conv_inputs.push_back(builder.weight("conv.bias", {c.cout}));
    result.weights.emplace_back(conv_inputs.back(), random_tensor({c.cout}, seed + 1));
  }
  Attrs attrs;
  attrs.set("padding", std::vector<int64_t>{c.kernel / 2});
  attrs.set("groups", c.groups);
  const ValueId conv = builder.op("conv2d", conv_inputs, attrs);
  std::vector<ValueId> bn_inputs{conv};
  const std::vector<std::string> names = c.bn_params == 4   ? std::vector<std::string>{"weight", "bias", "mean", "var"}
                                         : c.bn_params == 3 ? std::vector<std::string>{"weight", "mean", "var"}
                                                            : std::vector<std::string>{"mean", "var"};
  for (const std::string& name : names) {
    bn_inputs.push_back(builder.weight("bn." + name, {c.cout}));
    const float low = name == "var" ? 0.1f : -1.0f;  // a variance is positive
    result.weights.emplace_back(bn_inputs.back(), random_tensor({c.cout}, seed + 2 + bn_inputs.size(), low, 2.0f));
  }
  Attrs bn_attrs;
  bn_attrs.set("eps", 1e-3);
  ValueId out = builder.op("batch_norm", bn_inputs, bn_attrs);
  if (c.relu) out = builder.op("relu", {out});
  builder.output(out);
  result.graph = builder.graph();
  result.input = random_tensor({1, c.cin, c.size, c.size}, seed + 9);
  return result;
}

Program folded_program(Graph graph) {
  compiler::PassContext context;
  compiler::fold_batchnorm(graph, context);
  Program program;
  program.compute_dtype = DType::Float32;
  program.plan = compiler::plan_memory(graph, DType::Float32);
  program.graph = std::move(graph);
  return program;
}

Tensor run_cpu(const Program& program, const std::vector<std::pair<ValueId, Tensor>>& weights, const Tensor& input,
               int threads, int64_t* packed_bytes = nullptr) {
  cpu::CpuBackend backend({.threads = threads, .poison_memory = true});
  const auto prepared = backend.prepare(program, weights);
  if (packed_bytes) *packed_bytes = prepared->prepare_cost().packed_bytes;
  return prepared->run({{"x", input}})[0].second;
}

TEST(FoldWhilePack, BackendFoldingWhilePackingEqualsPackingTheFoldedWeights) {
  const std::vector<BnCase> cases = {
      {"1x1 with bias, affine, relu", 7, 13, 5, 1, 1, true, 4, true},
      {"3x3 Winograd-sized, no conv bias", 16, 17, 14, 3, 1, false, 4, false},
      {"3x3 small, no affine", 5, 9, 6, 3, 1, false, 2, true},
      {"gamma without beta", 6, 11, 4, 1, 1, true, 3, false},
      {"grouped", 8, 12, 5, 3, 4, false, 4, false},
      {"depthwise (folded before it runs)", 6, 6, 7, 3, 6, false, 4, true},
  };
  for (const BnCase& c : cases) {
    const BnGraph g = bn_graph(c, 21);
    const Program program = folded_program(g.graph);
    ASSERT_EQ(program.graph.nodes.size(), c.relu ? 2u : 1u) << c.label;  // the BatchNorm was folded
    std::vector<std::pair<ValueId, Tensor>> with_folds = g.weights;
    add_derived_weights(program.graph, with_folds);
    ASSERT_GT(with_folds.size(), g.weights.size()) << c.label;
    const ReferenceExecutor reference(g.graph, g.weights);
    const Tensor expected = reference.run({{"x", g.input}})[0].second;
    for (int threads : {1, 2}) {
      const std::string label = c.label + " threads " + std::to_string(threads);
      int64_t packed_from_sources = -1, packed_from_folds = -2;
      const Tensor from_sources = run_cpu(program, g.weights, g.input, threads, &packed_from_sources);
      const Tensor from_folds = run_cpu(program, with_folds, g.input, threads, &packed_from_folds);
      expect_same_floats(from_sources, from_folds, label);
      EXPECT_EQ(packed_from_sources, packed_from_folds) << label;
      ASSERT_EQ(from_sources.shape(), expected.shape()) << label;
      for (int64_t i = 0; i < expected.numel(); ++i)
        ASSERT_NEAR(from_sources.data<float>()[i], expected.data<float>()[i],
                    1e-4 * (1.0 + std::fabs(expected.data<float>()[i])))
            << label << " at " << i;
    }
  }
}

// A folded weight that is also a graph output is computed, not left to the convolution.
TEST(FoldWhilePack, FoldedWeightReadElsewhereIsComputed) {
  const BnGraph g = bn_graph({"1x1", 3, 4, 3, 1, 1, false, 2, false}, 5);
  Program program = folded_program(g.graph);
  const ValueId folded_weight = program.graph.nodes[0].inputs[1];
  ASSERT_TRUE(program.graph.value(folded_weight).transform.has_value());
  program.graph.outputs.push_back(folded_weight);
  program.plan = compiler::plan_memory(program.graph, DType::Float32);
  cpu::CpuBackend backend({.threads = 1});
  const auto prepared = backend.prepare(program, g.weights);
  const NamedTensors outputs = prepared->run({{"x", g.input}});
  ASSERT_EQ(outputs.size(), 2u);
  std::vector<std::pair<ValueId, Tensor>> with_folds = g.weights;
  add_derived_weights(program.graph, with_folds);
  for (const auto& [id, tensor] : with_folds)
    if (id == folded_weight) expect_same_floats(outputs[1].second, tensor, "the folded weight as an output");
}

// ---- the weight store and resolve_weights ----

TEST(FoldWhilePack, WeightStoreCanLeaveTheFoldsToTheBackend) {
  const BnGraph g = bn_graph({"1x1", 3, 4, 3, 1, 1, true, 4, false}, 8);
  const Program program = folded_program(g.graph);
  const std::string path = npusim::test::work_dir() + "/fold_while_pack.safetensors";
  NamedTensors tensors;
  for (const auto& [id, tensor] : g.weights) tensors.emplace_back(g.graph.value(id).weight_key, tensor);
  write_safetensors(path, tensors);
  WeightStore store;
  store.add_file(path);
  const WeightBinding left = store.bind(program.graph, DerivedWeights::LeftToBackend);
  const WeightBinding computed = store.bind(program.graph);
  EXPECT_EQ(left.tensors.size(), g.weights.size());
  EXPECT_EQ(computed.tensors.size(), g.weights.size() + 2);  // the folded weight and bias
  for (const auto& [id, tensor] : left.tensors) EXPECT_FALSE(program.graph.value(id).transform) << id;
  // Both bindings run to the same bits.
  expect_same_floats(run_cpu(program, left.tensors, g.input, 2), run_cpu(program, computed.tensors, g.input, 2),
                     "bindings");
}

TEST(FoldWhilePack, ResolveWeightsLeavesNamedDerivedWeightsAsTheirSources) {
  const BnGraph g = bn_graph({"1x1", 3, 4, 3, 1, 1, false, 2, false}, 6);
  const Program program = folded_program(g.graph);
  const Node& conv = program.graph.nodes[0];
  const ValueId folded_weight = conv.inputs[1], folded_bias = conv.inputs[2];
  ResolveOptions options;
  options.threads = 1;
  options.leave_derived = [&](ValueId id) { return id == folded_weight; };
  const std::vector<Tensor> resolved = resolve_weights(program.graph, g.weights, options);
  EXPECT_FALSE(resolved[static_cast<size_t>(folded_weight)].defined());
  EXPECT_TRUE(resolved[static_cast<size_t>(folded_bias)].defined());
  for (int32_t source : program.graph.value(folded_weight).transform->sources)
    if (source >= 0) EXPECT_TRUE(resolved[static_cast<size_t>(source)].defined()) << source;
  // Without the option every read weight is computed.
  EXPECT_TRUE(resolve_weights(program.graph, g.weights)[static_cast<size_t>(folded_weight)].defined());
}

}  // namespace
}  // namespace npusim
