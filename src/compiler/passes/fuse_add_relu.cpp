// relu(a + b) of two tensors (any broadcast) becomes one add_relu.
#include "compiler/passes/fusion.h"

namespace npusim::compiler {

void fuse_add_relu(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& add = graph.nodes[n];
    if (m.taken(n) || add.op != "add" || add.inputs.size() != 2 || !unit_alpha(add)) continue;
    const Node* relu = m.sole_consumer(add.outputs[0], "relu");
    if (!relu || relu->inputs.size() != 1) continue;
    const int32_t pattern[] = {static_cast<int32_t>(n), m.index_of(*relu)};
    m.replace(pattern, "add_relu", {}, add.inputs);
  }
  m.finish(context, "fuse_add_relu", "add + relu fused");
}

}  // namespace npusim::compiler
