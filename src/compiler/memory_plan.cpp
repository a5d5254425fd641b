#include "compiler/memory_plan.h"

#include <algorithm>
#include <set>

namespace npusim::compiler {

namespace {

int64_t align_up(int64_t bytes, int64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

bool is_elementwise_on_input0(const std::string& op) {
  static const std::set<std::string> kOps = {
      // unary
      "abs", "neg", "sign", "floor", "ceil", "trunc", "round", "exp", "log", "log2", "log10", "log1p", "expm1", "sqrt",
      "rsqrt", "reciprocal", "sin", "cos", "tan", "atan", "tanh", "sigmoid", "erf", "relu", "hardtanh", "gelu", "silu",
      "hardswish", "hardsigmoid", "leaky_relu", "elu", "softplus", "mish", "logical_not", "bitwise_not", "clamp", "to",
      // binary (input 0 is `self`)
      "add", "sub", "rsub", "mul", "div", "remainder", "fmod", "pow", "maximum", "minimum", "eq", "ne", "lt", "le",
      "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "masked_fill",
      // fusions of the above
      "add_relu", "silu_mul", "rope", "elementwise_chain"};
  return kOps.count(op) != 0;
}

// One arena allocation: a value, the values that overwrite it in place, and the views of all of them.
struct Block {
  int32_t first = 0;  // node that produces the block's first value
  int32_t last = 0;   // last node that reads any value in the block
  int64_t size = 0;   // aligned bytes
  int64_t offset = 0;
};

class Planner {
 public:
  Planner(const Graph& graph, DType storage_dtype, int64_t alignment)
      : graph_(graph), storage_dtype_(storage_dtype), alignment_(alignment) {
    if (alignment <= 0 || (alignment & (alignment - 1)) != 0)
      fail("memory plan: alignment must be a power of two, got " + std::to_string(alignment));
    const size_t count = graph.values.size();
    plan_.alignment = alignment;
    plan_.values.resize(count);
    producer_.assign(count, -1);
    root_.resize(count);
    last_use_.assign(count, -1);
    block_of_.assign(count, -1);
    output_.assign(count, false);
    for (size_t i = 0; i < count; ++i) {
      root_[i] = static_cast<ValueId>(i);
      plan_.values[i].bytes = storage_bytes(graph.values[i].meta, storage_dtype);
    }
  }

  MemoryPlan run() {
    find_producers();
    for (ValueId id : graph_.outputs) output_[index(id)] = true;
    resolve_views();
    compute_last_uses();
    place_persistent();
    form_blocks();
    assign_offsets();
    return std::move(plan_);
  }

 private:
  static size_t index(ValueId id) { return static_cast<size_t>(id); }

  void find_producers() {
    for (size_t n = 0; n < graph_.nodes.size(); ++n)
      for (ValueId id : graph_.nodes[n].outputs) producer_[index(id)] = static_cast<int32_t>(n);
    for (size_t i = 0; i < graph_.values.size(); ++i)
      if (graph_.values[i].kind == ValueKind::NodeOutput && producer_[i] >= 0)
        plan_.unplanned_bytes += plan_.values[i].bytes;
  }

  void resolve_views() {
    for (const Node& node : graph_.nodes) {
      if (!is_view_op(node.op) || node.inputs.empty() || node.outputs.size() != 1) continue;
      const ValueId out = node.outputs[0];
      if (output_[index(out)] || plan_.values[index(out)].bytes != plan_.values[index(node.inputs[0])].bytes) continue;
      root_[index(out)] = root_[index(node.inputs[0])];
    }
  }

  // A root's buffer is read until the last read of the root or of any view of it.
  void compute_last_uses() {
    for (size_t n = 0; n < graph_.nodes.size(); ++n)
      for (ValueId id : graph_.nodes[n].inputs) {
        int32_t& last = last_use_[index(root_[index(id)])];
        last = std::max(last, static_cast<int32_t>(n));
      }
  }

  void place_persistent() {
    int64_t next_index = 0;
    auto make_persistent = [&](ValueId id) {
      BufferAssignment& buffer = plan_.values[index(id)];
      if (buffer.placement == Placement::Persistent) return;
      buffer.placement = Placement::Persistent;
      buffer.offset = next_index++;
      plan_.persistent_bytes += buffer.bytes;
    };
    for (ValueId id : graph_.inputs) make_persistent(id);
    for (ValueId id : graph_.outputs)
      if (graph_.value(id).kind != ValueKind::Weight) make_persistent(id);
    for (size_t i = 0; i < graph_.values.size(); ++i)
      if (graph_.values[i].kind == ValueKind::GraphInput) make_persistent(static_cast<ValueId>(i));
  }

  bool is_arena_root(ValueId id) const {
    const size_t i = index(id);
    return root_[i] == id && graph_.values[i].kind == ValueKind::NodeOutput && producer_[i] >= 0 && !output_[i];
  }

  // The input whose block `node`'s output may take over, or -1.
  int32_t in_place_block(const Node& node, int32_t node_index) const {
    const std::optional<size_t> slot = in_place_input(node);
    if (!slot || *slot >= node.inputs.size() || node.outputs.size() != 1) return -1;
    const ValueId out = node.outputs[0];
    const ValueId in = node.inputs[*slot];
    const ValueId in_root = root_[index(in)];
    if (!is_arena_root(out) || !is_arena_root(in_root)) return -1;
    const TensorMeta& out_meta = graph_.value(out).meta;
    if (graph_.value(in).meta.shape != out_meta.shape ||
        plan_.values[index(in)].bytes != plan_.values[index(out)].bytes)
      return -1;
    // Another operand read through a different shape from the same buffer would see overwritten elements.
    for (ValueId other : node.inputs)
      if (root_[index(other)] == in_root && graph_.value(other).meta.shape != out_meta.shape) return -1;
    const int32_t block = block_of_[index(in_root)];
    return blocks_[static_cast<size_t>(block)].last == node_index ? block : -1;
  }

  void form_blocks() {
    for (size_t n = 0; n < graph_.nodes.size(); ++n) {
      const Node& node = graph_.nodes[n];
      const auto node_index = static_cast<int32_t>(n);
      const int32_t shared = in_place_block(node, node_index);
      for (ValueId out : node.outputs) {
        if (!is_arena_root(out)) continue;
        const int32_t last = std::max(last_use_[index(out)], node_index);
        BufferAssignment& buffer = plan_.values[index(out)];
        buffer.placement = Placement::Arena;
        if (shared >= 0) {
          buffer.in_place = true;
          block_of_[index(out)] = shared;
          blocks_[static_cast<size_t>(shared)].last = last;
          continue;
        }
        block_of_[index(out)] = static_cast<int32_t>(blocks_.size());
        blocks_.push_back(Block{node_index, last, align_up(buffer.bytes, alignment_), 0});
      }
    }
  }

  // Greedy by size (largest first), each block in the lowest-waste gap among the blocks already placed whose
  // lifetimes overlap it.
  void assign_offsets() {
    std::vector<size_t> order(blocks_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return blocks_[a].size > blocks_[b].size; });
    std::vector<size_t> placed;  // sorted by offset
    std::vector<const Block*> overlapping;
    for (size_t candidate : order) {
      Block& block = blocks_[candidate];
      overlapping.clear();
      for (size_t other : placed) {
        const Block& placed_block = blocks_[other];
        if (placed_block.first <= block.last && block.first <= placed_block.last) overlapping.push_back(&placed_block);
      }
      block.offset = best_fit_offset(block.size, overlapping);
      plan_.arena_bytes = std::max(plan_.arena_bytes, block.offset + block.size);
      auto position = std::lower_bound(placed.begin(), placed.end(), block.offset,
                                       [&](size_t i, int64_t offset) { return blocks_[i].offset < offset; });
      placed.insert(position, candidate);
    }
    for (size_t i = 0; i < graph_.values.size(); ++i) {
      BufferAssignment& buffer = plan_.values[i];
      if (buffer.placement == Placement::Arena) buffer.offset = blocks_[static_cast<size_t>(block_of_[i])].offset;
    }
    for (size_t i = 0; i < graph_.values.size(); ++i) {
      const ValueId root = root_[i];
      if (root == static_cast<ValueId>(i)) continue;
      BufferAssignment& buffer = plan_.values[i];
      buffer.placement = Placement::View;
      buffer.alias_of = root;
      buffer.offset = plan_.values[index(root)].offset;
    }
  }

  // `overlapping` is sorted by offset.
  static int64_t best_fit_offset(int64_t size, const std::vector<const Block*>& overlapping) {
    int64_t best = -1;
    int64_t best_waste = 0;
    int64_t cursor = 0;
    for (const Block* other : overlapping) {
      const int64_t gap = other->offset - cursor;
      if (gap >= size && (best < 0 || gap - size < best_waste)) {
        best = cursor;
        best_waste = gap - size;
      }
      cursor = std::max(cursor, other->offset + other->size);
    }
    return best >= 0 ? best : cursor;
  }

  const Graph& graph_;
  DType storage_dtype_;
  int64_t alignment_;
  MemoryPlan plan_;
  std::vector<int32_t> producer_;  // live producing node by ValueId, -1 for none
  std::vector<ValueId> root_;      // the value whose buffer a view reads; itself otherwise
  std::vector<int32_t> last_use_;  // by root: last node reading it or any view of it
  std::vector<int32_t> block_of_;  // by Arena value
  std::vector<bool> output_;       // graph outputs
  std::vector<Block> blocks_;
};

}  // namespace

int64_t storage_bytes(const TensorMeta& meta, DType storage_dtype) {
  const DType stored = is_floating(meta.dtype) ? storage_dtype : meta.dtype;
  return shape_numel(meta.shape) * static_cast<int64_t>(dtype_size(stored));
}

bool is_view_op(const std::string& op) {
  return op == "reshape" || op == "flatten" || op == "unflatten" || op == "unsqueeze" || op == "squeeze" ||
         op == "alias";
}

std::optional<size_t> in_place_input(const Node& node) {
  if (is_elementwise_on_input0(node.op) && !node.inputs.empty()) return 0;
  // Inputs: x, weight, optional bias, optional residual. The output may take over the residual only.
  if (node.op == "fused_conv2d" && node.attrs.get_bool("has_residual", false) && node.inputs.size() >= 3)
    return node.inputs.size() - 1;
  return std::nullopt;
}

std::string placement_name(Placement placement) {
  switch (placement) {
    case Placement::None:
      return "none";
    case Placement::Arena:
      return "arena";
    case Placement::Persistent:
      return "persistent";
    case Placement::View:
      return "view";
  }
  return "unknown";
}

MemoryPlan plan_memory(const Graph& graph, DType storage_dtype, int64_t alignment) {
  return Planner(graph, storage_dtype, alignment).run();
}

}  // namespace npusim::compiler
