#pragma once
// A Hugging Face model directory as users have it: config.json, generation_config.json (optional), the tokenizer
// files (optional) and the weights in model.safetensors or in shards listed by model.safetensors.index.json.
// Weights are mapped, never copied: a bf16 checkpoint stays bf16 in memory.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llm/model_config.h"
#include "runtime/weight_store.h"

namespace npusim {

// The sampling defaults a checkpoint ships in generation_config.json; absent fields stay empty.
struct GenerationConfig {
  std::string source;
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::vector<int64_t> eos_token_ids;
  std::vector<int64_t> bos_token_ids;

  static GenerationConfig parse(const std::string& json_text, const std::string& source);
  static GenerationConfig load(const std::string& path);
};

class ModelDir {
 public:
  // Reads config.json and generation_config.json and maps the weight files. Fails naming the directory and the
  // missing or broken file.
  static ModelDir open(const std::string& directory);

  const std::string& path() const { return path_; }
  const ModelConfig& config() const { return config_; }
  const std::optional<GenerationConfig>& generation_config() const { return generation_; }
  // The mapped weight files, in the order they are searched.
  const WeightStore& weights() const { return store_; }
  const std::vector<std::string>& weight_files() const { return weight_files_; }
  // The dtype most weights are stored in (by bytes), e.g. bfloat16 for a bf16 checkpoint.
  DType weight_dtype() const { return weight_dtype_; }
  int64_t weight_bytes() const { return weight_bytes_; }

  // tokenizer.json is present (tokenizer_config.json may be too).
  bool has_tokenizer() const;
  std::string file(const std::string& name) const;  // path of a file in the directory

  // End-of-sequence ids from generation_config.json, else config.json.
  std::vector<int64_t> eos_token_ids() const;

 private:
  std::string path_;
  ModelConfig config_;
  std::optional<GenerationConfig> generation_;
  WeightStore store_;
  std::vector<std::string> weight_files_;
  DType weight_dtype_ = DType::Float32;
  int64_t weight_bytes_ = 0;
};

// The weight files named by a model.safetensors.index.json (its "weight_map" values, in first-seen order),
// as paths next to it. Fails when the index is malformed or a shard is missing.
std::vector<std::string> read_safetensors_index(const std::string& index_path);

}  // namespace npusim
