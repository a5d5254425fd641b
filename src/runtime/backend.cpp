#include "runtime/backend.h"

#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "npusim/op_registry.h"

namespace npusim {

bool BackendCapabilities::has_kernel(const std::string& op) const {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

bool BackendCapabilities::supports(const std::string& op) const {
  return has_kernel(op) || (reference_fallback && OpRegistry::instance().find(op) != nullptr);
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>();
  fail("unknown backend '" + name + "' (backends built in: cpu)");
}

}  // namespace npusim
