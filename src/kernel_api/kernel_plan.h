#pragma once
// A checked launch: the kernel's parameters with their dtypes and shapes, the order in which the generated kernel
// takes them, and the launch geometry. Source generation and both devices work from it.
#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "npusim/kernel_api.h"

namespace npusim::kernels::detail {

constexpr int kMaxDims = 8;  // length of the name_shape / name_strides arrays

struct Param {
  std::string name;
  bool output = false;
  bool scalar = false;
  DType dtype = DType::Float32;
  Shape shape;  // tensors only
};

// One argument of the generated kernel function, in order.
enum class SlotKind { Data, Shape, Strides, Ndim };
struct Slot {
  SlotKind kind;
  size_t param;
};

struct Plan {
  const KernelSource* source = nullptr;
  std::vector<Param> params;  // inputs in declared order, then outputs
  std::vector<Slot> slots;
  std::vector<std::pair<std::string, TemplateValue>> templates;
  Grid grid;
  ThreadGroup threadgroup;
  Blocks blocks;  // threadgroups per grid
  int64_t shared_memory_bytes = 0;
  Device device = Device::Cpu;
  bool verbose = false;
  bool uses_barrier = false;
  bool uses_shared_memory = false;

  std::string label() const;  // "kernel 'name' (cpu)"
  int64_t threads_per_threadgroup() const { return threadgroup.x * threadgroup.y * threadgroup.z; }
  int64_t total_threadgroups() const { return blocks.x * blocks.y * blocks.z; }
  bool uses_dtype(DType dtype) const;  // by a parameter or a template type
};

// Validates names, arguments, outputs, template arguments and geometry. Throws npusim::Error naming the kernel.
Plan make_plan(const KernelSource& source, const std::map<std::string, Argument>& arguments,
               const LaunchConfig& config);

// Checks the names of a kernel source on construction.
void check_source(const KernelSource& source);

// Whether `word` occurs in `text` as a whole identifier.
bool mentions(const std::string& text, const std::string& word);

// The C++ spelling of a dtype in generated code (float, half, bfloat16, int64_t, bool, ...).
const char* type_name(DType dtype);

// A value in a dtype's bytes (little-endian, as stored in tensors). Fails when an integer dtype cannot hold it.
std::array<std::byte, 8> encode_value(DType dtype, const std::variant<double, int64_t>& value, const std::string& what);

// Storage a launch hands to the generated code: one pointer per slot, as cuLaunchKernel's kernelParams.
struct SlotStorage {
  struct Dims {
    int64_t values[kMaxDims];
  };
  std::vector<void*> pointers;                    // Data slots: address of a data pointer (or of the scalar's bytes)
  std::vector<void*> data;                        // per param: the data pointer the kernel gets (host or device)
  std::vector<std::array<std::byte, 8>> scalars;  // per param
  std::vector<Dims> dims;                         // per slot (Shape and Strides slots)
  std::vector<int32_t> ndims;                     // per slot (Ndim slots)
};
// Fills `storage` so that storage.pointers[i] points at slot i's value. `data[p]` is param p's tensor data pointer.
void fill_slots(const Plan& plan, std::vector<void*> data, const std::vector<std::array<std::byte, 8>>& scalars,
                SlotStorage& storage);

}  // namespace npusim::kernels::detail
