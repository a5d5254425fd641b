// npusim bench: latency of a graph or program on the CPU backend, or prompt and generation speed of a model
// directory, with efficiency against what `npusim probe` measures on this machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <thread>

#include "cli_args.h"
#include "commands.h"
#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_dir.h"
#include "llm/sampler.h"
#include "llm/session.h"
#include "loading.h"
#include "npusim/error.h"
#include "runtime/machine_probe.h"
#include "runtime/profiler.h"

namespace npusim::cli {

namespace {

using Clock = std::chrono::steady_clock;

const std::vector<OptionSpec> kBenchOnlyOptions = {
    {"threads", true, "N: CPU threads, counting the caller (default: one per hardware thread)"},
    {"iters", true, "N: timed runs (default 20; with --model 1)"},
    {"warmup", true, "N: untimed runs first (default 3; with --model: single-token steps, default 2)"},
    {"json", false, "end with one JSON object (min_ms, median_ms, max_ms, gflops, gbps, ...) on the last line"},
    {"no-probe", false, "skip the machine probe (no efficiency against peak bandwidth and FLOP/s)"},
    {"profile", false,
     "graphs: after the timed runs, as many profiled ones; per kernel its fastest time, by op: calls, share, GB/s"},
    {"help", false, "show this help"},
};

const std::vector<OptionSpec> kModelBenchOptions = {
    {"model", true, "DIR: benchmark a Hugging Face model directory instead of a graph (prefill, then decode)"},
    {"prompt-tokens", true, "N: with --model, prompt length of the timed prefill (default 128)"},
    {"gen-tokens", true, "N: with --model, timed decode steps after the prompt (default 32)"},
    {"ctx", true, "N: with --model, KV cache positions (default min(4096, max_position_embeddings))"},
    {"prefill-chunk", true, "N: with --model, the largest native prefill step (default 128)"},
    {"quantize", true, "none|int8: with --model, linear weights quantized to int8 at load (default none)"},
    {"quantize-group", true, "N: with --model and --quantize int8, one scale per N input values (multiple of 8)"},
    {"compact-bf16", true, "on|off: with --model on the CPU, bf16 linear weights in 12 bits, lossless (default on)"},
    {"prefill-ir", true, "FILE: with --model, an exported torch_ir prefill graph (with --decode-ir)"},
    {"decode-ir", true, "FILE: with --model, an exported torch_ir decode graph with a static KV cache"},
};

double elapsed_ms(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Spread {
  double min = 0, median = 0, max = 0;
};

Spread spread_of(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  return {values.front(), values[values.size() / 2], values.back()};
}

int resolved_threads(int requested) {
  return requested > 0 ? requested : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// The best this machine does on `threads` threads; empty with --no-probe.
struct Peak {
  bool measured = false;
  double gbps = 0, gflops = 0;
  double bf16_gflops = 0;  // bf16 pair products, where the CPU has them
};

Peak probe_peak(const Args& args, int threads) {
  if (args.flag("no-probe")) return {};
  ProbeOptions options;
  options.threads = threads;
  const MachineProbe probe = probe_machine(options);
  return threads == 1 ? Peak{true, probe.read_gbps_1, probe.fma_gflops_1, probe.bf16_dot_gflops_1}
                      : Peak{true, probe.read_gbps_n, probe.fma_gflops_n, probe.bf16_dot_gflops_n};
}

std::string percent_of(double value, double peak) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * value / peak);
  return text;
}

void add_peak(nlohmann::json& json, const Peak& peak, double gbps, double gflops) {
  if (!peak.measured) return;
  json["peak_gbps"] = peak.gbps;
  json["peak_gflops"] = peak.gflops;
  json["gbps_efficiency"] = gbps / peak.gbps;
  json["gflops_efficiency"] = gflops / peak.gflops;
}

void print_efficiency(const Peak& peak, double gbps, double gflops) {
  if (!peak.measured) return;
  std::printf("efficiency: %s of probed read bandwidth (%.1f GB/s), %s of probed fp32 FMA peak (%.1f GFLOP/s)\n",
              percent_of(gbps, peak.gbps).c_str(), peak.gbps, percent_of(gflops, peak.gflops).c_str(), peak.gflops);
}

void reject_model_options(const Args& args) {
  for (const char* name : {"prompt-tokens", "gen-tokens", "ctx", "prefill-chunk", "quantize", "quantize-group",
                           "compact-bf16", "prefill-ir", "decode-ir"})
    if (args.flag(name)) fail(std::string("npusim bench: option '--") + name + "' needs --model");
}

void reject_graph_options(const Args& args) {
  for (const char* name : {"weights", "config", "random-weights", "inputs", "input", "random-inputs", "disable",
                           "no-fallback", "pack-cache", "profile"})
    if (args.flag(name)) fail(std::string("npusim bench: option '--") + name + "' applies to graphs, not to --model");
  if (!args.positionals().empty()) fail("npusim bench: --model takes no graph or program file");
}

int bench_graph(const Args& args) {
  reject_model_options(args);
  if (args.positionals().size() != 1) fail("npusim bench: expected one graph or program file (or --model DIR)");
  const int threads = resolved_threads(static_cast<int>(args.integer("threads", 0, 0, 1024)));
  const int64_t iters = args.integer("iters", 20, 1, 1000000);
  const int64_t warmup = args.integer("warmup", 3, 0, 1000000);
  const std::string path = args.positionals()[0];

  const auto load_start = Clock::now();
  const PreparedModel model = prepare_model(path, args, BackendOptions{.threads = threads});
  const Program& program = model.program;
  PreparedProgram* prepared = model.executor.get();
  std::map<std::string, Tensor> inputs = load_inputs(program.graph, args);
  const double load_ms = elapsed_ms(load_start);

  for (int64_t i = 0; i < warmup; ++i) prepared->run(inputs);
  std::vector<double> ms;
  for (int64_t i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    prepared->run(inputs);
    ms.push_back(elapsed_ms(start));
  }
  const Spread latency = spread_of(ms);
  // Profiled apart from the timed runs, which the kernel timers would slow.
  std::optional<RunProfile> fastest;
  if (args.flag("profile")) {
    model.executor->set_profiling(true);
    for (int64_t i = 0; i < iters; ++i) {
      prepared->run(inputs);
      fastest = fastest ? fastest_of(*fastest, model.executor->last_profile()) : model.executor->last_profile();
    }
    model.executor->set_profiling(false);
  }

  // After the timed runs, so that writing the file (and the kernel's writing it back) does not fall among them.
  const std::vector<std::string> kept = prepared->keep_packed_weights();

  double flops = 0;
  int64_t bytes = 0;
  for (const Node& node : program.graph.nodes) {
    flops += kernel_flops(program.graph, node);
    bytes += kernel_bytes(program.graph, node, program.plan, program.compute_dtype);
  }
  const double gflops = flops / (latency.median * 1e6);
  const double gbps = static_cast<double>(bytes) / (latency.median * 1e6);
  const Peak peak = probe_peak(args, threads);
  const std::string dtype(dtype_name(program.compute_dtype));
  std::printf("%s: %zu kernels, %s storage, %d thread(s)\n", path.c_str(), program.graph.nodes.size(), dtype.c_str(),
              threads);
  std::printf("latency: min %.3f ms  median %.3f ms  max %.3f ms  (%lld runs after %lld warm-up)\n", latency.min,
              latency.median, latency.max, static_cast<long long>(iters), static_cast<long long>(warmup));
  std::printf("work: %.3f GFLOP, %.1f MB moved -> %.1f GFLOP/s, %.1f GB/s; load and prepare %.1f ms\n", flops / 1e9,
              static_cast<double>(bytes) / 1e6, gflops, gbps, load_ms);
  print_efficiency(peak, gbps, gflops);
  const PrepareCost cost = prepared->prepare_cost();
  for (const std::string& note : cost.notes) std::printf("pack cache: %s\n", note.c_str());
  for (const std::string& note : kept) std::printf("pack cache: %s\n", note.c_str());
  if (fastest)
    std::printf("\nper kernel, its fastest of %lld profiled runs:\n%s", static_cast<long long>(iters),
                format_profile(*fastest).c_str());
  if (args.flag("json")) {
    nlohmann::json json = {{"file", path},
                           {"kernels", program.graph.nodes.size()},
                           {"dtype", dtype},
                           {"threads", threads},
                           {"iters", iters},
                           {"warmup", warmup},
                           {"min_ms", latency.min},
                           {"median_ms", latency.median},
                           {"max_ms", latency.max},
                           {"gflop", flops / 1e9},
                           {"gflops", gflops},
                           {"bytes", bytes},
                           {"gbps", gbps},
                           {"load_ms", load_ms},
                           {"prepare_ms", cost.milliseconds},
                           {"packed_mb", static_cast<double>(cost.packed_bytes) / 1e6},
                           {"mapped_mb", static_cast<double>(cost.mapped_bytes) / 1e6}};
    add_peak(json, peak, gbps, gflops);
    std::printf("%s\n", json.dump().c_str());
  }
  return 0;
}

std::vector<int32_t> random_prompt(int64_t length, int64_t vocab) {
  std::vector<int32_t> prompt;
  uint64_t state = 7;
  for (int64_t i = 0; i < length; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    prompt.push_back(static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab)));
  }
  return prompt;
}

