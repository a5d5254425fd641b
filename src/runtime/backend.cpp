#include "runtime/backend.h"

#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "npusim/op_registry.h"
#ifdef NPUSIM_HAVE_CUDA_BACKEND
#include "backends/cuda/cuda_backend.h"
#endif

namespace npusim {

bool BackendCapabilities::has_kernel(const std::string& op) const {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

bool BackendCapabilities::supports(const std::string& op) const {
  return has_kernel(op) || (reference_fallback && OpRegistry::instance().find(op) != nullptr);
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu")
    return std::make_unique<cpu::CpuBackend>(cpu::CpuOptions{.threads = options.threads,
                                                             .weights = options.weights,
                                                             .quantization_group = options.quantization_group,
                                                             .pack_cache = options.pack_cache,
                                                             .compact_bf16 = options.compact_bf16});
#ifdef NPUSIM_HAVE_CUDA_BACKEND
  // The device is opened when a program is prepared, so capabilities are known on machines without a GPU.
  if (name == "cuda") {
    if (options.weights != WeightQuantization::None) fail("cuda backend: int8 weight quantization is not supported");
    return std::make_unique<cuda::CudaBackend>();
  }
  fail("unknown backend '" + name + "' (backends built in: cpu, cuda)");
#else
  if (name == "cuda") fail("backend 'cuda' is not built in (build with the CUDA toolkit, nvcc included)");
  fail("unknown backend '" + name + "' (backends built in: cpu)");
#endif
}

}  // namespace npusim
