// The GEMV implementations this CPU can run, for tests that force each in turn (force_gemv_isa).
#pragma once

#include <vector>

#include "backends/cpu/gemv.h"

namespace npusim::test {

inline std::vector<cpu::GemvIsa> available_gemv_isas() {
  using cpu::GemvIsa;
  cpu::force_gemv_isa(std::nullopt);
  std::vector<GemvIsa> isas;
  for (GemvIsa isa : {GemvIsa::Portable, GemvIsa::Avx2, GemvIsa::Avx512})
    if (isa <= cpu::gemv_isa()) isas.push_back(isa);
  return isas;
}

}  // namespace npusim::test
