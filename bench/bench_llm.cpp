// Prompt and generation speed of a Qwen2.5-1.5B-shaped model on the CPU backend, and peak resident memory
// against weights + KV cache.
//
//   bench_llm write DIR [--config CONFIG_DIR]   random bf16 weights under the real tensor names (about 3.1 GB)
//   bench_llm run DIR [--threads N] [--prompt P] [--generate G] [--ctx C] [--exported PREFILL DECODE]
//                     [--quantize int8] [--quantize-group N] [--profile]
//   bench_llm compare DIR --exported PREFILL DECODE [--threads N] [--prompt P] [--generate G]
//                                               native builder and exported graphs, step by step
//
// Run each configuration as its own process: the peak resident memory is the process's.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "llm/model_dir.h"
#include "llm/sampler.h"
#include "llm/session.h"
#include "runtime/compare.h"
#include "runtime/safetensors.h"

namespace {

using namespace npusim;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double peak_resident_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// A line of /proc/self/status ("RssAnon", "RssFile") in MiB; -1 where there is none.
double status_mb(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  return -1;
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

// Uniform values with standard deviation `scale` (Hugging Face initializes with std 0.02), as bf16.
Tensor random_bf16(Shape shape, float scale, uint64_t& state) {
  Tensor tensor(DType::BFloat16, std::move(shape));
  auto* bits = tensor.mutable_data<uint16_t>();
  const float half_width = scale * 1.7320508f;
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    const float unit = static_cast<float>((z ^ (z >> 31)) >> 40) * 0x1.0p-24f;  // [0, 1)
    bits[i] = float_to_bf16((2.0f * unit - 1.0f) * half_width);
  }
  return tensor;
}

Tensor ones_bf16(Shape shape) {
  Tensor tensor(DType::BFloat16, std::move(shape));
  std::fill_n(tensor.mutable_data<uint16_t>(), tensor.numel(), float_to_bf16(1.0f));
  return tensor;
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

int write_model(const std::string& dir, const std::string& config_dir) {
  fs::create_directories(dir);
  for (const char* name : {"config.json", "generation_config.json"})
    if (fs::exists(fs::path(config_dir) / name))
      fs::copy_file(fs::path(config_dir) / name, fs::path(dir) / name, fs::copy_options::overwrite_existing);
  const ModelConfig c = ModelConfig::load(dir + "/config.json");
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  uint64_t state = 2024;
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.emplace_back("model.embed_tokens.weight", random_bf16({c.vocab_size, h}, 0.02f, state));
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    tensors.emplace_back(p + "input_layernorm.weight", ones_bf16({h}));
    tensors.emplace_back(p + "post_attention_layernorm.weight", ones_bf16({h}));
    for (const auto& [name, rows] : {std::pair{"q_proj", q}, std::pair{"k_proj", kv}, std::pair{"v_proj", kv}}) {
      tensors.emplace_back(p + "self_attn." + name + ".weight", random_bf16({rows, h}, 0.02f, state));
      if (c.attention_bias) tensors.emplace_back(p + "self_attn." + name + ".bias", random_bf16({rows}, 0.02f, state));
    }
    tensors.emplace_back(p + "self_attn.o_proj.weight", random_bf16({h, q}, 0.02f, state));
    tensors.emplace_back(p + "mlp.gate_proj.weight", random_bf16({c.intermediate_size, h}, 0.02f, state));
    tensors.emplace_back(p + "mlp.up_proj.weight", random_bf16({c.intermediate_size, h}, 0.02f, state));
    tensors.emplace_back(p + "mlp.down_proj.weight", random_bf16({h, c.intermediate_size}, 0.02f, state));
  }
  tensors.emplace_back("model.norm.weight", ones_bf16({h}));
  if (!c.tie_word_embeddings) tensors.emplace_back("lm_head.weight", random_bf16({c.vocab_size, h}, 0.02f, state));
  int64_t bytes = 0;
  for (const auto& [name, tensor] : tensors) bytes += static_cast<int64_t>(tensor.nbytes());
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  std::printf("wrote %s/model.safetensors: %zu tensors, %.3f GB of bf16 weights\n", dir.c_str(), tensors.size(),
              static_cast<double>(bytes) / 1e9);
  return 0;
}

// Bytes of linear weights one decode step reads (every linear layer and the LM head), as stored.
double linear_weight_bytes(const ModelConfig& c, const SessionOptions& options, DType dtype) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const std::vector<std::pair<int64_t, int64_t>> layer = {
      {q, h}, {kv, h}, {kv, h}, {h, q}, {c.intermediate_size, h}, {c.intermediate_size, h}, {h, c.intermediate_size}};
  double bytes = 0;
  const auto add = [&](int64_t rows, int64_t cols, int64_t times) {
    const bool int8 = options.quantize == WeightQuantization::Int8;
    const int64_t group = options.quantization_group > 0 ? options.quantization_group : cols;
    const double per_matrix = int8 ? static_cast<double>(rows * cols + rows * ((cols + group - 1) / group) * 4)
                                   : static_cast<double>(rows * cols * static_cast<int64_t>(dtype_size(dtype)));
    bytes += per_matrix * static_cast<double>(times);
  };
  for (const auto& [rows, cols] : layer) add(rows, cols, c.num_hidden_layers);
  add(c.vocab_size, h, 1);
  return bytes;
}

