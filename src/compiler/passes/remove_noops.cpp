// Identities disappear: their consumers read the input directly. A graph output keeps its producer so that
// outputs keep their names.
#include <set>

#include "compiler/graph_edit.h"
#include "compiler/pass.h"

namespace npusim::compiler {

namespace {

bool is_identity(const Graph& graph, const Node& node) {
  static const std::set<std::string> kAlways = {"alias", "clone", "dropout"};
  if (!node.def || node.outputs.size() != 1 || node.inputs.empty()) return false;
  if (kAlways.count(node.op)) return true;
  const TensorMeta& in = graph.value(node.inputs[0]).meta;
  const TensorMeta& out = graph.value(node.outputs[0]).meta;
  if (node.op == "to") return node.inputs.size() == 1 && reference_dtype(in.dtype) == reference_dtype(out.dtype);
  if (node.op == "reshape" || node.op == "expand" || node.op == "unsqueeze" || node.op == "flatten" ||
      node.op == "squeeze")
    return in.shape == out.shape;
  return false;
}

}  // namespace

void remove_noops(Graph& graph, PassContext& context) {
  size_t removed = 0;
  for (Node& node : graph.nodes) {
    ValueId replacement = kNoValue;
    if (node.op == "getitem" && node.outputs.size() == 1)
      replacement = node.inputs[static_cast<size_t>(node.attrs.get_int("index"))];
    else if (is_identity(graph, node))
      replacement = node.inputs[0];
    if (replacement == kNoValue || is_graph_output(graph, node.outputs[0])) continue;
    replace_uses(graph, node.outputs[0], replacement);
    ++removed;
  }
  const size_t before = graph.nodes.size();
  remove_dead_nodes(graph);
  if (before != graph.nodes.size())
    context.note("remove_noops", std::to_string(removed) + " identities bypassed, " +
                                     std::to_string(before - graph.nodes.size()) + " nodes removed");
}

}  // namespace npusim::compiler
