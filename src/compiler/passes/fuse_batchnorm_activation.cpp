// An inference batch_norm that no convolution or linear layer absorbed (one after a concatenation or an addition,
// as in DenseNet and pre-activation networks), followed by an activation that nothing else reads the batch_norm
// for, becomes one fused_batch_norm: the normalized tensor is never stored.
#include "compiler/passes/fusion.h"

namespace npusim::compiler {

void fuse_batchnorm_activation(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& bn = graph.nodes[n];
    if (m.taken(n) || (bn.op != "batch_norm" && bn.op != "native_batch_norm") || bn.outputs.empty()) continue;
    if (bn.attrs.get_bool("training", false)) continue;
    const std::vector<int32_t> alone{static_cast<int32_t>(n)};
    bool extras_unread = true;  // native_batch_norm's empty save_mean and save_invstd
    for (size_t i = 1; i < bn.outputs.size(); ++i) extras_unread = extras_unread && m.absorbable(bn.outputs[i], alone);
    const Node* activation = m.sole_consumer(bn.outputs[0]);
    if (!extras_unread || !activation || !fusable_activation(*activation)) continue;
    Attrs attrs = bn.attrs;
    set_activation(attrs, *activation);
    const std::vector<int32_t> pattern{static_cast<int32_t>(n), m.index_of(*activation)};
    m.replace(pattern, "fused_batch_norm", attrs, bn.inputs);
  }
  m.finish(context, "fuse_batchnorm_activation", "batch_norm fused with its activation");
}

}  // namespace npusim::compiler
