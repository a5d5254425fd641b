#include "compiler/passes/fusion.h"

#include <algorithm>
#include <set>
#include <variant>

#include "compiler/graph_edit.h"
#include "npusim/op_registry.h"

namespace npusim::compiler {

FusionMatcher::FusionMatcher(Graph& graph)
    : graph_(graph),
      consumers_(consumers(graph)),
      uses_(use_counts(graph)),
      taken_(graph.nodes.size(), false),
      remove_(graph.nodes.size(), false) {}

const Node* FusionMatcher::producer(ValueId id, std::string_view op) const {
  const Value& value = graph_.value(id);
  if (value.kind != ValueKind::NodeOutput || value.producer < 0) return nullptr;
  if (taken_[static_cast<size_t>(value.producer)]) return nullptr;
  const Node& node = graph_.nodes[static_cast<size_t>(value.producer)];
  if (!op.empty() && node.op != op) return nullptr;
  return &node;
}

int32_t FusionMatcher::index_of(const Node& node) const { return static_cast<int32_t>(&node - graph_.nodes.data()); }

const Node* FusionMatcher::sole_consumer(ValueId id, std::string_view op) const {
  const auto& readers = consumers_[static_cast<size_t>(id)];
  if (uses_[static_cast<size_t>(id)] != 1 || readers.size() != 1) return nullptr;  // graph outputs count as uses
  if (taken_[static_cast<size_t>(readers[0])]) return nullptr;
  const Node& node = graph_.nodes[static_cast<size_t>(readers[0])];
  if (!op.empty() && node.op != op) return nullptr;
  return &node;
}

bool FusionMatcher::absorbable(ValueId id, std::span<const int32_t> pattern) const {
  if (is_graph_output(graph_, id)) return false;
  for (int32_t reader : consumers_[static_cast<size_t>(id)])
    if (std::find(pattern.begin(), pattern.end(), reader) == pattern.end()) return false;
  return true;
}

bool FusionMatcher::replace(std::span<const int32_t> pattern, const std::string& op, Attrs attrs,
                            std::vector<ValueId> inputs) {
  if (pattern.empty()) return false;
  for (int32_t n : pattern)
    if (taken_[static_cast<size_t>(n)]) return false;
  const int32_t last = *std::max_element(pattern.begin(), pattern.end());
  const Node& replaced = graph_.nodes[static_cast<size_t>(last)];
  if (replaced.outputs.size() != 1) return false;
  const ValueId output = replaced.outputs[0];
  const std::string name = replaced.name;
  for (ValueId id : inputs) {
    const Value& value = graph_.value(id);
    const bool ready = value.kind != ValueKind::NodeOutput ||
                       (value.producer >= 0 && value.producer < last &&
                        std::find(pattern.begin(), pattern.end(), value.producer) == pattern.end());
    if (!ready)
      fail("internal: fusing '" + replaced.name + "' into " + op + " would read '" + value.name +
           "', which is not computed before it");
  }

  const OpRegistry& registry = OpRegistry::instance();
  const OpDef* def = registry.find(op);
  if (!def) fail("internal: fused op '" + op + "' is not registered");
  std::vector<TensorMeta> metas;
  for (ValueId id : inputs) metas.push_back(graph_.value(id).meta);
  try {
    registry.normalize_attrs(*def, nullptr, attrs, graph_.source + ": " + name);
    const std::vector<TensorMeta> inferred = def->infer(attrs, metas);
    if (inferred.size() != 1 || inferred[0].shape != graph_.value(output).meta.shape) return false;
  } catch (const Error&) {
    return false;
  }

  Node fused = make_node(graph_, op, name, std::move(attrs), std::move(inputs), {}, {});
  fused.outputs = {output};
  graph_.nodes[static_cast<size_t>(last)] = std::move(fused);
  for (int32_t n : pattern) {
    taken_[static_cast<size_t>(n)] = true;
    if (n != last) remove_[static_cast<size_t>(n)] = true;
  }
  ++replaced_;
  return true;
}

void FusionMatcher::finish(PassContext& context, const std::string& pass, const std::string& what) {
  if (replaced_ == 0) return;
  remove_nodes(graph_, remove_);
  context.note(pass, std::to_string(replaced_) + " " + what);
}

std::optional<double> scalar_attr(const Node& node, const char* name) {
  if (node.inputs.size() != 1 || !node.attrs.has(name)) return std::nullopt;
  const AttrValue& value = node.attrs.get(name);
  if (const auto* d = std::get_if<double>(&value)) return *d;
  if (const auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  return std::nullopt;
}

bool unit_alpha(const Node& node) { return node.attrs.get_float("alpha", 1.0) == 1.0; }

ValueId other_input(const Node& node, ValueId known) {
  if (node.inputs.size() != 2) return kNoValue;
  return node.inputs[0] == known ? node.inputs[1] : node.inputs[0];
}

bool is_last_dim(int64_t dim, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  return rank > 0 && (dim == r - 1 || dim == -1);
}

namespace {

const std::set<std::string> kActivations = {"relu", "hardtanh", "silu",      "sigmoid",
                                            "tanh", "gelu",     "hardswish", "leaky_relu"};
const char* const kActivationParams[] = {"min_val", "max_val", "negative_slope", "approximate"};

}  // namespace

bool fusable_activation(const Node& node) { return kActivations.count(node.op) && node.inputs.size() == 1; }

void set_activation(Attrs& attrs, const Node& activation) {
  attrs.set("activation", activation.op);
  for (const char* param : kActivationParams)
    if (!activation.attrs.is_none(param)) attrs.set(param, activation.attrs.get(param));
}

}  // namespace npusim::compiler
