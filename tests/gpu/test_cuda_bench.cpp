// Timings of the CUDA backend on the models the issue names (seeded random weights): ResNet-18/50 batch 1,
// Qwen2.5-1.5B-shaped bf16 decode at context 128 and prefill of 128 tokens. Measured, never asserted beyond the
// outputs being finite; runs only with NPUSIM_CUDA_BENCH=1 (it takes a minute and 8 GB of host memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>

#include "backends/cuda/attention_decode.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/device_kernels.h"
#include "compiler/compile.h"
#include "gpu/graph_blocks.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "llm/native_builder.h"
#include "runtime/random_fill.h"
#include "runtime/weight_transforms.h"

namespace npusim {
namespace {

const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";

bool benchmarks_wanted() {
  const char* text = std::getenv("NPUSIM_CUDA_BENCH");
  return text && std::string(text) == "1";
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Quick seeded weights in the graph's dtype: uniform with the He scale for matrices, near 1 for norm weights.
Tensor fast_weight(const Value& value, uint64_t seed) {
  if (!is_floating(value.meta.dtype) || value.meta.shape.size() < 2) return random_weight(value, seed);
  Tensor out(DType::BFloat16, value.meta.shape);
  const int64_t n = out.numel();
  const double fan_in = static_cast<double>(n / std::max<int64_t>(value.meta.shape[0], 1));
  const auto scale = static_cast<float>(std::sqrt(6.0 / std::max(fan_in, 1.0)));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + std::hash<std::string>{}(value.name);
  auto* data = out.mutable_data<uint16_t>();
  for (int64_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const float unit = static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
    data[i] = float_to_bf16((unit * 2.0f - 1.0f) * scale);
  }
  return out;
}

std::vector<std::pair<ValueId, Tensor>> weights_for(const Program& program, bool fast) {
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (ValueId id : program.graph.weights) {
    const Value& value = program.graph.value(id);
    if (value.transform || program.graph.constants.count(value.weight_key)) continue;
    weights.emplace_back(id, fast ? fast_weight(value, 7) : random_weight(value, 7));
  }
  add_derived_weights(program.graph, weights);
  return weights;
}

Program compile_for(const std::string& path, DType storage) {
  compiler::CompileOptions options;
  options.compute_dtype = storage;
  return compiler::compile_graph(read_torch_ir(path), options);
}

// Sum of the per-kernel GPU times of one profiled run (each kernel timed alone, launch gaps left out), and the
// same per op.
double kernel_ms(PreparedProgram& prepared, const std::map<std::string, Tensor>& inputs, bool by_op = false) {
  prepared.set_profiling(true);
  prepared.run(inputs);
  double total = 0.0;
  std::map<std::string, std::pair<int, double>> ops;
  for (const KernelTiming& timing : prepared.last_timings()) {
    total += timing.milliseconds;
    ops[timing.op].first += 1;
    ops[timing.op].second += timing.milliseconds;
  }
  prepared.set_profiling(false);
  if (by_op)
    for (const auto& [op, entry] : ops)
      std::printf("  %-20s %4d kernels %8.3f ms\n", op.c_str(), entry.first, entry.second);
  return total;
}

TEST(CudaBench, ResNet) {
  if (!benchmarks_wanted()) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH=1";
  for (const char* arch : {"resnet18", "resnet50"}) {
    for (const DType storage : {DType::Float16, DType::BFloat16, DType::Float32}) {
      const Program program = compile_for(kFixtures + "/ir/" + arch + "_ir.json", storage);
      auto prepared = cuda::CudaBackend().prepare(program, weights_for(program, false));
      const std::map<std::string, Tensor> inputs{{"x", random_input(program.graph.value(program.graph.inputs[0]), 5)}};
      for (int i = 0; i < 10; ++i) prepared->run(inputs);
      std::vector<double> times;
      bool finite = true;
      for (int i = 0; i < 100; ++i) {
        const double start = now_ms();
        const Tensor logits = prepared->run(inputs)[0].second;
        times.push_back(now_ms() - start);
        finite = finite && std::isfinite(logits.data<float>()[0]);  // random fp16 weights may overflow
      }
      const bool replayed = cuda::replays_graph(*prepared);
      // The device time of a replay, as the PyTorch peer's CUDA-event timing of its graph (no copies in or out).
      const double device = replayed ? cuda::graph_replay_milliseconds(*prepared, 100) : 0.0;
      const double kernels = kernel_ms(*prepared, inputs);
      std::printf(
          "BENCH %s %s batch 1: run %.3f ms median (min %.3f; input and logits copied), graph replay on the device "
          "%.3f ms, kernels alone %.3f ms, graph replay %s, %zu nodes on the host%s\n",
          arch, std::string(dtype_name(storage)).c_str(), median(times), *std::min_element(times.begin(), times.end()),
          device, kernels, replayed ? "yes" : "no", prepared->fallback_nodes().size(),
          finite ? "" : " (logits not finite)");
    }
  }
}

// Batched throughput of the graphs named in NPUSIM_CUDA_BENCH_BATCH_IRS (comma-separated torch_ir files, e.g. the
// ResNet fixtures rebatched by bench/rebatch_ir.py), fp16; the run time includes copying the input in and the
// logits out.
TEST(CudaBench, ResNetBatch) {
  if (!benchmarks_wanted()) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH=1";
  const char* list = std::getenv("NPUSIM_CUDA_BENCH_BATCH_IRS");
  if (!list) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH_BATCH_IRS to rebatched graphs (bench/rebatch_ir.py)";
  std::string rest = list;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string path = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const Program program = compile_for(path, DType::Float16);
    auto prepared = cuda::CudaBackend().prepare(program, weights_for(program, false));
    const Value& input = program.graph.value(program.graph.inputs[0]);
    const std::map<std::string, Tensor> inputs{{input.name, random_input(input, 5)}};
    for (int i = 0; i < 5; ++i) prepared->run(inputs);
    std::vector<double> times;
    for (int i = 0; i < 30; ++i) {
      const double start = now_ms();
      prepared->run(inputs);
      times.push_back(now_ms() - start);
    }
    const int64_t batch = input.meta.shape.empty() ? 1 : input.meta.shape[0];
    const double run = median(times);
    const double device = cuda::replays_graph(*prepared) ? cuda::graph_replay_milliseconds(*prepared, 20) : 0.0;
    std::printf(
        "BENCH %s fp16 batch %lld: run %.3f ms median (min %.3f), %.0f images/s; graph replay on the device %.3f ms = "
        "%.0f images/s; kernels alone %.3f ms\n",
        path.c_str(), static_cast<long long>(batch), run, *std::min_element(times.begin(), times.end()),
        static_cast<double>(batch) * 1000.0 / run, device,
        device > 0 ? static_cast<double>(batch) * 1000.0 / device : 0.0, kernel_ms(*prepared, inputs));
  }
}

Tensor int64_tensor(Shape shape, const std::vector<int64_t>& values) {
  Tensor t(DType::Int64, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.mutable_data<int64_t>()[i] = values[i];
  return t;
}

TEST(CudaBench, QwenDecodeAndPrefill) {
  if (!benchmarks_wanted()) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH=1";
  {
    // $NPUSIM_CUDA_BENCH_DECODE_IR: the same decode graph with a longer cache (the fixture's holds 2048 positions).
    const char* long_ir = std::getenv("NPUSIM_CUDA_BENCH_DECODE_IR");
    const Program program =
        compile_for(long_ir ? std::string(long_ir) : kFixtures + "/ir/qwen15_decode_ir.json", DType::BFloat16);
    const Graph& graph = program.graph;
    std::vector<std::pair<std::string, std::string>> pairs;
    for (size_t i = 4; i < graph.inputs.size(); ++i)
      pairs.emplace_back(graph.value(graph.inputs[i]).name, graph.value(graph.outputs[i - 3]).name);
    const double load_start = now_ms();
    auto prepared = cuda::CudaBackend().prepare_with_state(program, weights_for(program, true), pairs);
    const double load_ms = now_ms() - load_start;
    const int64_t cache = graph.value(graph.inputs[1]).meta.shape.back();
    auto step = [&](int64_t position) {
      Tensor mask(DType::Float32, {1, 1, 1, cache});
      for (int64_t j = 0; j < cache; ++j)
        mask.mutable_data<float>()[j] = j <= position ? 0.0f : -std::numeric_limits<float>::infinity();
      return std::map<std::string, Tensor>{{"input_ids", int64_tensor({1, 1}, {(position * 7919) % 151936})},
                                           {"attention_mask", mask},
                                           {"position_ids", int64_tensor({1, 1}, {position})},
                                           {"cache_position", int64_tensor({1}, {position})}};
    };
    // Attention reads keys 0..position only, so a step's time depends on its position, not on the steps before.
    auto per_token_ms = [&](int64_t first) {
      std::vector<std::map<std::string, Tensor>> steps;
      for (int64_t position = first; position < first + 64 && position < cache; ++position)
        steps.push_back(step(position));
      for (int i = 0; i < 8; ++i) prepared->run(steps[static_cast<size_t>(i)]);
      const double start = now_ms();
      for (const auto& inputs : steps) {
        const Tensor logits = prepared->run(inputs)[0].second;
        EXPECT_TRUE(std::isfinite(logits.data<float>()[0]));
      }
      return (now_ms() - start) / static_cast<double>(steps.size());
    };
    for (int64_t position = 0; position < 128; ++position) prepared->run(step(position));
    const double per_token = per_token_ms(128);
    const bool replayed = cuda::replays_graph(*prepared);
    const double kernels = kernel_ms(*prepared, step(192), true);
    // The first layer's projections and the LM head, with the bandwidth their weights alone need.
    for (const KernelTiming& t : prepared->last_timings()) {
      const Node* node = nullptr;
      for (const Node& candidate : graph.nodes)
        if (candidate.name == t.node) node = &candidate;
      if (!node || node->op != "linear") continue;
      const double bytes = 2.0 * static_cast<double>(shape_numel(graph.value(node->inputs[1]).meta.shape));
      if (t.node == "linear" || t.node.size() <= 8 || t.node == graph.nodes.back().name)
        std::printf("  %-12s %-34s %8.4f ms  %6.0f GB/s\n", t.node.c_str(), t.op.c_str(), t.milliseconds,
                    bytes / t.milliseconds / 1e6);
    }
    double weight_bytes = 0.0;  // every linear's weights, each read once per token
    for (const Node& node : graph.nodes)
      if (node.op == "linear")
        weight_bytes += 2.0 * static_cast<double>(shape_numel(graph.value(node.inputs[1]).meta.shape));
    size_t launches = 0;
    for (const KernelTiming& t : prepared->last_timings())
      if (t.op != "reshape" && t.op != "transpose" && t.op != "unsqueeze" && t.op != "view") ++launches;
    std::printf(
        "BENCH qwen2.5-1.5b bf16 decode at context 128-192: %.3f ms/token = %.1f tok/s (kernels alone %.3f ms), "
        "%zu launches per token (%zu entries with the aliasing views), weights %.2f GB at %.0f GB/s, %zu nodes, "
        "%zu on the host, graph replay %s, load %.0f ms, cache %lld positions\n",
        per_token, 1000.0 / per_token, kernels, launches, prepared->last_timings().size(), weight_bytes / 1e9,
        weight_bytes / per_token / 1e6, graph.nodes.size(), prepared->fallback_nodes().size(), replayed ? "yes" : "no",
        load_ms, static_cast<long long>(cache));
    for (const int64_t context : {int64_t{1024}, int64_t{8128}}) {
      if (context + 64 > cache) continue;
      const double late = per_token_ms(context);
      std::printf(
          "BENCH qwen2.5-1.5b bf16 decode at context %lld-%lld: %.3f ms/token = %.1f tok/s (%.2fx context 128)\n",
          static_cast<long long>(context), static_cast<long long>(context + 64), late, 1000.0 / late, late / per_token);
      kernel_ms(*prepared, step(context + 63), true);
    }
  }
  {
    const Program program = compile_for(kFixtures + "/ir/qwen15_prefill_ir.json", DType::BFloat16);
    auto prepared = cuda::CudaBackend().prepare(program, weights_for(program, true));
    std::vector<int64_t> ids(128), positions(128), ones(128, 1);
    for (int64_t i = 0; i < 128; ++i) {
      ids[static_cast<size_t>(i)] = (i * 7919) % 151936;
      positions[static_cast<size_t>(i)] = i;
    }
    const std::map<std::string, Tensor> inputs{{"input_ids", int64_tensor({1, 128}, ids)},
                                               {"attention_mask", int64_tensor({1, 128}, ones)},
                                               {"position_ids", int64_tensor({1, 128}, positions)},
                                               {"cache_position", int64_tensor({128}, positions)}};
    for (int i = 0; i < 3; ++i) prepared->run(inputs);
    std::vector<double> times;
    for (int i = 0; i < 10; ++i) {
      const double start = now_ms();
      prepared->run(inputs);
      times.push_back(now_ms() - start);
    }
    const double kernels = kernel_ms(*prepared, inputs, true);
    std::printf(
        "BENCH qwen2.5-1.5b bf16 prefill 128 tokens: run %.3f ms median (all logits copied out), kernels "
        "alone %.3f ms, %zu on the host\n",
        median(times), kernels, prepared->fallback_nodes().size());
  }
}

// Microseconds per launch of `launch(0 .. layers - 1)` captured into one CUDA graph on `stream` and replayed 20 times
// back to back (after one warm-up replay), timed with CUDA events.
double replayed_microseconds(cudaStream_t stream, int layers, const std::function<cudaError_t(int)>& launch,
                             const std::string& what) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  NPUSIM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), what);
  for (int l = 0; l < layers; ++l) NPUSIM_CUDA_CHECK(launch(l), what);
  NPUSIM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), what);
  NPUSIM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0), what);
  NPUSIM_CUDA_CHECK(cudaGraphLaunch(exec, stream), what);
  const double milliseconds = cuda::replay_milliseconds(exec, stream, 20, what);
  NPUSIM_CUDA_CHECK(cudaGraphExecDestroy(exec), what);
  NPUSIM_CUDA_CHECK(cudaGraphDestroy(graph), what);
  return 1000.0 * milliseconds / layers;
}

