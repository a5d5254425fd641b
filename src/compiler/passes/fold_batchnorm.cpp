// Inference BatchNorm after a conv2d or linear becomes part of that layer: the layer reads a weight scaled per
// output channel and a bias that absorbs the statistics, both computed once at load time. A layer without a
// bias gains one, so the folded shift is never lost.
#include <string>
#include <unordered_set>

#include "compiler/graph_edit.h"
#include "compiler/pass.h"

namespace npusim::compiler {

namespace {

struct BatchNormParams {
  ValueId gamma = kNoValue, beta = kNoValue, mean = kNoValue, var = kNoValue;
};

// The IR drops absent optional tensors: 5 inputs = x, weight, bias, mean, var; 4 = x, weight, mean, var;
// 3 = x, mean, var.
BatchNormParams params_of(const Node& bn) {
  BatchNormParams p;
  const auto& in = bn.inputs;
  if (in.size() == 5)
    p = {in[1], in[2], in[3], in[4]};
  else if (in.size() == 4)
    p = {in[1], kNoValue, in[2], in[3]};
  else if (in.size() == 3)
    p = {kNoValue, kNoValue, in[1], in[2]};
  return p;
}

bool is_plain_weight(const Graph& graph, ValueId id) {
  return id == kNoValue || graph.value(id).kind == ValueKind::Weight;
}

// The names of a graph's values, gathered once per pass: the names unique_value_name would give, without
// gathering them again for every new value.
class ValueNames {
 public:
  explicit ValueNames(const Graph& graph) {
    for (const Value& value : graph.values) names_.insert(value.name);
  }
  // `base`, or `base_1`, `base_2`, ... : the first one no value has; taken from then on.
  std::string take_unique(const std::string& base) {
    std::string name = base;
    for (int i = 1; names_.count(name); ++i) name = base + "_" + std::to_string(i);
    names_.insert(name);
    return name;
  }

 private:
  std::unordered_set<std::string> names_;
};

}  // namespace

void fold_batchnorm(Graph& graph, PassContext& context) {
  const auto uses = use_counts(graph);
  ValueNames names(graph);
  std::vector<bool> remove(graph.nodes.size(), false);
  size_t folded = 0;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& bn = graph.nodes[n];
    if (bn.op != "batch_norm" || bn.inputs.size() < 3) continue;
    const Value& x = graph.value(bn.inputs[0]);
    if (x.kind != ValueKind::NodeOutput || uses[static_cast<size_t>(bn.inputs[0])] != 1) continue;
    Node& layer = graph.nodes[static_cast<size_t>(x.producer)];
    const bool conv = layer.op == "conv2d" && layer.inputs.size() >= 2;
    const bool linear = layer.op == "linear" && layer.inputs.size() >= 2 && x.meta.shape.size() == 2;
    if (!conv && !linear) continue;
    const BatchNormParams p = params_of(bn);
    if (!is_plain_weight(graph, p.gamma) || !is_plain_weight(graph, p.beta) || !is_plain_weight(graph, p.mean) ||
        !is_plain_weight(graph, p.var) || !is_plain_weight(graph, layer.inputs[1]))
      continue;
    const ValueId bias = layer.inputs.size() >= 3 ? layer.inputs[2] : kNoValue;
    if (!is_plain_weight(graph, bias)) continue;

    const double eps = bn.attrs.get_float("eps", 1e-5);
    const int32_t producer = x.producer;  // `x` dangles once add_derived_weight grows graph.values
    const Value weight = graph.value(layer.inputs[1]);
    Attrs params;
    params.set("eps", eps);
    const ValueId folded_weight = add_derived_weight(
        graph, names.take_unique(weight.name + ".bn_folded"), TensorMeta{weight.meta.shape, DType::Float32},
        WeightTransform{"bn_fold_weight", {layer.inputs[1], p.gamma, p.var}, params});
    const int64_t channels = weight.meta.shape[0];
    const ValueId folded_bias = add_derived_weight(
        graph, names.take_unique(weight.name + ".bn_folded_bias"), TensorMeta{{channels}, DType::Float32},
        WeightTransform{"bn_fold_bias", {bias, p.gamma, p.beta, p.mean, p.var}, params});
    Node& target = graph.nodes[static_cast<size_t>(producer)];  // add_* may not move nodes, but stay explicit
    target.inputs.resize(3);
    target.inputs[1] = folded_weight;
    target.inputs[2] = folded_bias;
    target.outputs[0] = bn.outputs[0];
    graph.value(bn.outputs[0]).producer = producer;
    remove[n] = true;
    ++folded;
  }
  if (!folded) return;
  remove_nodes(graph, remove);
  context.note("fold_batchnorm", std::to_string(folded) + " BatchNorms folded");
}

}  // namespace npusim::compiler
