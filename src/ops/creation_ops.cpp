// Tensor factories: arange, linspace, full and its spellings (zeros, ones, empty, *_like, new_*), scalar_tensor.
// Output shapes come from attributes; they are validated before anything is allocated.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "ops/op_util.h"

namespace npusim {

void register_rotary_embedding_op(OpRegistry& registry);  // rope_op.cpp

namespace {

using namespace ops;

constexpr int64_t kMaxElements = int64_t{1} << 40;

std::vector<TensorMeta> one_output(Shape shape, DType dtype) { return {TensorMeta{std::move(shape), dtype}}; }

void check_element_count(int64_t count, const std::string& op) {
  if (count > kMaxElements) fail(op + ": " + std::to_string(count) + " elements is more than the limit of 2^40");
}

Shape size_attr(const Attrs& attrs, const std::string& op) {
  if (attrs.is_none("size")) fail(op + ": missing attribute 'size'");
  const Shape shape = attrs.get_ints("size");
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(op + ": size " + shape_string(shape) + " has a negative dimension");
    if (d != 0 && count > kMaxElements / d) fail(op + ": size " + shape_string(shape) + " has more than 2^40 elements");
    count *= d;
  }
  return shape;
}

std::optional<DType> dtype_attr(const Attrs& attrs) {
  if (attrs.is_none("dtype")) return std::nullopt;
  return *parse_dtype(attrs.get_string("dtype"));
}

bool holds_bool(const Attrs& attrs, const std::string& name) {
  return attrs.has(name) && std::holds_alternative<bool>(attrs.get(name));
}

// The dtype PyTorch gives a Python scalar: bool, int64 or the default float32.
DType scalar_dtype(const Attrs& attrs, const std::string& name) {
  if (holds_bool(attrs, name)) return DType::Bool;
  return attrs.is_integer(name) ? DType::Int64 : DType::Float32;
}

int64_t float_to_int64(double value, const std::string& what) {
  if (!(std::abs(value) < 9.2e18)) fail(what + ": " + std::to_string(value) + " does not fit an int64 tensor");
  return static_cast<int64_t>(value);
}

// Fills a reference-domain tensor; integer scalars stay exact for int64 tensors.
void fill(Tensor& t, const Attrs& attrs, const std::string& name) {
  const int64_t count = t.numel();
  if (t.dtype() == DType::Int64) {
    const int64_t value = attrs.is_integer(name) ? attrs.get_int(name) : float_to_int64(attrs.get_float(name), name);
    std::fill_n(t.mutable_data<int64_t>(), count, value);
    return;
  }
  const double value = attrs.get_float(name);
  for (int64_t i = 0; i < count; ++i) write_element(t, i, value);
}

std::vector<Tensor> fill_reference(const Attrs& attrs, std::span<const Tensor>, std::span<const TensorMeta> outputs) {
  Tensor out = make_output(outputs[0]);
  fill(out, attrs, "fill_value");
  return {out};
}

// ---------------------------------------------------------------------------------------------------------------
// full family

std::vector<TensorMeta> infer_full(const Attrs& attrs, std::span<const TensorMeta>) {
  const Shape shape = size_attr(attrs, "full");
  return one_output(shape, dtype_attr(attrs).value_or(scalar_dtype(attrs, "fill_value")));
}

std::vector<TensorMeta> infer_full_like(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  return one_output(inputs[0].shape, dtype_attr(attrs).value_or(inputs[0].dtype));
}

// new_full / new_ones / ...: the input only lends its dtype.
std::vector<TensorMeta> infer_new_full(const Attrs& attrs, std::span<const TensorMeta> inputs) {
  const Shape shape = size_attr(attrs, "new_full");
  return one_output(shape, dtype_attr(attrs).value_or(inputs[0].dtype));
}

std::vector<TensorMeta> infer_scalar_tensor(const Attrs& attrs, std::span<const TensorMeta>) {
  return one_output({}, dtype_attr(attrs).value_or(DType::Float32));
}

// ---------------------------------------------------------------------------------------------------------------
// arange / linspace

DType arange_dtype(const Attrs& attrs) {
  if (auto dtype = dtype_attr(attrs)) return *dtype;
  const bool all_integers = attrs.is_integer("start") && attrs.is_integer("end") && attrs.is_integer("step");
  return all_integers ? DType::Int64 : DType::Float32;
}

struct ArangePlan {
  double start = 0;
  double step = 1;
  int64_t length = 0;
  bool integral = false;
  int64_t int_start = 0;
  int64_t int_step = 1;
};

// PyTorch's length rule: ceil((end - start) / step); integer outputs convert the bounds to integers first.
ArangePlan arange_plan(const Attrs& attrs, DType dtype) {
  if (dtype == DType::Bool) fail("arange: bool output is not supported");
  ArangePlan plan;
  plan.integral = is_integral(dtype);
  const double start = attrs.get_float("start");
  const double end = attrs.get_float("end");
  const double step = attrs.get_float("step");
  if (!std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step))
    fail("arange: start, end and step must be finite");
  if (step == 0) fail("arange: step must be nonzero");
  if ((step > 0 && end < start) || (step < 0 && end > start))
    fail("arange: the range from " + attr_value_string(attrs.get("start")) + " to " +
         attr_value_string(attrs.get("end")) + " is inconsistent with the sign of step");
  double length = 0;
  if (plan.integral) {
    auto as_int = [&](const char* name) {
      return attrs.is_integer(name) ? attrs.get_int(name) : float_to_int64(attrs.get_float(name), name);
    };
    plan.int_start = as_int("start");
    plan.int_step = as_int("step");
    const int64_t int_end = as_int("end");
    if (plan.int_step == 0) fail("arange: step must be nonzero after conversion to an integer");
    const int64_t sign = plan.int_step > 0 ? 1 : -1;
    length =
        static_cast<double>(std::max<int64_t>((int_end - plan.int_start + plan.int_step - sign) / plan.int_step, 0));
  } else {
    length = std::ceil((end - start) / step);
  }
  if (length > static_cast<double>(kMaxElements)) fail("arange: more than 2^40 elements");
  plan.start = start;
  plan.step = step;
  plan.length = static_cast<int64_t>(length);
  return plan;
}

