#pragma once
// Building blocks shared by the elementwise and reduction families: PyTorch's result-type rules with scalar
// operands, operands that are either inputs or scalar attributes, broadcast iteration, and typed element access
// in the reference domain.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ops/op_util.h"

namespace npusim::ops {

// Type promotion priority: tensors with dimensions outrank 0-d tensors, which outrank scalars.
enum class OperandKind { Tensor, ZeroDimTensor, Scalar };

struct TypedOperand {
  DType dtype;
  OperandKind kind;
};

TypedOperand tensor_operand(const TensorMeta& meta);
// A scalar attribute as PyTorch wraps it: bool, int64, or float (the default float dtype, float32).
TypedOperand scalar_operand(const AttrValue& value);
// torch.result_type over the operands (at least one).
DType result_type(std::span<const TypedOperand> operands);
// promote_types, with PyTorch's uint8 + int8 = int16.
DType promote_pair(DType a, DType b);

bool is_number(const AttrValue& value);  // int, float or bool

// Where each operand slot of an op comes from: an input tensor, or a scalar attribute named after the slot.
// With fewer inputs than slots, the slots whose attribute is present become scalars (the later ones first);
// inputs fill the remaining slots in order. `absent_ok` slots may be neither (clamp bounds).
struct SlotSource {
  int input = -1;                     // index into the inputs, or -1
  const AttrValue* scalar = nullptr;  // the attribute, when the slot is a scalar
  bool present() const { return input >= 0 || scalar != nullptr; }
};
std::vector<SlotSource> resolve_slots(const Attrs& attrs, size_t input_count, std::span<const std::string> slots);

// Promotion operands of the slots that are present.
std::vector<TypedOperand> slot_operands(std::span<const SlotSource> sources, std::span<const TensorMeta> inputs);
// Broadcast shape of the tensor slots (a scalar-only op gives []).
Shape slot_shape(std::span<const SlotSource> sources, std::span<const TensorMeta> inputs);
// Reference tensors of the slots: inputs as given, scalars as 0-d tensors of the reference dtype of `dtype`.
std::vector<Tensor> slot_tensors(std::span<const SlotSource> sources, std::span<const Tensor> inputs, DType dtype);
// Dtype that the reference computes a set of reference-domain tensors in (their promoted category).
DType compute_dtype(std::span<const Tensor> tensors);

// Integers and bools compute exactly in int64; floats compute on fp32 values (held in doubles).
bool computes_in_float(DType dtype);

// A 0-d reference-domain tensor holding `value` converted to `dtype` (float scalars truncate for integers).
Tensor scalar_tensor(const AttrValue& value, DType dtype);
double scalar_as_double(const AttrValue& value);

// Element access on reference-domain tensors. load_float rounds integers to fp32 like a dtype conversion would.
double load_float(const Tensor& t, int64_t i);
int64_t load_int(const Tensor& t, int64_t i);
void store_float(Tensor& t, int64_t i, double value);
void store_int(Tensor& t, int64_t i, int64_t value);

// Calls visit(output_index, offsets) for each element of `out_shape` in order; offsets[k] is the element of
// input k (broadcast to out_shape).
using BroadcastVisitor = std::function<void(int64_t, std::span<const int64_t>)>;
void for_each_broadcast(const Shape& out_shape, std::span<const Shape> input_shapes, const BroadcastVisitor& visit);

// out[i] = fn(values of every input at i), inputs broadcast to the output, output in the reference domain.
using FloatMap = std::function<double(std::span<const double>)>;
using IntMap = std::function<int64_t(std::span<const int64_t>)>;
Tensor map_float(const TensorMeta& out, std::span<const Tensor> inputs, const FloatMap& fn);
Tensor map_int(const TensorMeta& out, std::span<const Tensor> inputs, const IntMap& fn);

// Integer arithmetic that wraps on overflow like PyTorch's int64 kernels.
int64_t wrapping_add(int64_t a, int64_t b);
int64_t wrapping_sub(int64_t a, int64_t b);
int64_t wrapping_mul(int64_t a, int64_t b);

}  // namespace npusim::ops
