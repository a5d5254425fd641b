// The model directory loader: config.json, generation_config.json, model.safetensors.index.json and the
// safetensors files it names, all from one input. Errors (npusim::Error) are expected; anything else is a finding.
//
// Input: the files' contents separated by kSeparator, in the order of kFiles; an empty part leaves that file out.
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "llm/model_dir.h"
#include "npusim/error.h"

namespace {

constexpr std::string_view kSeparator = "\n==> next file <==\n";
constexpr std::array<const char*, 5> kFiles = {"config.json", "generation_config.json", "model.safetensors.index.json",
                                               "model.safetensors", "model-00002-of-00002.safetensors"};

// One directory per process, refilled for every input.
const std::string& directory() {
  static const std::string path = [] {
    char pattern[] = "/tmp/npusim-fuzz-model-XXXXXX";
    if (!mkdtemp(pattern)) std::abort();
    return std::string(pattern);
  }();
  return path;
}

void write_parts(std::string_view input) {
  for (const char* name : kFiles) {
    const size_t end = std::min(input.find(kSeparator), input.size());
    const std::string_view part = input.substr(0, end);
    input.remove_prefix(std::min(input.size(), end + kSeparator.size()));
    const std::string path = directory() + "/" + name;
    if (part.empty()) {
      std::filesystem::remove(path);
      continue;
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(part.data(), static_cast<std::streamsize>(part.size()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_parts(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const npusim::ModelDir model = npusim::ModelDir::open(directory());
    npusim::fuzz::require(model.weight_bytes() >= 0);
    model.eos_token_ids();
    model.config().rope_inv_freq(64);
    for (const npusim::SafetensorsFile& file : model.weights().files())
      for (const std::string& name : file.names()) file.get(name);
  } catch (const npusim::Error&) {
  }
  return 0;
}
