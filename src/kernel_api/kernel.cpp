#include <cstring>

#include "kernel_api/launchers.h"
#include "npusim/error.h"
#include "npusim/kernel_api.h"

namespace npusim::kernels {

namespace {

using detail::Param;
using detail::Plan;

// A fresh output: init_value in every element, or 0xff bytes so that unwritten elements stand out.
Tensor fresh_output(const Param& param, const std::optional<double>& init_value, const std::string& label) {
  Tensor tensor(param.dtype, param.shape);
  std::byte* bytes = tensor.mutable_bytes();
  if (!init_value) {
    std::memset(bytes, 0xff, tensor.nbytes());
    return tensor;
  }
  const auto value =
      detail::encode_value(param.dtype, *init_value, label + ": init_value for output '" + param.name + "',");
  const size_t size = dtype_size(param.dtype);
  for (int64_t i = 0; i < tensor.numel(); ++i) std::memcpy(bytes + static_cast<size_t>(i) * size, value.data(), size);
  return tensor;
}

Tensor bound_output(const Tensor& tensor, const Param& param, const std::string& label) {
  try {
    (void)const_cast<Tensor&>(tensor).mutable_bytes();
  } catch (const Error&) {
    fail(label + ": output '" + param.name + "' is bound to a read-only tensor; it cannot be updated in place");
  }
  return tensor;
}

}  // namespace

Kernel::Kernel(KernelSource source) : source_(std::move(source)) { detail::check_source(source_); }

std::vector<Tensor> Kernel::operator()(const std::map<std::string, Argument>& arguments,
                                       const LaunchConfig& config) const {
  const Plan plan = detail::make_plan(source_, arguments, config);
  const std::string label = plan.label();
  std::vector<Tensor> tensors(plan.params.size());
  detail::ScalarBytes scalars(plan.params.size());
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const Param& param = plan.params[p];
    auto bound = arguments.find(param.name);
    if (param.scalar)
      scalars[p] = detail::encode_value(param.dtype, std::get<Scalar>(bound->second).value,
                                        label + ": scalar '" + param.name + "'");
    else if (!param.output)
      tensors[p] = std::get<Tensor>(bound->second);
    else if (bound != arguments.end())
      tensors[p] = bound_output(std::get<Tensor>(bound->second), param, label);
    else
      tensors[p] = fresh_output(param, config.init_value, label);
  }
  if (plan.device == Device::Cpu)
    detail::launch_cpu(plan, tensors, scalars);
  else
    detail::launch_cuda(plan, tensors, scalars);
  return {tensors.end() - static_cast<std::ptrdiff_t>(source_.outputs.size()), tensors.end()};
}

std::string Kernel::generated_source(const std::map<std::string, Argument>& arguments,
                                     const LaunchConfig& config) const {
  const Plan plan = detail::make_plan(source_, arguments, config);
  return plan.device == Device::Cpu ? detail::cpu_generated_source(plan) : detail::cuda_generated_source(plan);
}

bool cuda_available(std::string* reason) { return detail::cuda_usable(reason); }

#ifndef NPUSIM_HAVE_CUDA
namespace detail {

namespace {
constexpr const char* kNoCuda = "this npusim was built without CUDA (no CUDA toolkit was found at configure time)";
}

void launch_cuda(const Plan& plan, std::vector<Tensor>&, const ScalarBytes&) { fail(plan.label() + ": " + kNoCuda); }
std::string cuda_generated_source(const Plan& plan) { fail(plan.label() + ": " + kNoCuda); }
bool cuda_usable(std::string* reason) {
  if (reason) *reason = kNoCuda;
  return false;
}

}  // namespace detail
#endif

}  // namespace npusim::kernels
