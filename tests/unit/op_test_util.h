// Helpers for op unit tests: tensor builders, running one op through the registry the way the compiler does,
// value extractors and element-by-element comparators.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"

namespace npusim::test {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

using AttrList = std::vector<std::pair<std::string, AttrValue>>;

inline Attrs make_attrs(AttrList values = {}) {
  Attrs attrs("test");
  for (auto& [name, value] : values) attrs.set(name, std::move(value));
  return attrs;
}

inline AttrValue ints_attr(std::vector<int64_t> values) { return values; }

inline TensorMeta meta(Shape shape, DType dtype = DType::Float32) { return {std::move(shape), dtype}; }

// ---------------------------------------------------------------------------------------------------------------
// Tensor builders: values in row-major order, converted to `dtype` when one is given.

inline Tensor floats(Shape shape, const std::vector<float>& values, DType dtype = DType::Float32) {
  Tensor t(DType::Float32, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy_n(values.begin(), std::min(t.numel(), static_cast<int64_t>(values.size())), t.mutable_data<float>());
  return t.to(dtype);
}

inline Tensor ints(Shape shape, const std::vector<int64_t>& values, DType dtype = DType::Int64) {
  Tensor t(DType::Int64, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy_n(values.begin(), std::min(t.numel(), static_cast<int64_t>(values.size())), t.mutable_data<int64_t>());
  return t.to(dtype);
}

// Any nonzero value is true.
inline Tensor bools(Shape shape, const std::vector<uint8_t>& values) {
  Tensor t(DType::Bool, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size() && static_cast<int64_t>(i) < t.numel(); ++i)
    t.mutable_data<uint8_t>()[i] = values[i] ? 1 : 0;
  return t;
}

// 0, 1, 2, ... in row-major order.
inline Tensor iota(Shape shape, DType dtype = DType::Float32) {
  if (is_floating(dtype)) {
    Tensor t(DType::Float32, std::move(shape));
    std::iota(t.mutable_data<float>(), t.mutable_data<float>() + t.numel(), 0.0f);
    return t.to(dtype);
  }
  Tensor t(DType::Int64, std::move(shape));
  std::iota(t.mutable_data<int64_t>(), t.mutable_data<int64_t>() + t.numel(), int64_t{0});
  return t.to(dtype);
}

inline std::vector<float> iota_values(int n) {
  std::vector<float> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), 0.0f);
  return values;
}

// Deterministic values in [-1, 1] that differ from element to element.
inline Tensor pattern(Shape shape, float seed = 0.0f) {
  Tensor t(DType::Float32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = std::sin(0.7f * static_cast<float>(i) + seed);
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// Running ops

struct OpRun {
  std::string canonical;  // the registered op's name
  std::vector<TensorMeta> metas;
  std::vector<Tensor> outputs;

  // The only output (and its meta) of a single-output op.
  const TensorMeta& meta() const& { return only(metas); }
  TensorMeta meta() && { return only(metas); }
  const Tensor& out() const& { return only(outputs); }
  Tensor out() && { return only(outputs); }

 private:
  template <typename T>
  static const T& only(const std::vector<T>& items) {
    EXPECT_EQ(items.size(), 1u) << "expected a single output";
    return items.at(0);
  }
};

// An IR op_type (ATen spelling) or, for ops only the compiler creates, a canonical name.
inline std::pair<const OpDef*, const AtenSpelling*> find_op(const std::string& op_type) {
  const OpRegistry& registry = OpRegistry::instance();
  auto found = registry.find_spelling(op_type);
  if (!found.first) found = {registry.find(op_type), nullptr};
  // Not npusim::Error: a misspelled op must not satisfy EXPECT_THROW(..., Error).
  if (!found.first) throw std::logic_error("no op registered for " + op_type);
  return found;
}

inline std::vector<TensorMeta> metas_of(const std::vector<Tensor>& tensors) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : tensors) metas.push_back({t.shape(), t.dtype()});
  return metas;
}

// Fills attribute defaults and applies the spelling's renames, as the compiler does before inferring.
inline const OpDef& normalize_op(const std::string& op_type, Attrs& attrs) {
  const auto [def, spelling] = find_op(op_type);
  OpRegistry::instance().normalize_attrs(*def, spelling, attrs, op_type);
  return *def;
}

// Shape inference alone, without the input-count check, so that tests reach the ShapeFn's own checks.
inline std::vector<TensorMeta> infer_op(const std::string& op_type, const std::vector<TensorMeta>& inputs,
                                        Attrs attrs = make_attrs()) {
  const OpDef& def = normalize_op(op_type, attrs);
  return def.infer(attrs, inputs);
}

// Runs one op the way the compiler does: normalize attrs, check the input count, infer, then run the reference
// on inputs converted to the reference domain; the outputs must match the inferred metas.
inline OpRun run_op(const std::string& op_type, const std::vector<Tensor>& inputs, Attrs attrs = make_attrs()) {
  const OpDef& def = normalize_op(op_type, attrs);
  const int count = static_cast<int>(inputs.size());
  if (count < def.min_inputs || (def.max_inputs >= 0 && count > def.max_inputs))
    fail(op_type + ": wrong number of inputs");
  OpRun run{def.name, def.infer(attrs, metas_of(inputs)), {}};
  std::vector<Tensor> reference_inputs;
  for (const Tensor& t : inputs) reference_inputs.push_back(t.to_reference());
  run.outputs = def.reference(attrs, reference_inputs, run.metas);
  EXPECT_EQ(run.outputs.size(), run.metas.size()) << op_type;
  for (size_t i = 0; i < std::min(run.outputs.size(), run.metas.size()); ++i) {
    EXPECT_EQ(run.outputs[i].shape(), run.metas[i].shape) << op_type << " output " << i;
    EXPECT_EQ(run.outputs[i].dtype(), reference_dtype(run.metas[i].dtype)) << op_type << " output " << i;
  }
  return run;
}

// ---------------------------------------------------------------------------------------------------------------
// Extractors (the dtype must match) and comparators (every element compared)

inline std::vector<float> float_values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Float32);
  if (t.dtype() != DType::Float32) return {};
  return {t.data<float>(), t.data<float>() + t.numel()};
}

