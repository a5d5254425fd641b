#ifdef NPUSIM_HAVE_CUDA
#include "kernel_api/launchers.h"
#include "kernel_api/source_gen.h"
#include "npusim/error.h"

namespace npusim::kernels::detail {

void launch_cuda(const Plan& plan, std::vector<Tensor>&, const ScalarBytes&) { fail(plan.label() + ": not ready"); }
std::string cuda_generated_source(const Plan& plan) { return generate_cuda_source(plan, true).text; }
bool cuda_usable(std::string* reason) {
  if (reason) *reason = "not ready";
  return false;
}

}  // namespace npusim::kernels::detail
#endif