std::vector<TensorMeta> infer_arange(const Attrs& attrs, std::span<const TensorMeta>) {
  const DType dtype = arange_dtype(attrs);
  return one_output({arange_plan(attrs, dtype).length}, dtype);
}

std::vector<Tensor> arange_reference(const Attrs& attrs, std::span<const Tensor>, std::span<const TensorMeta> outputs) {
  const ArangePlan plan = arange_plan(attrs, outputs[0].dtype);
  Tensor out = make_output(outputs[0]);
  for (int64_t i = 0; i < plan.length; ++i) {
    if (plan.integral)
      out.mutable_data<int64_t>()[i] = plan.int_start + i * plan.int_step;
    else
      write_element(out, i, plan.start + static_cast<double>(i) * plan.step);
  }
  return {out};
}

int64_t linspace_steps(const Attrs& attrs) {
  const int64_t steps = attrs.get_int("steps");
  if (steps < 0) fail("linspace: steps must be non-negative, got " + std::to_string(steps));
  check_element_count(steps, "linspace");
  return steps;
}

std::vector<TensorMeta> infer_linspace(const Attrs& attrs, std::span<const TensorMeta>) {
  const DType dtype = dtype_attr(attrs).value_or(DType::Float32);
  if (dtype == DType::Bool) fail("linspace: bool output is not supported");
  return one_output({linspace_steps(attrs)}, dtype);
}

// Like PyTorch, the second half counts back from `end` so that the last value is exactly `end`.
template <typename T>
void fill_linear(Tensor& out, T start, T end, int64_t steps) {
  const T step = (end - start) / static_cast<T>(steps - 1);
  for (int64_t i = 0; i < steps; ++i) {
    const T value = i < steps / 2 ? start + step * static_cast<T>(i) : end - step * static_cast<T>(steps - 1 - i);
    write_element(out, i, static_cast<double>(value));
  }
}