// Estimated work of a decoder-only transformer: every projection weight is multiplied once per token (the token
// embedding only when it doubles as the output head); attention reads the cached keys and values.
struct ModelWork {
  double weight_bytes = 0;      // in the session's storage dtype
  double matmul_params = 0;     // weights multiplied per token
  double kv_bytes_per_pos = 0;  // keys and values of one position, all layers
  double attention_flops_per_pos = 0;

  double decode_bytes(double position) const { return weight_bytes + kv_bytes_per_pos * position; }
  double decode_flops(double position) const { return 2 * matmul_params + attention_flops_per_pos * position; }
  // Causal attention over a fresh prompt: token t attends to t + 1 positions.
  double prefill_flops(double tokens) const {
    return 2 * matmul_params * tokens + attention_flops_per_pos * tokens * (tokens + 1) / 2;
  }
};

// Bytes and FLOPs per token; int8 weight-only quantization stores the matmul weights in one byte each (the
// per-channel or per-group scales are left out: under 1% of it), compact bf16 in 12 bits (escapes left out).
ModelWork model_work(const ModelDir& model, DType storage, WeightQuantization quantization, bool compact) {
  const ModelConfig& c = model.config();
  const double element_bytes = static_cast<double>(dtype_size(storage));
  const double elements =
      static_cast<double>(model.weight_bytes()) / static_cast<double>(dtype_size(model.weight_dtype()));
  ModelWork work;
  const double embedding = static_cast<double>(c.vocab_size * c.hidden_size);
  work.matmul_params = c.tie_word_embeddings ? elements : elements - embedding;
  const double matmul_element_bytes = quantization == WeightQuantization::Int8 ? 1.0 : compact ? 1.5 : element_bytes;
  work.weight_bytes = work.matmul_params * matmul_element_bytes + (elements - work.matmul_params) * element_bytes;
  const double kv_width = static_cast<double>(c.num_key_value_heads * c.head_dim);
  work.kv_bytes_per_pos = 2.0 * static_cast<double>(c.num_hidden_layers) * kv_width * element_bytes;
  // Q.K and P.V: two multiply-adds per head dimension, per query head and layer.
  work.attention_flops_per_pos = 4.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads * c.head_dim);
  return work;
}

