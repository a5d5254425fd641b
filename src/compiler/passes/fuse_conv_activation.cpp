// conv2d, then optionally an add of a same-shape tensor (a residual connection), then optionally an activation,
// becomes one fused_conv2d when at least one of the two follows and nothing else reads the intermediates.
#include "compiler/passes/fusion.h"

namespace npusim::compiler {

void fuse_conv_activation(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  size_t with_activation = 0, with_residual = 0;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& conv = graph.nodes[n];
    if (m.taken(n) || conv.op != "conv2d" || conv.outputs.size() != 1 || conv.inputs.size() < 2) continue;
    std::vector<int32_t> pattern{static_cast<int32_t>(n)};
    std::vector<ValueId> inputs = conv.inputs;
    Attrs attrs = conv.attrs;
    attrs.set("has_bias", conv.inputs.size() == 3);
    attrs.set("has_residual", false);
    ValueId value = conv.outputs[0];

    const Node* add = m.sole_consumer(value, "add");
    if (add && add->inputs.size() == 2 && unit_alpha(*add)) {
      const ValueId residual = other_input(*add, value);
      const Shape& shape = m.meta(value).shape;
      if (residual != value && m.meta(residual).shape == shape && m.meta(add->outputs[0]).shape == shape) {
        pattern.push_back(m.index_of(*add));
        inputs.push_back(residual);
        attrs.set("has_residual", true);
        value = add->outputs[0];
      }
    }
    const Node* activation = m.sole_consumer(value);
    if (activation && fusable_activation(*activation)) {
      pattern.push_back(m.index_of(*activation));
      set_activation(attrs, *activation);
    }
    if (pattern.size() == 1) continue;
    const bool residual = attrs.get_bool("has_residual");
    const bool activated = attrs.has("activation");
    if (!m.replace(pattern, "fused_conv2d", attrs, inputs)) continue;
    with_residual += residual;
    with_activation += activated;
  }
  m.finish(context, "fuse_conv_activation",
           "conv2d fused (" + std::to_string(with_activation) + " with an activation, " +
               std::to_string(with_residual) + " with a residual add)");
}

}  // namespace npusim::compiler
