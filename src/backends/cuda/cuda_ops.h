#pragma once
// The CUDA backend's kernels by canonical op. A factory looks at one node at prepare time (shapes, storage,
// attributes, device addresses) and returns a launch with everything precomputed, or nothing when it does not
// handle that case (the node then runs on the host, on the registry's reference implementation).
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/storage.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/device_kernels.h"
#include "npusim/graph.h"

namespace npusim::cuda {

using cpu::Elem;

// One value on the device as a kernel sees it.
struct DeviceValue {
  std::byte* data = nullptr;
  Elem elem = Elem::F32;
  TensorMeta meta;

  int64_t numel() const { return shape_numel(meta.shape); }
  size_t bytes() const { return static_cast<size_t>(numel()) * cpu::elem_size(elem); }
};

struct OpContext {
  const Node& node;
  std::vector<DeviceValue> inputs;
  std::vector<DeviceValue> outputs;
  // By input: whether it holds its values before the run's first kernel (graph inputs other than state, weights).
  std::vector<bool> inputs_ready_at_start;
  int* error_flag = nullptr;  // device int a kernel sets when an index is out of range
  // The program's stream, on which a factory may time work at prepare (never inside capture).
  cudaStream_t stream = nullptr;
  // Device memory shared by the program's launches (im2col's columns).
  std::shared_ptr<SharedScratch> scratch;
};

// The element code the kernels take (device_kernels.h) for a storage element type.
inline int elem_code(Elem elem) { return static_cast<int>(elem); }
// A device value as a kernel operand.
inline Operand as_operand(const DeviceValue& value) { return {value.data, elem_code(value.elem)}; }
// "node 'NAME' (OP)", as errors name a node.
std::string describe_node(const Node& node);
// A launcher's result, checked: a failure throws npusim::Error naming the launcher and the node.
void check_launch(cudaError_t result, const char* launcher, const Node& node);

// Enqueues the node's work on the stream; throws npusim::Error when a launch fails.
using Launch = std::function<void(cudaStream_t)>;
using OpFactory = std::function<std::optional<Launch>(const OpContext&)>;

// Every op with a CUDA kernel.
const std::map<std::string, OpFactory>& op_table();
std::vector<std::string> kernel_ops();

// A rope node as one job of a fused rope/KV-cache launch (into its own output), or nothing when the rope kernel
// does not take it.
std::optional<RopeCacheJob> rope_job(const OpContext& ctx);
// The same reading x from `x` through `x_strides` (per output dim, in elements; the last one 1): a rope whose
// input is a transpose's output reading the transpose's input instead.
std::optional<RopeCacheJob> rope_job(const OpContext& ctx, const DeviceValue& x, const std::vector<int64_t>& x_strides);
// An index_copy that updates its first input in place (a KV cache) as one job of that launch, or nothing.
std::optional<RopeCacheJob> cache_write_job(const OpContext& ctx);
// A rope job writing straight into the cache slots of a cache write job (`slot`) instead of its own output.
RopeCacheJob rope_into_cache(RopeCacheJob rope, const RopeCacheJob& slot);
// The same copying from `source` through `source_strides` (per dim of the node's source, in elements).
std::optional<RopeCacheJob> cache_write_job(const OpContext& ctx, const DeviceValue& source,
                                            const std::vector<int64_t>& source_strides);
// An attention node writing its output as [batch, length, heads, value_embed] into `out` (the bytes of a transpose
// of its output), or nothing where its kernel cannot.
std::optional<Launch> attention_with_heads_inner(const OpContext& ctx, const DeviceValue& out);
// For a decode attention node (one query row per head, positions known before the run starts): a launch that
// fetches the cache rows it will read into L2, for a second stream to run ahead of it. NPUSIM_CUDA_CACHE_PREFETCH=0
// turns it off.
std::optional<Launch> cache_prefetch_launch(const OpContext& ctx);
// A linear of several rows (not the GEMV) whose output goes only to `out` = output + `residual` (a residual add),
// as one cuBLASLt GEMM accumulating onto the residual, or nothing where it does not apply.
std::optional<Launch> linear_with_residual(const OpContext& ctx, const DeviceValue& residual, const DeviceValue& out);
// A transpose, t or permute node's input strides (in elements) per output dim: the output as a view of the input.
std::optional<std::vector<int64_t>> transposed_source_strides(const Node& node, const Shape& input_shape);

// The epsilon of an rms_norm node: its `eps`, or the machine epsilon of its output dtype when none is given.
double rms_norm_eps(const Node& node, DType dtype);

// Whether the node's output is its first input's bytes reinterpreted (reshapes, and transposes that only move
// dims of size 1), so that it may alias the input and its kernel copies nothing.
bool output_aliases_input(const Node& node, const Graph& graph);

}  // namespace npusim::cuda
