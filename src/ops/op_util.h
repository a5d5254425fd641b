#pragma once
// Helpers shared by the op families: dimension handling, broadcasting, type promotion, element access.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "npusim/graph.h"
#include "npusim/op_registry.h"
#include "npusim/tensor.h"

namespace npusim::ops {

// Wraps a possibly negative dim into [0, rank); errors name the attribute.
int64_t normalize_dim(int64_t dim, int64_t rank, const char* what = "dim");
// Which dims of a rank-`rank` tensor a reduction's `dim` list names, where null or [] means every dim.
std::vector<bool> reduced_dims(const Attrs& attrs, int64_t rank);
// Whether `op` multiplies matrices (linear, matmul, mm, bmm, addmm, baddbmm).
bool is_matrix_product(const std::string& op);
Shape broadcast_shapes(const Shape& a, const Shape& b);
// PyTorch-style promotion for two tensor operands (bool < integers < floats; wider wins).
DType promote_types(DType a, DType b);
// Result dtype of tensor `a` combined with a scalar attribute (a float scalar turns integers into float32).
DType promote_with_scalar(DType a, bool scalar_is_float);

// Index into a broadcast input: strides of `input` viewed with `out_shape` (0 on broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& input, const Shape& out_shape);

// Fresh zero-filled output in the reference domain.
Tensor make_output(const TensorMeta& meta);

// Common ShapeFn / checks.
void expect_inputs(std::span<const TensorMeta> inputs, size_t count, const char* op);
void expect_rank(const TensorMeta& meta, int rank, const char* what);
TensorMeta same_as_input(std::span<const TensorMeta> inputs, size_t index = 0);

// Reads element i of a reference-domain tensor (f32, i64 or bool) as double, and writes it back.
double read_element(const Tensor& t, int64_t i);
void write_element(Tensor& t, int64_t i, double value);

// Attribute specs: required (no default), optional (absent stays absent) and with an ATen default.
inline AttrSpec required(std::string name, AttrType type) { return {std::move(name), type, std::nullopt, true}; }
inline AttrSpec optional(std::string name, AttrType type) { return {std::move(name), type, std::nullopt}; }
inline AttrSpec with_default(std::string name, AttrType type, AttrValue value) {
  return {std::move(name), type, std::move(value)};
}

// An op whose reference recomputes the output metas from the tensors it receives, so it never trusts unchecked
// shapes: Infer(attrs, metas) -> metas, Compute(attrs, inputs, metas) -> outputs.
template <auto Infer, auto Compute>
OpDef checked_op(std::string name, std::vector<AtenSpelling> spellings, std::vector<AttrSpec> attrs, int min_inputs,
                 int max_inputs) {
  OpDef def{std::move(name), std::move(spellings), std::move(attrs), min_inputs, max_inputs, Infer, nullptr};
  def.reference = [](const Attrs& a, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
    std::vector<TensorMeta> metas;
    for (const Tensor& t : inputs) metas.push_back({t.shape(), t.dtype()});
    return Compute(a, inputs, Infer(a, metas));
  };
  return def;
}

}  // namespace npusim::ops
