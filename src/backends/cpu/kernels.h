#pragma once
// The CPU kernel interface. A factory looks at one node at prepare time (shapes, dtypes, attributes, where every
// input and output lives) and returns a closure with everything precomputed, or nothing when it does not handle
// that case (the node then runs on the reference fallback).
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/storage.h"
#include "backends/cpu/thread_pool.h"
#include "npusim/graph.h"

namespace npusim::cpu {

// One value as a kernel sees it.
struct Buffer {
  std::byte* data = nullptr;
  Elem elem = Elem::F32;
  TensorMeta meta;  // graph shape and dtype

  int64_t numel() const { return shape_numel(meta.shape); }
  size_t bytes() const { return static_cast<size_t>(numel()) * elem_size(elem); }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data);
  }
};

// Scratch memory reserved while kernels are built and allocated once afterwards. Kernels run one at a time, so
// every kernel's shared region starts at the same address; per-worker regions are one per pool thread.
class ScratchSpace {
 public:
  void reserve_shared(size_t bytes) { shared_bytes_ = std::max(shared_bytes_, round_up(bytes)); }
  void reserve_per_worker(size_t bytes) { worker_bytes_ = std::max(worker_bytes_, round_up(bytes)); }
  void allocate(int workers);
  size_t allocated_bytes() const { return buffer_.size(); }
  const AlignedBuffer& buffer() const { return buffer_; }

  // Valid at run time (after allocate).
  std::byte* shared() const { return buffer_.data(); }
  std::byte* worker(int index) const {
    return buffer_.data() + shared_bytes_ + static_cast<size_t>(index) * worker_bytes_;
  }
  template <typename T>
  T* shared_as() const {
    return reinterpret_cast<T*>(shared());
  }
  template <typename T>
  T* worker_as(int index) const {
    return reinterpret_cast<T*>(worker(index));
  }

 private:
  static size_t round_up(size_t bytes) { return (bytes + 63) / 64 * 64; }
  size_t shared_bytes_ = 0;
  size_t worker_bytes_ = 0;
  AlignedBuffer buffer_;
};

struct KernelContext {
  const Node& node;
  std::vector<Buffer> inputs;
  std::vector<Buffer> outputs;
  ThreadPool& pool;
  ScratchSpace& scratch;
  const CpuOptions* options = nullptr;  // the backend's options; null: the defaults
  std::vector<bool> constant_inputs;    // by input index: a weight, fixed for the life of the prepared program
  // By input index (empty: none): for a weight the backend keeps as its unscaled source, the factor of each row along
  // dim 0; the weight's value is float(source * factor). A factory that folds the factors into the layout it packs
  // says so (Kernel::applies_row_scales); for any other, the backend computes the weight and asks again.
  std::vector<const double*> row_scales;

  const double* row_scales_of(size_t input) const { return input < row_scales.size() ? row_scales[input] : nullptr; }
};

struct Kernel {
  std::function<void()> run;
  // Inputs (by index) that an output may share its address with when both have the same size: every element of the
  // input is read before the output element at the same position is written, and not read afterwards.
  std::vector<size_t> shareable_inputs;
  // Every output already is the input it would copy (a view at the same address): running changes nothing.
  bool writes_nothing = false;
  // The kernel reads the inputs that come with row scales (KernelContext::row_scales) as the values they stand for.
  bool applies_row_scales = false;
};

using KernelFactory = std::function<std::optional<Kernel>(const KernelContext&)>;

class KernelTable {
 public:
  void add(const std::string& op, KernelFactory factory);
  const KernelFactory* find(const std::string& op) const;
  std::vector<std::string> ops() const;

 private:
  std::map<std::string, KernelFactory> factories_;
};

// Every kernel the CPU backend has, by canonical op name.
const KernelTable& kernel_table();

// Families, one file each.
void add_elementwise_kernels(KernelTable& table);
void add_shape_kernels(KernelTable& table);
void add_linalg_kernels(KernelTable& table);
// Bytes of bf16 linear weights that linear kernels hold prepacked for the AVX2 tile (shared by every program that
// binds the same weight), at most a quarter of the machine's memory.
int64_t prepacked_weight_bytes();
void add_conv_kernels(KernelTable& table);
void add_nn_kernels(KernelTable& table);
void add_pool_kernels(KernelTable& table);
void add_reduction_kernels(KernelTable& table);

// ---- helpers shared by kernel files ----

// The values of a float buffer as fp32: the buffer itself when stored as fp32, else converted into `scratch`
// (which must hold `count` floats).
const float* float_data(const std::byte* data, Elem elem, int64_t count, float* scratch);
// Writes fp32 results to a buffer; nothing to do when `values` already is the buffer.
void store_floats(const float* values, std::byte* data, Elem elem, int64_t count);
// Lets every output share any input's address (see Kernel::shareable_inputs).
void share_all_inputs(Kernel& kernel, const KernelContext& ctx);
// Bytes of `count` fp32 values (0 for negative counts).
size_t floats_bytes(int64_t count);

}  // namespace npusim::cpu
