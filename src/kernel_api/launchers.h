#pragma once
// The devices a kernel launches on. `tensors` has one entry per plan param (undefined for scalars) and
// `scalars` the scalar params' bytes; outputs are prepared (bound, initialized or poisoned) and written in place.
#include <array>
#include <string>
#include <vector>

#include "kernel_api/kernel_plan.h"

namespace npusim::kernels::detail {

using ScalarBytes = std::vector<std::array<std::byte, 8>>;

void launch_cpu(const Plan& plan, std::vector<Tensor>& tensors, const ScalarBytes& scalars);
std::string cpu_generated_source(const Plan& plan);

// Defined in cuda/ when the library is built with CUDA, else they fail (or report) that it is not.
void launch_cuda(const Plan& plan, std::vector<Tensor>& tensors, const ScalarBytes& scalars);
std::string cuda_generated_source(const Plan& plan);
bool cuda_usable(std::string* reason);

}  // namespace npusim::kernels::detail