std::vector<Tensor> linspace_reference(const Attrs& attrs, std::span<const Tensor>,
                                       std::span<const TensorMeta> outputs) {
  const int64_t steps = linspace_steps(attrs);
  const double start = attrs.get_float("start");
  const double end = attrs.get_float("end");
  Tensor out = make_output(outputs[0]);
  if (steps == 1) write_element(out, 0, start);
  if (steps <= 1) return {out};
  if (out.dtype() == DType::Float32) {  // PyTorch steps in the output dtype for floats
    fill_linear<float>(out, static_cast<float>(start), static_cast<float>(end), steps);
  } else {
    fill_linear<double>(out, start, end, steps);
  }
  return {out};
}

// ---------------------------------------------------------------------------------------------------------------

AtenSpelling aten(std::string op_type, std::map<std::string, std::string> rename = {},
                  std::map<std::string, AttrValue> fixed = {}) {
  return {std::move(op_type), std::move(rename), std::move(fixed)};
}

AtenSpelling filled_with(std::string op_type, double value) {
  return aten(std::move(op_type), {}, {{"fill_value", value}});
}

}  // namespace

void register_creation_ops(OpRegistry& r) {
  // zeros / ones / empty are `full` with a fixed value (empty is zero-filled).
  r.add(checked_op<infer_full, fill_reference>(
      "full",
      {aten("aten.full.default"), filled_with("aten.zeros.default", 0.0), filled_with("aten.ones.default", 1.0),
       filled_with("aten.empty.memory_format", 0.0), filled_with("aten.empty_strided.default", 0.0)},
      {optional("size", AttrType::Ints), required("fill_value", AttrType::Scalar),
       optional("dtype", AttrType::DTypeName)},
      0, 0));
  r.add(checked_op<infer_full_like, fill_reference>(
      "full_like",
      {aten("aten.full_like.default"), filled_with("aten.zeros_like.default", 0.0),
       filled_with("aten.ones_like.default", 1.0), filled_with("aten.empty_like.default", 0.0)},
      {required("fill_value", AttrType::Scalar), optional("dtype", AttrType::DTypeName)}, 1, 1));
  r.add(checked_op<infer_new_full, fill_reference>(
      "new_full",
      {aten("aten.new_full.default"), filled_with("aten.new_zeros.default", 0.0),
       filled_with("aten.new_ones.default", 1.0), filled_with("aten.new_empty.default", 0.0),
       filled_with("aten.new_empty_strided.default", 0.0)},
      {optional("size", AttrType::Ints), required("fill_value", AttrType::Scalar),
       optional("dtype", AttrType::DTypeName)},
      1, 1));
  r.add(checked_op<infer_scalar_tensor, fill_reference>(
      "scalar_tensor", {aten("aten.scalar_tensor.default", {{"s", "fill_value"}})},
      {required("fill_value", AttrType::Scalar), optional("dtype", AttrType::DTypeName)}, 0, 0));
  r.add(checked_op<infer_arange, arange_reference>(
      "arange", {aten("aten.arange.default"), aten("aten.arange.start"), aten("aten.arange.start_step")},
      {with_default("start", AttrType::Scalar, int64_t{0}), required("end", AttrType::Scalar),
       with_default("step", AttrType::Scalar, int64_t{1}), optional("dtype", AttrType::DTypeName)},
      0, 0));
  r.add(checked_op<infer_linspace, linspace_reference>(
      "linspace", {aten("aten.linspace.default")},
      {required("start", AttrType::Scalar), required("end", AttrType::Scalar), required("steps", AttrType::Int),
       optional("dtype", AttrType::DTypeName)},
      0, 0));
  register_rotary_embedding_op(r);
}

}  // namespace npusim
