// Maximal chains of at least two elementwise steps on floating-point tensors, each step a unary op or a binary op
// with a scalar operand, where every intermediate has exactly one reader, become one elementwise_chain whose
// `ops` (comma-separated) and `scalars` (one per step) say what to apply in order.
#include <optional>
#include <set>

#include "compiler/passes/fusion.h"

namespace npusim::compiler {

namespace {

const std::set<std::string> kUnarySteps = {"neg",        "abs",  "exp",  "log",       "sqrt",       "rsqrt",
                                           "reciprocal", "sin",  "cos",  "tanh",      "sigmoid",    "erf",
                                           "relu",       "silu", "gelu", "hardswish", "hardsigmoid"};

struct Step {
  std::string op;
  double scalar = 0.0;
};

// What `node` contributes to a chain, or nothing when it cannot be a step.
std::optional<Step> chain_step(const FusionMatcher& m, const Node& node) {
  if (node.inputs.size() != 1 || node.outputs.size() != 1 || !node.def) return std::nullopt;
  if (!is_floating(m.meta(node.inputs[0]).dtype) || !is_floating(m.meta(node.outputs[0]).dtype)) return std::nullopt;
  if (kUnarySteps.count(node.op)) {
    if (node.op == "gelu" && !node.attrs.is_none("approximate") && node.attrs.get_string("approximate") != "none")
      return std::nullopt;
    return Step{node.op};
  }
  const char* scalar_name = nullptr;
  if (node.op == "add" || node.op == "sub") {
    if (unit_alpha(node)) scalar_name = "other";
  } else if (node.op == "mul") {
    scalar_name = "other";
  } else if (node.op == "div") {
    if (node.attrs.is_none("rounding_mode")) scalar_name = "other";
  } else if (node.op == "pow") {
    if (node.attrs.is_none("base")) scalar_name = "exponent";
  } else if (node.op == "leaky_relu") {
    scalar_name = "negative_slope";
  }
  if (!scalar_name) return std::nullopt;
  const std::optional<double> scalar = scalar_attr(node, scalar_name);
  if (!scalar) return std::nullopt;
  return Step{node.op, *scalar};
}

}  // namespace

void fuse_elementwise(Graph& graph, PassContext& context) {
  FusionMatcher m(graph);
  size_t steps = 0;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (m.taken(n)) continue;
    std::optional<Step> step = chain_step(m, graph.nodes[n]);
    if (!step) continue;
    // Nodes come in order, so `n` starts its chain: a step before it that it extends has taken it already.
    std::vector<int32_t> pattern{static_cast<int32_t>(n)};
    std::string ops = step->op;
    std::vector<double> scalars{step->scalar};
    ValueId value = graph.nodes[n].outputs[0];
    while (const Node* next = m.sole_consumer(value)) {
      step = chain_step(m, *next);
      if (!step) break;
      pattern.push_back(m.index_of(*next));
      ops += "," + step->op;
      scalars.push_back(step->scalar);
      value = next->outputs[0];
    }
    if (pattern.size() < 2) continue;
    Attrs attrs;
    attrs.set("ops", ops);
    attrs.set("scalars", scalars);
    if (m.replace(pattern, "elementwise_chain", attrs, {graph.nodes[n].inputs[0]})) steps += pattern.size();
  }
  m.finish(context, "fuse_elementwise", "elementwise chains fused (" + std::to_string(steps) + " ops)");
}

}  // namespace npusim::compiler
