#pragma once
// The parts of a Hugging Face config.json that running a decoder-only model needs. Reads both layouts: the
// classic one (top-level rope_theta / rope_scaling, torch_dtype) and the transformers 5 one (rope_parameters,
// dtype, architectures possibly null).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "npusim/dtype.h"

namespace npusim {

struct RopeScaling {
  std::string type = "default";  // default, linear, dynamic, llama3, yarn
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn; 0 means max_position_embeddings
  int64_t original_max_position_embeddings = 0;
  // yarn
  std::optional<double> attention_factor;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  bool truncate = true;
};

struct ModelConfig {
  std::string source;  // the file it came from, for messages
  std::string model_type;
  std::vector<std::string> architectures;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // 0 when the config does not say
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (always for qwen2)
  DType dtype = DType::Float32;
  std::vector<int64_t> bos_token_ids;
  std::vector<int64_t> eos_token_ids;

  static ModelConfig load(const std::string& path);
  // `source` names the origin in error messages.
  static ModelConfig parse(const std::string& json_text, const std::string& source);

  // Number of rotated channels per head: head_dim * partial_rotary_factor.
  int64_t rotary_dim() const;
  // The rotary inverse frequencies (rotary_dim / 2 values) as Hugging Face computes them in fp32.
  // `seq_len` only matters for dynamic scaling beyond max_position_embeddings.
  std::vector<float> rope_inv_freq(int64_t seq_len = 0) const;
  // Factor applied to cos/sin: 1 except for yarn.
  double attention_scaling() const;
};

}  // namespace npusim
