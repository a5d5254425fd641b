// The .npubin program loader. The input is taken as the FlatBuffer and sealed with a valid footer (size and
// CRC-32), so that mutations reach the structure checks instead of stopping at the checksum; cut and damaged
// footers are covered by the unit tests. Errors (npusim::Error) are expected; anything else is a finding.
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "npusim/error.h"
#include "program/program.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> sealed = npusim::seal_npubin(data, size);
  try {
    const npusim::Program program = npusim::read_program_bytes(sealed.data(), sealed.size(), "fuzz.npubin");
    npusim::describe_program(program);
  } catch (const npusim::Error&) {
  }
  return 0;
}