// Decode's GEMVs at Qwen2.5-1.5B's shapes (bf16) under each launch shape: a CUDA graph of one launch per layer,
// each layer its own weights (more than L2 holds), replayed; microseconds per launch and GB/s of weights.
TEST(CudaBench, GemvShapes) {
  if (!benchmarks_wanted()) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH=1";
  using cuda::GemvSegment;
  struct Case {
    const char* name;
    int64_t k;
    std::vector<int64_t> rows;  // one segment each; the gated form takes two equal ones
    bool gated, norm;
    int layers;
  };
  const std::vector<Case> cases{{"q/k/v + norm", 1536, {1536, 256, 256}, false, true, 28},
                                {"o_proj", 1536, {1536}, false, false, 28},
                                {"gate/up + norm", 1536, {8960, 8960}, true, true, 28},
                                {"down_proj", 8960, {1536}, false, false, 28},
                                {"lm_head + norm", 1536, {151936}, false, true, 3}};
  cuda::ensure_device();
  cudaStream_t stream = nullptr;
  NPUSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "gemv bench");
  for (const Case& c : cases) {
    int64_t rows = 0;
    for (int64_t r : c.rows) rows += r;
    const size_t weight_bytes = static_cast<size_t>(rows * c.k * 2);
    std::vector<cuda::DeviceBuffer> weights;
    for (int l = 0; l < c.layers; ++l) {
      weights.emplace_back(weight_bytes, "gemv bench weights");
      NPUSIM_CUDA_CHECK(cudaMemset(weights.back().data(), 0x3c, weight_bytes), "gemv bench");
    }
    cuda::DeviceBuffer x(static_cast<size_t>(c.k * 2), "x"), gain(static_cast<size_t>(c.k * 2), "gain"),
        y(static_cast<size_t>(rows * 2), "y");
    NPUSIM_CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.size()), "gemv bench");
    NPUSIM_CUDA_CHECK(cudaMemset(gain.data(), 0x3f, gain.size()), "gemv bench");
    cuda::GemvNorm norm;
    norm.enabled = c.norm;
    norm.weight = gain.data();
    norm.elem = cuda::kBF16;
    norm.eps = 1e-6;
    const int tasks_per_row = c.gated ? 2 : 1;
    const cuda::GemvShape chosen = cuda::gemv_default_shape(rows / tasks_per_row, c.k, cuda::kBF16);
    auto launch = [&](int layer, cuda::GemvShape shape) {
      std::vector<GemvSegment> segments;
      int64_t offset = 0;
      for (int64_t r : c.rows) {
        GemvSegment segment;
        segment.w = weights[static_cast<size_t>(layer)].data() + offset * c.k * 2;
        segment.y = y.data() + offset * 2;
        segment.rows = r;
        segments.push_back(segment);
        offset += r;
      }
      if (c.gated)
        return cuda::launch_gemv_gated(stream, c.k, cuda::kBF16, x.data(), segments[0], segments[1], norm, shape);
      return cuda::launch_gemv_batch(stream, c.k, cuda::kBF16, x.data(), segments.data(),
                                     static_cast<int>(segments.size()), norm, shape);
    };
    for (const int parts : {1, 2, 4})
      for (const int unroll : {2, 4, 8}) {
        const cuda::GemvShape shape{parts, unroll};
        const double us = replayed_microseconds(
            stream, c.layers, [&](int layer) { return launch(layer, shape); }, c.name);
        const bool is_default = shape.parts == chosen.parts && shape.unroll == chosen.unroll;
        std::printf("BENCH gemv %-15s parts %d unroll %d: %8.2f us %6.0f GB/s%s\n", c.name, parts, unroll, us,
                    static_cast<double>(weight_bytes) / us / 1e3, is_default ? "  (default)" : "");
      }
  }
  NPUSIM_CUDA_CHECK(cudaStreamDestroy(stream), "gemv bench");
}

