#pragma once
// User kernels compiled from source at run time and launched over an explicit grid, on the CPU (C++ built by the
// system compiler into a shared library) or on CUDA (NVRTC). A kernel is its source; a launch binds arguments by
// name and says how many threads run. Every misuse is an npusim::Error naming the kernel and the fault.
//
// What the body sees (both devices):
//   inputs        `const T* name` for a tensor, `const T name` for a scalar; with `name_shape[i]`,
//                 `name_strides[i]` (in elements) and `name_ndim` for tensors
//   outputs       `T* name` (or `atomic<T>* name` with atomic_outputs), with the same shape names
//   positions     uint3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid,
//                 threads_per_threadgroup, threads_per_grid, threadgroups_per_grid
//   shared memory `unsigned char* shared_memory`: LaunchConfig::shared_memory_bytes per threadgroup
//   functions     threadgroup_barrier(), kernel_assert(condition), atomic_add/atomic_load/atomic_store
//   types         half, bfloat16, int8_t ... uint64_t, and the template parameters (types and constants)
// See docs/kernel_api.md.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "npusim/attrs.h"
#include "npusim/dtype.h"
#include "npusim/graph.h"
#include "npusim/op_registry.h"
#include "npusim/tensor.h"

namespace npusim::kernels {

// The grid counts THREADS in each dimension; threads past the grid do not run. A count of blocks is a different
// type and becomes a grid only through grid_of, so the two cannot be confused.
struct Grid {
  int64_t x = 1, y = 1, z = 1;
};
struct Blocks {
  int64_t x = 1, y = 1, z = 1;
};
// Threads per threadgroup (a CUDA block).
struct ThreadGroup {
  int64_t x = 1, y = 1, z = 1;
};
Grid grid_of(Blocks blocks, ThreadGroup threadgroup);

// A kernel's source. Names must be C identifiers, distinct, and not names the kernel API defines.
struct KernelSource {
  std::string name;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::string body;             // statements run by each thread
  std::string header;           // declarations before the kernel: helper functions, structs
  bool atomic_outputs = false;  // outputs are atomic<T>*, updated with atomic_add / atomic_store
  // Launch bound compiled into the kernel (CUDA __launch_bounds__); 0: the device's own limit.
  int64_t max_threads_per_threadgroup = 0;
};

// A scalar argument, passed by value as `const T name`.
struct Scalar {
  DType dtype = DType::Float32;
  std::variant<double, int64_t> value = 0.0;
  Scalar() = default;
  Scalar(DType type, double number) : dtype(type), value(number) {}
  Scalar(DType type, int64_t number) : dtype(type), value(number) {}
};

using Argument = std::variant<Tensor, Scalar>;

struct OutputSpec {
  Shape shape;
  DType dtype = DType::Float32;
};

// A template parameter: a type (`using T = float;`), an integer constant or a boolean constant.
using TemplateValue = std::variant<DType, int64_t, bool>;

enum class Device { Cpu, Cuda };
std::string_view device_name(Device device);
std::optional<Device> parse_device(std::string_view text);  // "cpu", "cuda"

struct LaunchConfig {
  Grid grid;
  ThreadGroup threadgroup;
  int64_t shared_memory_bytes = 0;
  // Shape and dtype of every output that is not bound to a tensor among the arguments.
  std::map<std::string, OutputSpec> outputs;
  // Fills fresh outputs before the launch. Without it they hold 0xff bytes (NaN, -1, true), never zeros, so an
  // element the kernel does not write stands out.
  std::optional<double> init_value;
  std::vector<std::pair<std::string, TemplateValue>> template_args;
  bool verbose = false;  // print the full generated source to stderr
  Device device = Device::Cpu;
};

class Kernel {
 public:
  // Checks the names; the source itself is checked when it compiles.
  explicit Kernel(KernelSource source);
  const KernelSource& source() const { return source_; }

  // Binds every input by name (a tensor or a scalar). An output bound to a tensor is updated in place (its
  // storage is written); other outputs are created from config.outputs. Returns the outputs in declared order.
  std::vector<Tensor> operator()(const std::map<std::string, Argument>& arguments, const LaunchConfig& config) const;

  // The full source generated for these arguments and settings, as compiled (also printed by `verbose`).
  std::string generated_source(const std::map<std::string, Argument>& arguments, const LaunchConfig& config) const;

 private:
  KernelSource source_;
};

// CUDA: whether a device is usable here; `reason` says why not (not built with CUDA, no driver, no device).
bool cuda_available(std::string* reason = nullptr);

// Compiled kernels are kept in memory and on disk ($NPUSIM_CACHE_DIR, else ~/.cache/npusim/kernels), keyed by the
// kernel's name and a hash of everything that shapes the binary: generated source (body, header, template
// values, dtypes, options), compiler and target.
struct CacheStats {
  int64_t compiled = 0;     // built by the compiler
  int64_t disk_hits = 0;    // loaded from the disk cache
  int64_t memory_hits = 0;  // found already loaded
};
CacheStats cache_stats();
std::string cache_directory();
// Forgets loaded kernels (the next launch reads the disk cache) and resets the statistics.
void clear_memory_cache();

// A user kernel as an op of the model graph: an IR node whose op_type is one of `spellings` (the name itself when
// empty) compiles and runs through this kernel. The kernel inputs not named in `scalar_inputs` are the node's
// tensor inputs, in order and in the reference domain (float32 for floats, int64 for integers, bool); its
// outputs get the shapes `infer` computes, in the reference dtype of the dtypes it computes.
struct CustomOpLaunch {
  LaunchConfig config;  // grid, threadgroup, shared memory, template arguments; outputs are filled in
  std::map<std::string, Argument> scalars;  // one per name in CustomOp::scalar_inputs, e.g. from attributes
};
using CustomLaunchFn = std::function<CustomOpLaunch(const Attrs& attrs, std::span<const TensorMeta> inputs,
                                                    std::span<const TensorMeta> outputs)>;
struct CustomOp {
  std::string name;
  std::vector<std::string> spellings;
  std::vector<AttrSpec> attrs;
  KernelSource kernel;
  std::vector<std::string> scalar_inputs;
  ShapeFn infer;
  CustomLaunchFn launch;
};
// Makes the op known to OpRegistry::instance() (lookups by name and by spelling). Fails when the name or a
// spelling is taken, or when the kernel's tensor inputs cannot be told apart from its scalars.
void register_custom_op(CustomOp op);

}  // namespace npusim::kernels
