#include "runtime/reference_executor.h"

#include "npusim/op_registry.h"

namespace npusim {

void check_supported(const Graph& graph) {
  const auto unsupported = graph.unsupported_ops();
  if (unsupported.empty()) return;
  std::string message = graph.source + ": unsupported ops:";
  for (const std::string& line : unsupported) message += "\n  " + line;
  fail(message);
}

std::vector<Tensor> check_inputs(const Graph& graph, const std::map<std::string, Tensor>& inputs) {
  for (const auto& [name, tensor] : inputs) {
    bool known = false;
    for (ValueId id : graph.inputs) known = known || graph.value(id).name == name;
    if (!known) {
      std::string names;
      for (ValueId id : graph.inputs) names += (names.empty() ? "" : ", ") + graph.value(id).name;
      fail("input '" + name + "' is not an input of " + graph.source + " (inputs: " + names + ")");
    }
  }
  std::vector<Tensor> ordered;
  for (ValueId id : graph.inputs) ordered.push_back(checked_input(graph, inputs, id)->to_reference());
  return ordered;
}

const Tensor* checked_input(const Graph& graph, const std::map<std::string, Tensor>& inputs, ValueId id,
                            bool may_omit) {
  const Value& value = graph.value(id);
  auto it = inputs.find(value.name);
  if (it == inputs.end()) {
    if (may_omit) return nullptr;
    fail("missing input '" + value.name + "' " + shape_string(value.meta.shape) + " " +
         std::string(dtype_name(value.meta.dtype)));
  }
  const Tensor& tensor = it->second;
  if (tensor.shape() != value.meta.shape)
    fail("input '" + value.name + "' has shape " + shape_string(tensor.shape()) + ", the graph expects " +
         shape_string(value.meta.shape));
  if (reference_dtype(tensor.dtype()) != reference_dtype(value.meta.dtype))
    fail("input '" + value.name + "' has dtype " + std::string(dtype_name(tensor.dtype())) + ", the graph expects " +
         std::string(dtype_name(value.meta.dtype)));
  return &tensor;
}

ReferenceExecutor::ReferenceExecutor(const Graph& graph, const std::vector<std::pair<ValueId, Tensor>>& weights)
    : graph_(graph), weights_(graph.values.size()), last_use_(graph.values.size(), -1) {
  check_supported(graph);
  for (const auto& [id, tensor] : weights) {
    const Value& value = graph.value(id);
    if (tensor.shape() != value.meta.shape)
      fail("weight '" + value.weight_key + "' has shape " + shape_string(tensor.shape()) + ", the graph expects " +
           shape_string(value.meta.shape));
    weights_[static_cast<size_t>(id)] = tensor.to_reference();
  }
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (ValueId id : graph.nodes[n].inputs) last_use_[static_cast<size_t>(id)] = static_cast<int32_t>(n);
  for (ValueId id : graph.outputs) last_use_[static_cast<size_t>(id)] = static_cast<int32_t>(graph.nodes.size());
  for (const Node& node : graph.nodes)
    for (ValueId id : node.inputs) {
      const Value& value = graph.value(id);
      if (value.kind == ValueKind::Weight && !weights_[static_cast<size_t>(id)].defined())
        fail("weight '" + value.weight_key + "' (used by node '" + node.name + "') has no value");
    }
}

NamedTensors ReferenceExecutor::run(const std::map<std::string, Tensor>& inputs, const NodeObserver& observer) const {
  std::vector<Tensor> env = weights_;
  std::vector<bool> ready(graph_.values.size(), false);
  for (size_t i = 0; i < env.size(); ++i) ready[i] = graph_.values[i].kind == ValueKind::Weight;
  const std::vector<Tensor> ordered = check_inputs(graph_, inputs);
  for (size_t i = 0; i < ordered.size(); ++i) {
    env[static_cast<size_t>(graph_.inputs[i])] = ordered[i];
    ready[static_cast<size_t>(graph_.inputs[i])] = true;
  }

  std::vector<Tensor> node_inputs;
  std::vector<TensorMeta> output_metas;
  for (size_t n = 0; n < graph_.nodes.size(); ++n) {
    const Node& node = graph_.nodes[n];
    node_inputs.clear();
    for (ValueId id : node.inputs) {
      if (!ready[static_cast<size_t>(id)])
        fail(graph_.source + ": node '" + node.name + "' reads '" + graph_.value(id).name + "' which has no value");
      node_inputs.push_back(env[static_cast<size_t>(id)]);
    }
    output_metas.clear();
    for (ValueId id : node.outputs) output_metas.push_back(graph_.value(id).meta);
    std::vector<Tensor> results;
    try {
      results = node.def->reference(node.attrs, node_inputs, output_metas);
    } catch (const Error& error) {
      fail(graph_.source + ": node '" + node.name + "' (" + node.source_op + "): " + error.what());
    }
    if (results.size() != node.outputs.size())
      fail(graph_.source + ": node '" + node.name + "' produced " + std::to_string(results.size()) +
           " outputs, expected " + std::to_string(node.outputs.size()));
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].shape() != output_metas[i].shape)
        fail(graph_.source + ": node '" + node.name + "' output " + std::to_string(i) + " has shape " +
             shape_string(results[i].shape()) + ", expected " + shape_string(output_metas[i].shape));
      const auto id = static_cast<size_t>(node.outputs[i]);
      env[id] = results[i].to_reference();
      ready[id] = true;
    }
    if (observer) observer(node, results);
    for (ValueId id : node.outputs)
      if (last_use_[static_cast<size_t>(id)] < 0) env[static_cast<size_t>(id)] = Tensor();
    for (ValueId id : node.inputs)
      if (last_use_[static_cast<size_t>(id)] == static_cast<int32_t>(n) &&
          graph_.value(id).kind == ValueKind::NodeOutput)
        env[static_cast<size_t>(id)] = Tensor();
  }

  NamedTensors outputs;
  for (ValueId id : graph_.outputs) outputs.emplace_back(graph_.value(id).name, env[static_cast<size_t>(id)]);
  return outputs;
}

}  // namespace npusim
