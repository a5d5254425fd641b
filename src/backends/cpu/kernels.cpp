#include "backends/cpu/kernels.h"

namespace npusim::cpu {

void ScratchSpace::allocate(int workers) {
  buffer_ = AlignedBuffer(shared_bytes_ + static_cast<size_t>(workers) * worker_bytes_);
}

void KernelTable::add(const std::string& op, KernelFactory factory) { factories_[op] = std::move(factory); }

const KernelFactory* KernelTable::find(const std::string& op) const {
  auto it = factories_.find(op);
  return it == factories_.end() ? nullptr : &it->second;
}

std::vector<std::string> KernelTable::ops() const {
  std::vector<std::string> names;
  for (const auto& [name, factory] : factories_) names.push_back(name);
  return names;
}

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    add_elementwise_kernels(t);
    add_shape_kernels(t);
    add_linalg_kernels(t);
    add_conv_kernels(t);
    add_nn_kernels(t);
    add_pool_kernels(t);
    add_reduction_kernels(t);
    return t;
  }();
  return table;
}

const float* float_data(const std::byte* data, Elem elem, int64_t count, float* scratch) {
  if (elem == Elem::F32) return reinterpret_cast<const float*>(data);
  to_float(data, elem, scratch, count);
  return scratch;
}

void store_floats(const float* values, std::byte* data, Elem elem, int64_t count) {
  if (elem == Elem::F32 && reinterpret_cast<const std::byte*>(values) == data) return;
  from_float(values, data, elem, count);
}

void share_all_inputs(Kernel& kernel, const KernelContext& ctx) {
  kernel.shareable_inputs.clear();
  for (size_t i = 0; i < ctx.inputs.size(); ++i) kernel.shareable_inputs.push_back(i);
}

size_t floats_bytes(int64_t count) { return count > 0 ? static_cast<size_t>(count) * sizeof(float) : 0; }

}  // namespace npusim::cpu