// Decode attention at Qwen2.5-1.5B's shape (12 query heads over 2 key/value heads of 128, bf16, a cache of 8192
// positions) at several contexts: a CUDA graph of one launch per layer, each layer its own cache, replayed.
TEST(CudaBench, DecodeAttention) {
  if (!benchmarks_wanted()) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH=1";
  constexpr int kLayers = 28;
  constexpr int64_t kCache = 8192, kQHeads = 12, kKvHeads = 2, kWidth = 128;
  cuda::ensure_device();
  cudaStream_t stream = nullptr;
  NPUSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "attention bench");
  const size_t cache_bytes = static_cast<size_t>(kKvHeads * kCache * kWidth * 2);
  std::vector<cuda::DeviceBuffer> keys, values;
  for (int l = 0; l < kLayers; ++l) {
    keys.emplace_back(cache_bytes, "keys");
    values.emplace_back(cache_bytes, "values");
    NPUSIM_CUDA_CHECK(cudaMemset(keys.back().data(), 0x3c, cache_bytes), "attention bench");
    NPUSIM_CUDA_CHECK(cudaMemset(values.back().data(), 0x3c, cache_bytes), "attention bench");
  }
  cuda::DeviceBuffer query(static_cast<size_t>(kQHeads * kWidth * 2), "query"),
      out(static_cast<size_t>(kQHeads * kWidth * 2), "out"), mask(static_cast<size_t>(kCache * 4), "mask"),
      position(sizeof(int64_t), "position");
  NPUSIM_CUDA_CHECK(cudaMemset(query.data(), 0x3c, query.size()), "attention bench");
  for (const int64_t context : {int64_t{128}, int64_t{160}, int64_t{1024}, int64_t{8192}}) {
    std::vector<float> mask_values(static_cast<size_t>(kCache), -std::numeric_limits<float>::infinity());
    std::fill(mask_values.begin(), mask_values.begin() + context, 0.0f);
    NPUSIM_CUDA_CHECK(cudaMemcpy(mask.data(), mask_values.data(), mask.size(), cudaMemcpyHostToDevice), "bench");
    const int64_t last = context - 1;
    NPUSIM_CUDA_CHECK(cudaMemcpy(position.data(), &last, sizeof(last), cudaMemcpyHostToDevice), "bench");
    cuda::AttentionParams p{};
    p.batch = 1;
    p.q_heads = kQHeads;
    p.k_heads = p.v_heads = kKvHeads;
    p.length = 1;
    p.source = kCache;
    p.embed = p.value_embed = kWidth;
    p.scale = 1.0f / std::sqrt(static_cast<float>(kWidth));
    p.mask = mask.data();
    p.mask_elem = cuda::kF32;
    p.mask_column_stride = 1;
    p.cache_position = reinterpret_cast<const int64_t*>(position.data());
    p.cache_position_count = 1;
    p.positions_ready = true;  // copied in before the graph runs, as a graph input is
    // First what launch_attention picks, then the decode form's runs of at least / at most so many keys.
    const std::vector<cuda::DecodeTuning> tunings{{0, 0}, {128, 32}, {128, 64}, {256, 32}, {256, 64}};
    for (size_t which = 0; which < tunings.size(); ++which) {
      const cuda::DecodeTuning tuning = tunings[which];
      const int64_t floats =
          which == 0 ? cuda::attention_scratch_floats(p) : cuda::decode_attention_scratch_floats(p, tuning);
      cuda::DeviceBuffer scratch(static_cast<size_t>(std::max<int64_t>(floats, 1) * 4), "scratch");
      NPUSIM_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.size()), "attention bench");
      auto* partials = reinterpret_cast<float*>(scratch.data());
      const double us = replayed_microseconds(
          stream, kLayers,
          [&](int layer) {
            const cuda::Operand q{query.data(), cuda::kBF16};
            const void* k = keys[static_cast<size_t>(layer)].data();
            const void* v = values[static_cast<size_t>(layer)].data();
            return which == 0 ? cuda::launch_attention(stream, p, out.data(), cuda::kBF16, q, {k, cuda::kBF16},
                                                       {v, cuda::kBF16}, partials)
                              : cuda::launch_decode_attention(stream, p, cuda::kBF16, out.data(), cuda::kBF16, q, k, v,
                                                              partials, tuning);
          },
          "decode attention");
      const double bytes = 2.0 * static_cast<double>(kKvHeads * context * kWidth * 2);
      std::printf("BENCH decode attention context %5lld, %s: %7.2f us per layer, cache read at %5.0f GB/s\n",
                  static_cast<long long>(context),
                  which == 0
                      ? "default          "
                      : ("runs >= " + std::to_string(tuning.min_run_keys) + ", <= " + std::to_string(tuning.max_splits))
                            .c_str(),
                  us, bytes / us / 1e3);
    }
  }
  NPUSIM_CUDA_CHECK(cudaStreamDestroy(stream), "attention bench");
}

