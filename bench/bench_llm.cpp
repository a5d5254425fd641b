// Writes a random Qwen2.5-1.5B-shaped checkpoint: bf16 weights under the real tensor names (about 3.1 GB), next to
// the config it copies. Time the model with `npusim bench --model DIR`.
//
//   bench_llm write DIR [--config CONFIG_DIR]
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "llm/model_config.h"
#include "npusim/dtype.h"
#include "npusim/tensor.h"
#include "runtime/safetensors.h"

namespace {

using namespace npusim;
namespace fs = std::filesystem;

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

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const bool with_config = args.size() == 4 && args[2] == "--config";
  if (args.size() < 2 || args[0] != "write" || (args.size() != 2 && !with_config)) {
    std::fprintf(stderr,
                 "usage: bench_llm write DIR [--config CONFIG_DIR]\n"
                 "(time the model with: npusim bench --model DIR)\n");
    return 2;
  }
  const std::string config_dir = with_config ? args[3] : "tests/data/fixtures/qwen2.5-1.5b-instruct";
  try {
    return write_model(args[1], config_dir);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
