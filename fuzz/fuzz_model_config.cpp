// The Hugging Face config.json reader, then the RoPE frequencies every accepted configuration must yield.
// Errors (npusim::Error) are expected; anything else is a finding.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "llm/model_config.h"
#include "npusim/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const npusim::ModelConfig config =
        npusim::ModelConfig::parse(std::string(reinterpret_cast<const char*>(data), size), "config.json");
    config.attention_scaling();
    const std::vector<float> inv_freq = config.rope_inv_freq(8192);
    npusim::fuzz::require(static_cast<int64_t>(inv_freq.size()) == config.rotary_dim() / 2);
  } catch (const npusim::Error&) {
  }
  return 0;
}
