// Evaluates at compile time every node whose result depends on no graph input and no checkpoint weight:
// aranges, fills, causal-mask construction, shape arithmetic, casts of constants. Results become constants
// embedded in the program. Ops that read only their inputs' shapes (new_ones, zeros_like) fold even when
// those inputs are not constant.
#include <set>

#include "compiler/graph_edit.h"
#include "compiler/pass.h"
#include "npusim/op_registry.h"

namespace npusim::compiler {

namespace {

// Folding these would copy large tensors into the program for little gain.
constexpr int64_t kMaxFoldedBytes = int64_t{16} << 20;

bool reads_only_metadata(const std::string& op) {
  static const std::set<std::string> kOps = {"full_like", "new_full",  "zeros_like", "ones_like",
                                             "new_ones",  "new_zeros", "new_empty",  "empty_like"};
  return kOps.count(op) != 0;
}

}  // namespace

void fold_constants(Graph& graph, PassContext& context) {
  std::vector<bool> constant(graph.values.size(), false);
  for (size_t i = 0; i < graph.values.size(); ++i) {
    const Value& value = graph.values[i];
    constant[i] = value.kind == ValueKind::Weight && !value.transform && graph.constants.count(value.weight_key);
  }
  size_t folded = 0;
  std::vector<bool> remove(graph.nodes.size(), false);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    Node& node = graph.nodes[n];
    if (!node.def || node.outputs.empty()) continue;
    bool foldable = reads_only_metadata(node.op);
    if (!foldable) {
      foldable = true;
      for (ValueId id : node.inputs) foldable = foldable && constant[static_cast<size_t>(id)];
    }
    int64_t bytes = 0;
    for (ValueId id : node.outputs)
      bytes += shape_numel(graph.value(id).meta.shape) * static_cast<int64_t>(dtype_size(graph.value(id).meta.dtype));
    bool feeds_output = false;
    for (ValueId id : node.outputs) feeds_output = feeds_output || is_graph_output(graph, id);
    if (!foldable || feeds_output || bytes > kMaxFoldedBytes) continue;

    std::vector<Tensor> inputs;
    std::vector<TensorMeta> metas;
    for (ValueId id : node.inputs) {
      const Value& value = graph.value(id);
      inputs.push_back(constant[static_cast<size_t>(id)] ? graph.constants.at(value.weight_key).to_reference()
                                                         : Tensor(reference_dtype(value.meta.dtype), value.meta.shape));
    }
    for (ValueId id : node.outputs) metas.push_back(graph.value(id).meta);
    const std::vector<Tensor> results = node.def->reference(node.attrs, inputs, metas);
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const ValueId output = node.outputs[i];
      const std::string key = "folded." + graph.value(output).name;
      const ValueId replacement = add_constant(graph, key, results[i].to(graph.value(output).meta.dtype));
      constant.resize(graph.values.size(), false);
      constant[static_cast<size_t>(replacement)] = true;
      replace_uses(graph, output, replacement);
    }
    remove[n] = true;
    ++folded;
  }
  remove_nodes(graph, remove);
  // Constants nobody reads any more are dropped from the program.
  std::set<ValueId> used;
  for (const Node& node : graph.nodes) used.insert(node.inputs.begin(), node.inputs.end());
  used.insert(graph.outputs.begin(), graph.outputs.end());
  std::vector<ValueId> kept;
  for (ValueId id : graph.weights) {
    const Value& value = graph.value(id);
    if (value.weight_key.rfind("folded.", 0) == 0 && !used.count(id))
      graph.constants.erase(value.weight_key);
    else
      kept.push_back(id);
  }
  graph.weights = std::move(kept);
  if (folded) context.note("fold_constants", std::to_string(folded) + " nodes evaluated at compile time");
}

}  // namespace npusim::compiler
