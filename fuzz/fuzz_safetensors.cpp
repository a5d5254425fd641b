// The safetensors reader: a file of arbitrary bytes is opened, and every tensor it accepts is read in full.
// Errors (npusim::Error) are expected; a sanitizer report or a tensor that reaches past the file is a finding.
#include <cstdint>
#include <cstring>

#include "fuzz_util.h"
#include "npusim/error.h"
#include "runtime/safetensors.h"

using npusim::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const npusim::fuzz::MemoryFile file(data, size);
  try {
    const npusim::SafetensorsFile safetensors = npusim::SafetensorsFile::open(file.path());
    require(size >= 8);
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, data, sizeof header_bytes);
    const uint64_t data_section = size - 8 - header_bytes;
    for (const std::string& name : safetensors.names()) {
      const npusim::SafetensorsEntry& entry = safetensors.entry(name);
      require(entry.begin <= entry.end && entry.end <= data_section);
      const npusim::Tensor tensor = safetensors.get(name);
      require(tensor.nbytes() == entry.end - entry.begin);
      // The mapping is not tracked by ASan: compare against the input so that every byte is read.
      if (tensor.nbytes())
        require(std::memcmp(tensor.bytes(), data + 8 + header_bytes + entry.begin, tensor.nbytes()) == 0);
    }
  } catch (const npusim::Error&) {
  }
  return 0;
}
