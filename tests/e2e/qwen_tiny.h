// The qwen_tiny fixture for LLM session tests: a private copy of its model directory, its prompt, logits as a tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "llm/model_dir.h"
#include "npusim/tensor.h"

namespace npusim::test {

inline const std::string kQwenTiny = kFixtures + "/qwen_tiny";

// The fixture's config and weights copied under work_dir(`work`) (no tokenizer, no exported graphs), opened.
inline ModelDir copy_of_qwen_tiny(const std::string& work) {
  const std::string dir = work_dir(work);
  for (const char* name : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(kQwenTiny + "/" + name, dir + "/" + name,
                               std::filesystem::copy_options::overwrite_existing);
  return ModelDir::open(dir);
}

inline std::vector<int32_t> qwen_tiny_prompt() {
  std::ifstream in(kQwenTiny + "/greedy.json");
  return nlohmann::json::parse(in).at("prompt").get<std::vector<int32_t>>();
}

inline Tensor logits_tensor(const std::vector<float>& values) {
  Tensor t(DType::Float32, {1, static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

}  // namespace npusim::test
