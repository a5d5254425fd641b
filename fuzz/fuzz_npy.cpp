// The .npy reader. Errors (npusim::Error) are expected; a sanitizer report or a tensor larger than the file's
// data is a finding.
#include <cstdint>

#include "fuzz_util.h"
#include "npusim/error.h"
#include "runtime/npy.h"

using npusim::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const npusim::fuzz::MemoryFile file(data, size);
  try {
    const npusim::Tensor tensor = npusim::read_npy(file.path());
    require(tensor.nbytes() <= size);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < tensor.nbytes(); ++i) sink = sink ^ static_cast<uint8_t>(tensor.bytes()[i]);
  } catch (const npusim::Error&) {
  }
  return 0;
}
