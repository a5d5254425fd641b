#pragma once
// Test graphs built node by node (shapes inferred by the registry), shared by the CUDA backend's tests and benchmarks.
#include <string>
#include <vector>

#include "compiler/graph_edit.h"
#include "unit/conformance_harness.h"

namespace npusim::test {

// Appends an `op` node named `name` to b's graph, with its output shape inferred, and returns its output.
inline ValueId add_node(Built& b, const std::string& op, const std::string& name, std::vector<ValueId> inputs,
                        Attrs a = {}) {
  std::vector<TensorMeta> metas;
  for (ValueId id : inputs) metas.push_back(b.graph.value(id).meta);
  const OpDef* def = OpRegistry::instance().find(op);
  OpRegistry::instance().normalize_attrs(*def, nullptr, a, b.graph.source);
  Node made = compiler::make_node(b.graph, op, name, a, inputs, def->infer(a, metas), {name});
  const ValueId out = made.outputs[0];
  b.graph.nodes.push_back(std::move(made));
  return out;
}

// Builds a test graph into `b`: operands with seeded values kept in `storage`, nodes with inferred shapes.
struct BlockBuilder {
  Built& b;
  DType storage;
  uint64_t seed = 1;
  ValueId input(const std::string& name, const Operand& operand) {
    return add_operand(b, name, operand, seed++, storage);
  }
  ValueId node(const std::string& op, const std::string& name, std::vector<ValueId> inputs, Attrs a = {}) {
    return add_node(b, op, name, std::move(inputs), std::move(a));
  }
};

// A biased GELU written out as pointwise ops (as Hugging Face's NewGELUActivation exports it), then scaled by a
// per-row factor; with `bias_sum_is_output` the biased sum is also a graph output, so it must be written.
struct GeluBlock {
  Built built;
  size_t nodes = 0;
};
inline GeluBlock gelu_block(DType storage, const Shape& shape, bool bias_sum_is_output) {
  GeluBlock block;
  Built& b = block.built;
  b.graph.source = "gelu block";
  BlockBuilder g{b, storage};
  auto node = [&](const std::string& op, const std::string& name, std::vector<ValueId> inputs, Attrs a = {}) {
    ++block.nodes;
    return g.node(op, name, std::move(inputs), std::move(a));
  };
  const ValueId x = g.input("x", f(shape)), bias = g.input("bias", w({shape.back()}));
  Shape per_row(shape.size(), 1);
  per_row[0] = shape[0];
  const ValueId scale = g.input("scale", f(per_row));
  const ValueId h = node("add", "biased", {x, bias});
  const ValueId cubed = node("pow", "cubed", {h}, attrs({{"exponent", F(3.0)}}));
  const ValueId small = node("mul", "small", {cubed}, attrs({{"other", F(0.044715)}}));
  const ValueId inner = node("add", "inner", {h, small});
  const ValueId scaled = node("mul", "scaled", {inner}, attrs({{"other", F(0.7978845608)}}));
  const ValueId tanh = node("tanh", "tanh", {scaled});
  const ValueId one_plus = node("add", "one_plus", {tanh}, attrs({{"other", I(1)}}));
  const ValueId half = node("mul", "half", {h}, attrs({{"other", F(0.5)}}));
  const ValueId gelu = node("mul", "gelu", {half, one_plus});
  const ValueId out = node("mul", "out", {gelu, scale});
  b.graph.outputs = {out};
  if (bias_sum_is_output) b.graph.outputs.push_back(h);
  compiler::renumber_producers(b.graph);
  return block;
}

}  // namespace npusim::test
