#include "compiler/graph_edit.h"

#include <set>

#include "npusim/op_registry.h"

namespace npusim::compiler {

std::vector<std::vector<int32_t>> consumers(const Graph& graph) {
  std::vector<std::vector<int32_t>> result(graph.values.size());
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (ValueId id : graph.nodes[n].inputs) {
      auto& list = result[static_cast<size_t>(id)];
      if (list.empty() || list.back() != static_cast<int32_t>(n)) list.push_back(static_cast<int32_t>(n));
    }
  return result;
}

bool is_graph_output(const Graph& graph, ValueId id) {
  for (ValueId output : graph.outputs)
    if (output == id) return true;
  return false;
}

std::vector<int32_t> use_counts(const Graph& graph) {
  std::vector<int32_t> counts(graph.values.size(), 0);
  for (const Node& node : graph.nodes)
    for (ValueId id : node.inputs) ++counts[static_cast<size_t>(id)];
  for (ValueId id : graph.outputs) ++counts[static_cast<size_t>(id)];
  return counts;
}

void replace_uses(Graph& graph, ValueId from, ValueId to) {
  for (Node& node : graph.nodes)
    for (ValueId& id : node.inputs)
      if (id == from) id = to;
  for (ValueId& id : graph.outputs)
    if (id == from) id = to;
}

void renumber_producers(Graph& graph) {
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (size_t slot = 0; slot < graph.nodes[n].outputs.size(); ++slot) {
      Value& value = graph.value(graph.nodes[n].outputs[slot]);
      value.producer = static_cast<int32_t>(n);
      value.producer_slot = static_cast<int32_t>(slot);
    }
}

void remove_nodes(Graph& graph, const std::vector<bool>& remove_in) {
  std::vector<bool> remove = remove_in;
  remove.resize(graph.nodes.size(), false);
  std::vector<int32_t> uses(graph.values.size(), 0);
  for (ValueId id : graph.outputs) ++uses[static_cast<size_t>(id)];
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    if (!remove[n])
      for (ValueId id : graph.nodes[n].inputs) ++uses[static_cast<size_t>(id)];
  // Walk backwards so that removing a consumer can free its producers.
  for (size_t n = graph.nodes.size(); n-- > 0;) {
    if (!remove[n]) {
      bool used = false;
      for (ValueId id : graph.nodes[n].outputs) used = used || uses[static_cast<size_t>(id)] > 0;
      if (used) continue;
      remove[n] = true;
      for (ValueId id : graph.nodes[n].inputs) --uses[static_cast<size_t>(id)];
    }
  }
  std::vector<Node> kept;
  kept.reserve(graph.nodes.size());
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    if (!remove[n]) kept.push_back(std::move(graph.nodes[n]));
  graph.nodes = std::move(kept);
  renumber_producers(graph);
}

void remove_dead_nodes(Graph& graph) { remove_nodes(graph, {}); }

std::string unique_value_name(const Graph& graph, const std::string& base) {
  std::set<std::string> names;
  for (const Value& value : graph.values) names.insert(value.name);
  if (!names.count(base)) return base;
  for (int i = 1;; ++i) {
    const std::string candidate = base + "_" + std::to_string(i);
    if (!names.count(candidate)) return candidate;
  }
}

ValueId add_value(Graph& graph, std::string name, TensorMeta meta, ValueKind kind) {
  Value value;
  value.name = std::move(name);
  value.meta = std::move(meta);
  value.kind = kind;
  graph.values.push_back(std::move(value));
  return static_cast<ValueId>(graph.values.size() - 1);
}

ValueId add_constant(Graph& graph, const std::string& key, Tensor data) {
  const ValueId id = add_value(graph, key, TensorMeta{data.shape(), data.dtype()}, ValueKind::Weight);
  graph.value(id).weight_key = key;
  graph.constants[key] = std::move(data);
  graph.weights.push_back(id);
  return id;
}

ValueId add_derived_weight(Graph& graph, const std::string& name, TensorMeta meta, WeightTransform transform) {
  const ValueId id = add_value(graph, name, std::move(meta), ValueKind::Weight);
  graph.value(id).weight_key = name;
  graph.value(id).transform = std::move(transform);
  graph.weights.push_back(id);
  return id;
}

Node make_node(Graph& graph, const std::string& op, const std::string& name, Attrs attrs, std::vector<ValueId> inputs,
               const std::vector<TensorMeta>& output_metas, const std::vector<std::string>& output_names) {
  Node node;
  node.def = OpRegistry::instance().find(op);
  if (!node.def) fail("internal: op '" + op + "' is not registered");
  node.name = name;
  node.op = op;
  node.source_op = op;
  attrs.set_owner(graph.source + ": node '" + name + "' (" + op + ")");
  node.attrs = std::move(attrs);
  node.inputs = std::move(inputs);
  for (size_t i = 0; i < output_metas.size(); ++i)
    node.outputs.push_back(add_value(graph, unique_value_name(graph, output_names[i]), output_metas[i],
                                     ValueKind::NodeOutput));
  return node;
}

void insert_node(Graph& graph, size_t position, Node node) {
  graph.nodes.insert(graph.nodes.begin() + static_cast<std::ptrdiff_t>(position), std::move(node));
  renumber_producers(graph);
}

void check_graph(const Graph& graph, const std::string& after_pass) {
  std::vector<bool> ready(graph.values.size(), false);
  for (size_t i = 0; i < graph.values.size(); ++i) ready[i] = graph.values[i].kind != ValueKind::NodeOutput;
  for (const Node& node : graph.nodes) {
    for (ValueId id : node.inputs)
      if (!ready[static_cast<size_t>(id)])
        fail("internal: after pass '" + after_pass + "', node '" + node.name + "' reads '" + graph.value(id).name +
             "' before it is produced");
    for (ValueId id : node.outputs) ready[static_cast<size_t>(id)] = true;
  }
  for (ValueId id : graph.outputs)
    if (!ready[static_cast<size_t>(id)])
      fail("internal: after pass '" + after_pass + "', graph output '" + graph.value(id).name + "' has no producer");
}

}  // namespace npusim::compiler
