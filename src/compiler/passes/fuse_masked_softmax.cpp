// softmax(scores + mask) over the last dim becomes one masked_softmax(scores, mask), where attention fusion left
// one behind. The scores are the operand with the sum's shape; the mask may broadcast.
#include "compiler/passes/fusion.h"

namespace npusim::compiler {

void fuse_masked_softmax(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& softmax = graph.nodes[n];
    if (m.taken(n) || softmax.op != "softmax" || softmax.inputs.size() != 1) continue;
    const ValueId sum = softmax.inputs[0];
    if (!is_last_dim(softmax.attrs.get_int("dim"), m.meta(sum).shape.size()) ||
        softmax.attrs.get_bool("half_to_float", false))
      continue;
    const Node* add = m.producer(sum, "add");
    if (!add || add->inputs.size() != 2 || !unit_alpha(*add) || m.sole_consumer(sum) != &softmax) continue;
    std::vector<ValueId> inputs = add->inputs;
    if (m.meta(inputs[0]).shape != m.meta(sum).shape) std::swap(inputs[0], inputs[1]);
    Attrs attrs;
    if (!softmax.attrs.is_none("dtype")) attrs.set("dtype", softmax.attrs.get("dtype"));
    const int32_t pattern[] = {m.index_of(*add), static_cast<int32_t>(n)};
    m.replace(pattern, "masked_softmax", attrs, inputs);
  }
  m.finish(context, "fuse_masked_softmax", "add(mask) + softmax fused");
}

}  // namespace npusim::compiler
