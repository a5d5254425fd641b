// silu(gate) * up, in either operand order, becomes one silu_mul(gate, up). The fused node sits where the mul
// was, so an `up` computed after the silu (the Qwen MLP computes up_proj after silu(gate_proj)) is ready.
#include "compiler/passes/fusion.h"

namespace npusim::compiler {

void fuse_silu_mul(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& silu = graph.nodes[n];
    if (m.taken(n) || silu.op != "silu" || silu.inputs.size() != 1) continue;
    const Node* mul = m.sole_consumer(silu.outputs[0], "mul");
    if (!mul || mul->inputs.size() != 2) continue;
    const ValueId up = other_input(*mul, silu.outputs[0]);
    if (up == silu.outputs[0]) continue;
    const int32_t pattern[] = {static_cast<int32_t>(n), m.index_of(*mul)};
    m.replace(pattern, "silu_mul", {}, {silu.inputs[0], up});
  }
  m.finish(context, "fuse_silu_mul", "silu * up fused");
}

}  // namespace npusim::compiler