// Kernel time by op, largest first.
void print_profile(const char* what, const std::vector<KernelTiming>& timings) {
  std::map<std::string, std::pair<double, int>> by_op;
  double total = 0;
  for (const KernelTiming& t : timings) {
    // Linear layers by role ("linear attn.q"), other kernels by op.
    std::string key = t.op;
    if (t.op == "linear") {
      const size_t layer = t.node.rfind("layers.", 0) == 0 ? t.node.find('.', 7) : std::string::npos;
      key += " " + (layer == std::string::npos ? t.node : t.node.substr(layer + 1));
    }
    by_op[key].first += t.milliseconds;
    by_op[key].second += 1;
    total += t.milliseconds;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("%s: %.2f ms in %zu kernels\n", what, total, timings.size());
  for (const auto& [op, time] : rows)
    std::printf("  %-24s %5d calls %9.3f ms %5.1f%%\n", op.c_str(), time.second, time.first,
                100.0 * time.first / std::max(total, 1e-9));
}

int run_model(const std::string& dir, int threads, int64_t prompt_length, int64_t generate, int64_t context,
              const std::string& prefill_ir, const std::string& decode_ir, WeightQuantization quantize,
              int64_t group, bool profile) {
  const auto load_start = Clock::now();
  const ModelDir model = ModelDir::open(dir);
  SessionOptions options{.context = context,
                         .threads = threads,
                         .quantize = quantize,
                         .quantization_group = group,
                         .prefill_ir = prefill_ir,
                         .decode_ir = decode_ir};
  Session session(model, options);
  session.prepare(prompt_length);
  session.set_profiling(profile);
  const double load_seconds = seconds_since(load_start);

  const std::vector<int32_t> prompt = random_prompt(prompt_length, model.config().vocab_size);
  const double cpu_start = cpu_seconds();
  const auto prefill_start = Clock::now();
  std::vector<float> logits = session.feed(prompt);
  const double prefill_seconds = seconds_since(prefill_start);
  const double prefill_cpu = cpu_seconds() - cpu_start;
  const std::vector<KernelTiming> prefill_timings = session.last_timings();
  const auto decode_start = Clock::now();
  for (int64_t i = 0; i < generate; ++i) {
    const int32_t token = argmax(logits);
    logits = session.feed(std::span<const int32_t>(&token, 1));
  }
  const double decode_seconds = seconds_since(decode_start);
  const double decode_cpu = cpu_seconds() - cpu_start - prefill_cpu;

  const ModelConfig& c = model.config();
  const double kv_mb = 2.0 *
                       static_cast<double>(c.num_hidden_layers * c.num_key_value_heads * session.context() *
                                           c.head_dim * static_cast<int64_t>(dtype_size(session.dtype()))) /
                       1e6 / 1.048576;
  const double weights_mb = static_cast<double>(model.weight_bytes()) / 1048576.0;
  const double peak = peak_resident_mb();
  std::printf("%s\n", session.describe().c_str());
  std::printf(
      "| threads | prompt tokens | prompt tokens/s | generated | generation tokens/s | load s | peak RSS MiB | "
      "weights MiB | KV MiB | overhead |\n");
  std::printf("| %d | %lld | %.2f | %lld | %.2f | %.1f | %.0f | %.0f | %.0f | %.1f%% |\n", threads,
              static_cast<long long>(prompt_length), static_cast<double>(prompt_length) / prefill_seconds,
              static_cast<long long>(generate), static_cast<double>(generate) / decode_seconds, load_seconds, peak,
              weights_mb, kv_mb, 100.0 * (peak - weights_mb - kv_mb) / (weights_mb + kv_mb));
  std::printf(
      "cpu time: prompt %.2f s (%.3f s/token), generation %.2f s (%.3f s/token); now resident: %.0f MiB "
      "anonymous, %.0f MiB file-backed (the mapped weights)\n",
      prefill_cpu, prefill_cpu / static_cast<double>(prompt_length), decode_cpu,
      generate ? decode_cpu / static_cast<double>(generate) : 0.0, status_mb("RssAnon"), status_mb("RssFile"));
  if (profile) {
    print_profile("last prefill chunk", prefill_timings);
    print_profile("last decode step", session.last_timings());
  }
  const double step_bytes = linear_weight_bytes(c, options, session.dtype());
  std::printf("generation reads %.3f GB of linear weights per token: %.1f GB/s\n", step_bytes / 1e9,
              step_bytes * static_cast<double>(generate) / decode_seconds / 1e9);
  return 0;
}

Tensor as_tensor(const std::vector<float>& values) {
  Tensor tensor(DType::Float32, {1, static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), tensor.mutable_data<float>());
  return tensor;
}

// The same prompt and greedy steps through both ways to the graph; the tokens follow the native logits.
int compare_graphs(const std::string& dir, int threads, int64_t prompt_length, int64_t generate,
                   const std::string& prefill_ir, const std::string& decode_ir) {
  const ModelDir model = ModelDir::open(dir);
  Session native(model, {.context = 0, .threads = threads});
  Session exported(model, {.threads = threads, .prefill_ir = prefill_ir, .decode_ir = decode_ir});
  std::printf("native:   %s\nexported: %s\n", native.describe().c_str(), exported.describe().c_str());
  std::vector<int32_t> tokens = random_prompt(prompt_length, model.config().vocab_size);
  std::vector<float> a = native.feed(tokens), b = exported.feed(tokens);
  for (int64_t step = 0;; ++step) {
    const Comparison c = compare_tensors(as_tensor(b), as_tensor(a));
    std::printf("step %lld (position %lld): %s\n", static_cast<long long>(step),
                static_cast<long long>(native.position()), c.summary().c_str());
    if (step == generate) break;
    const int32_t token = argmax(a);
    a = native.feed(std::span<const int32_t>(&token, 1));
    b = exported.feed(std::span<const int32_t>(&token, 1));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2 || (args[0] != "write" && args[0] != "run" && args[0] != "compare")) {
    std::fprintf(stderr,
                 "usage: bench_llm write DIR [--config CONFIG_DIR]\n"
                 "       bench_llm run DIR [--threads N] [--prompt P] [--generate G] [--ctx C] "
                 "[--exported PREFILL DECODE] [--quantize int8] [--quantize-group N] [--profile]\n"
                 "       bench_llm compare DIR --exported PREFILL DECODE [--threads N] [--prompt P] [--generate G]\n");
    return 2;
  }
  std::string config_dir = "tests/data/fixtures/qwen2.5-1.5b-instruct", prefill_ir, decode_ir;
  int threads = 1;
  int64_t prompt = 128, generate = 32, context = 0;  // 0: the session's default
  WeightQuantization quantize = WeightQuantization::None;
  int64_t group = 0;
  bool profile = false;
  for (size_t i = 2; i < args.size(); ++i) {
    const auto next = [&]() -> std::string {
      if (i + 1 >= args.size()) throw std::runtime_error(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--config")
      config_dir = next();
    else if (args[i] == "--threads")
      threads = std::stoi(next());
    else if (args[i] == "--prompt")
      prompt = std::stoll(next());
    else if (args[i] == "--generate")
      generate = std::stoll(next());
    else if (args[i] == "--ctx")
      context = std::stoll(next());
    else if (args[i] == "--quantize") {
      const std::string kind = next();
      if (kind != "int8" && kind != "none") {
        std::fprintf(stderr, "--quantize takes none or int8\n");
        return 2;
      }
      quantize = kind == "int8" ? WeightQuantization::Int8 : WeightQuantization::None;
    } else if (args[i] == "--profile")
      profile = true;
    else if (args[i] == "--quantize-group")
      group = std::stoll(next());
    else if (args[i] == "--exported") {
      prefill_ir = next();
      decode_ir = next();
    } else {
      std::fprintf(stderr, "unknown option %s\n", args[i].c_str());
      return 2;
    }
  }
  try {
    if (args[0] == "write") return write_model(args[1], config_dir);
    if (args[0] == "compare") return compare_graphs(args[1], threads, prompt, generate, prefill_ir, decode_ir);
    return run_model(args[1], threads, prompt, generate, context, prefill_ir, decode_ir, quantize, group, profile);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