// Time to first token as `npusim generate --target cuda` runs it: the native graph of a 128-token prompt against a
// 4096-position cache, logits of the last token only.
TEST(CudaBench, QwenNativePrefill) {
  if (!benchmarks_wanted()) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH=1";
  const ModelConfig config = ModelConfig::load(kFixtures + "/qwen2.5-1.5b-instruct/config.json");
  constexpr int64_t kTokens = 128, kContext = 4096;
  compiler::CompileOptions options;
  options.compute_dtype = DType::BFloat16;
  const Program program =
      compiler::compile_graph(build_native_graph(config, {.tokens = kTokens, .context = kContext}), options);
  auto prepared =
      cuda::CudaBackend().prepare_with_state(program, weights_for(program, true), native_cache_pairs(config));
  std::vector<int64_t> ids(kTokens), positions(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) {
    ids[static_cast<size_t>(i)] = (i * 7919) % config.vocab_size;
    positions[static_cast<size_t>(i)] = i;
  }
  const std::map<std::string, Tensor> inputs{{"input_ids", int64_tensor({1, kTokens}, ids)},
                                             {"position_ids", int64_tensor({1, kTokens}, positions)},
                                             {"cache_position", int64_tensor({kTokens}, positions)},
                                             {"attention_mask", causal_chunk_mask(0, kTokens, kContext)}};
  for (int i = 0; i < 3; ++i) prepared->run(inputs);
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    const double start = now_ms();
    const Tensor logits = prepared->run(inputs)[0].second;
    times.push_back(now_ms() - start);
    EXPECT_TRUE(std::isfinite(logits.data<float>()[0]));
  }
  const bool replayed = cuda::replays_graph(*prepared);
  const std::string failure = cuda::graph_capture_failure(*prepared);
  const double device = replayed ? cuda::graph_replay_milliseconds(*prepared, 20) : 0.0;
  const double kernels = kernel_ms(*prepared, inputs, true);
  std::printf(
      "BENCH qwen2.5-1.5b bf16 native prefill of %lld tokens (last-token logits, %lld-position cache): run %.3f ms "
      "median (min %.3f), graph replay on the device %.3f ms, kernels alone %.3f ms, %zu nodes on the host, graph "
      "replay %s%s\n",
      static_cast<long long>(kTokens), static_cast<long long>(kContext), median(times),
      *std::min_element(times.begin(), times.end()), device, kernels, prepared->fallback_nodes().size(),
      replayed ? "yes" : "no", failure.empty() ? "" : (" (capture failed: " + failure + ")").c_str());
}

