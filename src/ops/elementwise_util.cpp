#include "ops/elementwise_util.h"

#include <cmath>
#include <limits>
#include <optional>

namespace npusim::ops {

namespace {

// Float-to-integer conversion without undefined behaviour: NaN becomes 0, out-of-range values saturate.
int64_t to_int64(double value) {
  if (std::isnan(value)) return 0;
  if (value >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
  if (value <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(value);
}

std::optional<DType> combine_categories(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating(*higher)) return higher;
  if (*higher == DType::Bool || is_floating(*lower)) return promote_pair(*higher, *lower);
  return higher;
}

}  // namespace

TypedOperand tensor_operand(const TensorMeta& meta) {
  return {meta.dtype, meta.shape.empty() ? OperandKind::ZeroDimTensor : OperandKind::Tensor};
}

TypedOperand scalar_operand(const AttrValue& value) {
  if (std::holds_alternative<bool>(value)) return {DType::Bool, OperandKind::Scalar};
  if (std::holds_alternative<int64_t>(value)) return {DType::Int64, OperandKind::Scalar};
  if (std::holds_alternative<double>(value)) return {DType::Float32, OperandKind::Scalar};
  fail("scalar operand must be a number, got " + attr_value_string(value));
}

DType promote_pair(DType a, DType b) {
  if ((a == DType::UInt8 && b == DType::Int8) || (a == DType::Int8 && b == DType::UInt8)) return DType::Int16;
  return promote_types(a, b);
}

DType result_type(std::span<const TypedOperand> operands) {
  std::optional<DType> by_kind[3];
  for (const TypedOperand& operand : operands) {
    auto& slot = by_kind[static_cast<int>(operand.kind)];
    slot = slot ? promote_pair(*slot, operand.dtype) : operand.dtype;
  }
  const auto result = combine_categories(by_kind[0], combine_categories(by_kind[1], by_kind[2]));
  if (!result) fail("result_type needs at least one operand");
  return *result;
}

bool is_number(const AttrValue& value) {
  return std::holds_alternative<bool>(value) || std::holds_alternative<int64_t>(value) ||
         std::holds_alternative<double>(value);
}

std::vector<SlotSource> resolve_slots(const Attrs& attrs, size_t input_count, std::span<const std::string> slots) {
  if (input_count > slots.size())
    fail("expects at most " + std::to_string(slots.size()) + " inputs, got " + std::to_string(input_count));
  std::vector<SlotSource> sources(slots.size());
  size_t scalars_needed = slots.size() - input_count;
  for (size_t s = slots.size(); s-- > 0 && scalars_needed > 0;) {
    if (attrs.is_none(slots[s])) continue;
    const AttrValue& value = attrs.get(slots[s]);
    if (!is_number(value)) fail("scalar operand '" + slots[s] + "' must be a number, got " + attr_value_string(value));
    sources[s].scalar = &value;
    --scalars_needed;
  }
  int next_input = 0;
  for (SlotSource& source : sources)
    if (!source.scalar && next_input < static_cast<int>(input_count)) source.input = next_input++;
  return sources;
}

std::vector<TypedOperand> slot_operands(std::span<const SlotSource> sources, std::span<const TensorMeta> inputs) {
  std::vector<TypedOperand> operands;
  for (const SlotSource& source : sources) {
    if (source.input >= 0)
      operands.push_back(tensor_operand(inputs[static_cast<size_t>(source.input)]));
    else if (source.scalar)
      operands.push_back(scalar_operand(*source.scalar));
  }
  return operands;
}

Shape slot_shape(std::span<const SlotSource> sources, std::span<const TensorMeta> inputs) {
  Shape shape;
  for (const SlotSource& source : sources)
    if (source.input >= 0) shape = broadcast_shapes(shape, inputs[static_cast<size_t>(source.input)].shape);
  return shape;
}

std::vector<Tensor> slot_tensors(std::span<const SlotSource> sources, std::span<const Tensor> inputs, DType dtype) {
  std::vector<Tensor> tensors;
  for (const SlotSource& source : sources) {
    if (source.input >= 0)
      tensors.push_back(inputs[static_cast<size_t>(source.input)]);
    else if (source.scalar)
      tensors.push_back(scalar_tensor(*source.scalar, dtype));
  }
  return tensors;
}

DType compute_dtype(std::span<const Tensor> tensors) {
  DType dtype = DType::Bool;
  for (const Tensor& t : tensors) dtype = promote_types(dtype, reference_dtype(t.dtype()));
  return dtype;
}

bool computes_in_float(DType dtype) { return is_floating(dtype); }

double scalar_as_double(const AttrValue& value) {
  if (auto* b = std::get_if<bool>(&value)) return *b ? 1.0 : 0.0;
  if (auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&value)) return *d;
  fail("scalar operand must be a number, got " + attr_value_string(value));
}

Tensor scalar_tensor(const AttrValue& value, DType dtype) {
  Tensor t(reference_dtype(dtype), {});
  if (auto* i = std::get_if<int64_t>(&value))
    store_int(t, 0, *i);
  else if (auto* b = std::get_if<bool>(&value))
    store_int(t, 0, *b ? 1 : 0);
  else
    store_float(t, 0, scalar_as_double(value));
  return t;
}

double load_float(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::Float32:
      return t.data<float>()[i];
    case DType::Int64:
      return static_cast<float>(t.data<int64_t>()[i]);
    case DType::Bool:
      return t.data<uint8_t>()[i] ? 1.0 : 0.0;
    default:
      return static_cast<float>(t.element_as_double(i));
  }
}