inline std::vector<int64_t> int_values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Int64);
  if (t.dtype() != DType::Int64) return {};
  return {t.data<int64_t>(), t.data<int64_t>() + t.numel()};
}

inline std::vector<uint8_t> bool_values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Bool);
  if (t.dtype() != DType::Bool) return {};
  return {t.data<uint8_t>(), t.data<uint8_t>() + t.numel()};
}

// Elements of any dtype against `expected`: within `tolerance`, relative above magnitude 1 and absolute below;
// NaN and infinities must match exactly.
inline void expect_values(const Tensor& actual, const std::vector<double>& expected, double tolerance = 1e-6) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    const double value = actual.element_as_double(static_cast<int64_t>(i));
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(value)) << "element " << i << " is " << value;
    } else if (std::isinf(expected[i])) {
      EXPECT_EQ(value, expected[i]) << "element " << i;
    } else {
      EXPECT_NEAR(value, expected[i], tolerance * std::max(1.0, std::abs(expected[i]))) << "element " << i;
    }
  }
}

// Expected values computed in float (a template, so that brace lists pick the overload above).
template <typename T>
requires std::is_same_v<T, float>
void expect_values(const Tensor& actual, const std::vector<T>& expected, double tolerance = 1e-6) {
  expect_values(actual, std::vector<double>(expected.begin(), expected.end()), tolerance);
}

inline void expect_floats(const Tensor& t, const std::vector<double>& expected, double tolerance = 1e-6) {
  ASSERT_EQ(t.dtype(), DType::Float32);
  expect_values(t, expected, tolerance);
}

inline void expect_ints(const Tensor& t, const std::vector<int64_t>& expected) {
  ASSERT_EQ(t.dtype(), DType::Int64);
  ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(t.data<int64_t>()[i], expected[i]) << "element " << i;
}

inline void expect_bools(const Tensor& t, const std::vector<uint8_t>& expected) {
  ASSERT_EQ(t.dtype(), DType::Bool);
  ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(t.data<uint8_t>()[i], expected[i]) << "element " << i;
}

}  // namespace npusim::test