// A GELU written out as ten pointwise ops (bias add, pow, mul, add, mul, tanh, add, mul, mul, row scale) on bf16
// [8192, 4096]: one generated kernel against the ten kernels run one by one. Bytes moved: x read and the output
// written once (the bias and the row scales are small). Peer: bench/peers/gpu_pointwise.py.
TEST(CudaBench, PointwiseRun) {
  if (!benchmarks_wanted()) GTEST_SKIP() << "set NPUSIM_CUDA_BENCH=1 to run the benchmarks";
  const Shape shape{8192, 4096};
  const test::GeluBlock block = test::gelu_block(DType::BFloat16, shape, false);
  const test::Built& b = block.built;
  const double bytes = 2.0 * 2.0 * static_cast<double>(shape_numel(shape));
  for (const bool fuse : {true, false}) {
    cuda::CudaBackend backend({.fuse_kernels = fuse});
    const auto prepared = backend.prepare(test::program_for(b.graph, DType::BFloat16), b.weights);
    for (int run = 0; run < 3; ++run) prepared->run(b.inputs);
    const double device = cuda::graph_replay_milliseconds(*prepared, 50);
    std::printf("BENCH pointwise gelu block bf16 [8192, 4096] %s: %.4f ms device, %zu kernels, %.0f GB/s\n",
                fuse ? "fused" : "unfused", device, prepared->last_timings().size(), bytes / device / 1e6);
  }
}

}  // namespace
}  // namespace npusim

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!testing::GTEST_FLAG(list_tests)) {
    try {
      std::printf("test_cuda_bench on %s\n", npusim::cuda::gpu_name().c_str());
    } catch (const npusim::Error& error) {
      std::fprintf(stderr, "test_cuda_bench: these benchmarks need a CUDA GPU: %s\n", error.what());
      return 1;
    }
  }
  return RUN_ALL_TESTS();
}