int64_t load_int(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::Int64:
      return t.data<int64_t>()[i];
    case DType::Bool:
      return t.data<uint8_t>()[i] ? 1 : 0;
    default:
      return to_int64(t.element_as_double(i));
  }
}

void store_float(Tensor& t, int64_t i, double value) {
  switch (t.dtype()) {
    case DType::Float32:
      t.mutable_data<float>()[i] = static_cast<float>(value);
      return;
    case DType::Int64:
      t.mutable_data<int64_t>()[i] = to_int64(value);
      return;
    case DType::Bool:
      t.mutable_data<uint8_t>()[i] = value != 0.0 ? 1 : 0;
      return;
    default:
      fail("store_float: tensor is not in the reference domain (" + std::string(dtype_name(t.dtype())) + ")");
  }
}

void store_int(Tensor& t, int64_t i, int64_t value) {
  switch (t.dtype()) {
    case DType::Float32:
      t.mutable_data<float>()[i] = static_cast<float>(value);
      return;
    case DType::Int64:
      t.mutable_data<int64_t>()[i] = value;
      return;
    case DType::Bool:
      t.mutable_data<uint8_t>()[i] = value != 0 ? 1 : 0;
      return;
    default:
      fail("store_int: tensor is not in the reference domain (" + std::string(dtype_name(t.dtype())) + ")");
  }
}

void for_each_broadcast(const Shape& out_shape, std::span<const Shape> input_shapes, const BroadcastVisitor& visit) {
  const size_t rank = out_shape.size();
  std::vector<std::vector<int64_t>> strides;
  for (const Shape& shape : input_shapes) {
    if (broadcast_shapes(shape, out_shape) != out_shape)
      fail("shape " + shape_string(shape) + " does not broadcast to " + shape_string(out_shape));
    strides.push_back(broadcast_strides(shape, out_shape));
  }
  const int64_t total = shape_numel(out_shape);
  std::vector<int64_t> index(rank, 0);
  std::vector<int64_t> offsets(input_shapes.size(), 0);
  for (int64_t i = 0; i < total; ++i) {
    visit(i, offsets);
    for (size_t d = rank; d-- > 0;) {
      for (size_t k = 0; k < offsets.size(); ++k) offsets[k] += strides[k][d];
      if (++index[d] < out_shape[d]) break;
      for (size_t k = 0; k < offsets.size(); ++k) offsets[k] -= strides[k][d] * out_shape[d];
      index[d] = 0;
    }
  }
}

namespace {

std::vector<Shape> shapes_of(std::span<const Tensor> tensors) {
  std::vector<Shape> shapes;
  for (const Tensor& t : tensors) shapes.push_back(t.shape());
  return shapes;
}

}  // namespace

Tensor map_float(const TensorMeta& out, std::span<const Tensor> inputs, const FloatMap& fn) {
  Tensor result = make_output(out);
  std::vector<double> values(inputs.size());
  for_each_broadcast(out.shape, shapes_of(inputs), [&](int64_t i, std::span<const int64_t> offsets) {
    for (size_t k = 0; k < inputs.size(); ++k) values[k] = load_float(inputs[k], offsets[k]);
    store_float(result, i, fn(values));
  });
  return result;
}

Tensor map_int(const TensorMeta& out, std::span<const Tensor> inputs, const IntMap& fn) {
  Tensor result = make_output(out);
  std::vector<int64_t> values(inputs.size());
  for_each_broadcast(out.shape, shapes_of(inputs), [&](int64_t i, std::span<const int64_t> offsets) {
    for (size_t k = 0; k < inputs.size(); ++k) values[k] = load_int(inputs[k], offsets[k]);
    store_int(result, i, fn(values));
  });
  return result;
}

int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wrapping_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t wrapping_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

}  // namespace npusim::ops
