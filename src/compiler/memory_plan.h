#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "npusim/graph.h"

namespace npusim::compiler {

enum class Placement : uint8_t {
  None,        // weights and constants (owned by the weight store), or values no live node produces
  Arena,       // intermediate: lives at `offset` in the one per-run arena, reused after its last use
  Persistent,  // graph inputs and outputs and KV caches: own buffers that live for the whole session
  View,        // zero-copy alias of another value (`alias_of`) at the same offset (reshape, squeeze, ...)
};

struct BufferAssignment {
  Placement placement = Placement::None;
  int64_t offset = 0;  // bytes from the arena start (Arena, and View of an Arena value), or index into
                       // persistent buffers (Persistent, and View of a Persistent value)
  int64_t bytes = 0;   // size in the program's storage dtype
  // View: the root value whose buffer this one shares; never itself a View. The root is Arena, Persistent
  // (a graph input or output) or None (a weight or constant, held by the weight store).
  ValueId alias_of = kNoValue;
  bool in_place = false;  // shares the buffer of an input whose last use is this node
};

struct MemoryPlan {
  int64_t alignment = 64;
  int64_t arena_bytes = 0;               // planned peak of the arena
  int64_t persistent_bytes = 0;          // inputs, outputs, caches
  int64_t unplanned_bytes = 0;           // what a naive one-buffer-per-value allocation would take
  std::vector<BufferAssignment> values;  // by ValueId
};

// Liveness-based plan over the graph's node order: a value is live from its producer to its last reader; arena
// offsets are reused once a value dies (greedy by size, best-fit gap). Graph inputs and outputs are
// Persistent; weights and constants None. Storage bytes use `storage_dtype` for floating values and the
// value's own dtype for integers and bools.
//
// Views: the single output of a view op (is_view_op) that is not a graph output is a View of its input 0's
// root; the executor runs no kernel for it. A view op whose output is a graph output gets its own Persistent
// buffer and copies.
//
// In place: an elementwise node (in_place_input) may write its output over the input it names when that input
// is an Arena value (or a view of one) whose buffer nobody reads after this node, with the same shape and
// bytes as the output. Kernels of those ops must accept an output that aliases that input.
MemoryPlan plan_memory(const Graph& graph, DType storage_dtype, int64_t alignment = 64);

// Bytes of a value stored for a program whose floating activations use `storage_dtype`.
int64_t storage_bytes(const TensorMeta& meta, DType storage_dtype);

// reshape, flatten, unflatten, unsqueeze, squeeze, alias: same bytes, new shape.
bool is_view_op(const std::string& op);

// The input a node's output may overwrite in place: input 0 of unary and binary elementwise ops and of their
// fusions (add_relu, silu_mul, rope, elementwise_chain), the residual (last) input of a fused_conv2d with
// has_residual; none for other ops.
std::optional<size_t> in_place_input(const Node& node);

std::string placement_name(Placement placement);

}  // namespace npusim::compiler
