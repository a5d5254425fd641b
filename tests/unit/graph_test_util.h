// Building small graphs by hand for compiler and runtime tests.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "compiler/graph_edit.h"
#include "npusim/graph.h"
#include "npusim/op_registry.h"
#include "unit/op_test_util.h"

namespace npusim::test {

class GraphBuilder {
 public:
  GraphBuilder() { graph_.source = "test"; }

  ValueId input(const std::string& name, Shape shape, DType dtype = DType::Float32) {
    const ValueId id = compiler::add_value(graph_, name, {std::move(shape), dtype}, ValueKind::GraphInput);
    graph_.inputs.push_back(id);
    return id;
  }
  ValueId weight(const std::string& name, Shape shape) {
    const ValueId id = compiler::add_value(graph_, name, {std::move(shape), DType::Float32}, ValueKind::Weight);
    graph_.value(id).weight_key = name;
    graph_.weights.push_back(id);
    return id;
  }
  // A node of a registered op (canonical name) with its attribute defaults and inferred outputs.
  ValueId op(const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}) {
    const OpRegistry& registry = OpRegistry::instance();
    const OpDef* def = registry.find(op);
    if (!def) throw std::runtime_error("unknown op " + op);
    registry.normalize_attrs(*def, nullptr, attrs, "test");
    std::vector<TensorMeta> metas;
    for (ValueId id : inputs) metas.push_back(graph_.value(id).meta);
    const std::string name = op + "_" + std::to_string(graph_.nodes.size());
    graph_.nodes.push_back(compiler::make_node(graph_, op, name, attrs, inputs, def->infer(attrs, metas), {name}));
    compiler::renumber_producers(graph_);
    return graph_.nodes.back().outputs[0];
  }
  // A binary op with a scalar operand in attrs, as torch_ir writes `x + 1.0`.
  ValueId scalar_op(const std::string& name, ValueId x, double scalar, const char* slot = "other") {
    return op(name, {x}, make_attrs({{slot, scalar}}));
  }
  void output(ValueId id) { graph_.outputs.push_back(id); }
  const Graph& graph() const { return graph_; }

 private:
  Graph graph_;
};

}  // namespace npusim::test