int bench_model(const Args& args) {
  reject_graph_options(args);
  const std::string dir = *args.value("model");
  const int threads = resolved_threads(static_cast<int>(args.integer("threads", 0, 0, 1024)));
  const int64_t iters = args.integer("iters", 1, 1, 1000000);
  const int64_t warmup = args.integer("warmup", 2, 0, 1000000);
  const int64_t prompt_tokens = args.integer("prompt-tokens", 128, 1, int64_t{1} << 24);
  const int64_t gen_tokens = args.integer("gen-tokens", 32, 0, int64_t{1} << 24);

  const auto load_start = Clock::now();
  const ModelDir model = ModelDir::open(dir);
  SessionOptions options = session_options(args);
  options.threads = threads;
  Session session(model, options);
  if (prompt_tokens + gen_tokens > session.context())
    fail("npusim bench: --prompt-tokens + --gen-tokens (" + std::to_string(prompt_tokens + gen_tokens) +
         ") exceed the context of " + std::to_string(session.context()) + " positions (see --ctx)");
  session.prepare(prompt_tokens);
  session.prepare(1);
  const double load_ms = elapsed_ms(load_start);

  const std::vector<int32_t> prompt = random_prompt(prompt_tokens, model.config().vocab_size);
  for (int64_t i = 0; i < warmup; ++i) {
    session.feed(std::span<const int32_t>(&prompt[0], 1));
    session.rewind(0);
  }
  std::vector<double> prefill_ms, decode_run_ms, step_ms;
  for (int64_t i = 0; i < iters; ++i) {
    session.rewind(0);
    const auto prefill_start = Clock::now();
    std::vector<float> logits = session.feed(prompt);
    prefill_ms.push_back(elapsed_ms(prefill_start));
    double decode_total = 0;
    for (int64_t step = 0; step < gen_tokens; ++step) {
      const int32_t token = argmax(logits);
      const auto step_start = Clock::now();
      logits = session.feed(std::span<const int32_t>(&token, 1));
      step_ms.push_back(elapsed_ms(step_start));
      decode_total += step_ms.back();
    }
    decode_run_ms.push_back(decode_total);
  }

  const Spread prefill = spread_of(prefill_ms), step = spread_of(step_ms), decode_run = spread_of(decode_run_ms);
  const bool compact = compact_weights(options, session.dtype());
  const ModelWork work = model_work(model, session.dtype(), options.quantize, compact);
  const double middle = static_cast<double>(prompt_tokens) + static_cast<double>(gen_tokens) / 2.0;
  const double prompt_tok_s = static_cast<double>(prompt_tokens) / (prefill.median / 1e3);
  const double prompt_gflops = work.prefill_flops(static_cast<double>(prompt_tokens)) / (prefill.median * 1e6);
  const double decode_tok_s = gen_tokens > 0 ? static_cast<double>(gen_tokens) / (decode_run.median / 1e3) : 0.0;
  const double decode_gbps = gen_tokens > 0 ? work.decode_bytes(middle) / (step.median * 1e6) : 0.0;
  const double decode_gflops = gen_tokens > 0 ? work.decode_flops(middle) / (step.median * 1e6) : 0.0;
  const Peak peak = probe_peak(args, threads);
  // A bf16 model's prompt products run on bf16 pairs on the CPU backend where the CPU has them.
  const bool bf16_products = session.dtype() == DType::BFloat16 && options.backend == "cpu" &&
                             options.quantize == WeightQuantization::None && peak.bf16_gflops > 0;
  const double prompt_peak = bf16_products ? peak.bf16_gflops : peak.gflops;
  const char* prompt_peak_name = bf16_products ? "bf16 dot-product" : "fp32 FMA";

  std::printf("%s: %s, %d thread(s)\n", dir.c_str(), session.describe().c_str(), threads);
  std::printf("prompt: %lld tokens in %.1f ms (median of %lld) -> %.2f tokens/s, %.1f GFLOP/s\n",
              static_cast<long long>(prompt_tokens), prefill.median, static_cast<long long>(iters), prompt_tok_s,
              prompt_gflops);
  std::printf(
      "decode: %lld steps, min %.2f ms  median %.2f ms  max %.2f ms per token -> %.2f tokens/s, "
      "%.1f GB/s, %.1f GFLOP/s\n",
      static_cast<long long>(gen_tokens), step.min, step.median, step.max, decode_tok_s, decode_gbps, decode_gflops);
  std::printf("load and compile %.1f ms; %.1f MB of weights; peak memory %.1f MB\n", load_ms, work.weight_bytes / 1e6,
              peak_memory_mb());
  if (peak.measured)
    std::printf(
        "efficiency: decode %s of probed read bandwidth (%.1f GB/s), prompt %s of probed %s peak (%.1f GFLOP/s)\n",
        percent_of(decode_gbps, peak.gbps).c_str(), peak.gbps, percent_of(prompt_gflops, prompt_peak).c_str(),
        prompt_peak_name, prompt_peak);
  if (args.flag("json")) {
    nlohmann::json json = {{"model", dir},
                           {"session", session.describe()},
                           {"dtype", std::string(dtype_name(session.dtype()))},
                           {"threads", threads},
                           {"iters", iters},
                           {"warmup", warmup},
                           {"prompt_tokens", prompt_tokens},
                           {"gen_tokens", gen_tokens},
                           {"prompt_ms", prefill.median},
                           {"prompt_min_ms", prefill.min},
                           {"decode_run_min_ms", decode_run.min},
                           {"prompt_tok_s", prompt_tok_s},
                           {"prompt_gflops", prompt_gflops},
                           {"decode_tok_s", decode_tok_s},
                           {"decode_gbps", decode_gbps},
                           {"min_ms", step.min},
                           {"median_ms", step.median},
                           {"max_ms", step.max},
                           {"gflops", decode_gflops},
                           {"gbps", decode_gbps},
                           {"load_ms", load_ms},
                           {"weight_mb", work.weight_bytes / 1e6},
                           {"peak_memory_mb", peak_memory_mb()}};
    // The form the linear weights were read in, so that a table can set each against its peer.
    json["linear_weights"] = options.quantize == WeightQuantization::Int8 ? "int8"
                             : compact                                    ? "bfloat16 (12-bit compact)"
                                                                          : std::string(dtype_name(session.dtype()));
    if (peak.measured) {
      json["peak_gbps"] = peak.gbps;
      json["peak_gflops"] = peak.gflops;
      json["prompt_peak_gflops"] = prompt_peak;
      json["decode_gbps_efficiency"] = decode_gbps / peak.gbps;
      json["prompt_gflops_efficiency"] = prompt_gflops / prompt_peak;
    }
    std::printf("%s\n", json.dump().c_str());
  }
  return 0;
}

}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  const Args args(
      "bench",
      join({kWeightOptions, kInputOptions, kCompileOptions, kPackCacheOptions, kBenchOnlyOptions, kModelBenchOptions}),
      argv);
  if (args.flag("help")) {
    std::printf(
        "usage: npusim bench GRAPH.json|PROGRAM.npubin [options]\n"
        "       npusim bench --model DIR [--prompt-tokens N] [--gen-tokens N] [options]\n"
        "With --model, min/median/max are per decode step, gbps and gflops those of decoding.\n%s",
        args.usage().c_str());
    return 0;
  }
  return args.flag("model") ? bench_model(args) : bench_graph(args);
}

}  // namespace npusim::cli
