#pragma once
// The backend conformance harness, after ggml's test-backend-ops: a case is one op with its operands and attributes,
// built into a one-node graph with deterministic values, run on a backend with fp32, fp16 and bf16 storage
// (activation memory poisoned first) and compared element by element with the registry's reference
// implementation. Each backend's test keeps its own case lists; tests/unit/test_conformance.cpp is the CPU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/graph_edit.h"
#include "compiler/memory_plan.h"
#include "npusim/dtype.h"
#include "npusim/error.h"
#include "npusim/graph.h"
#include "npusim/op_registry.h"
#include "npusim/tensor.h"
#include "program/program.h"
#include "runtime/backend.h"
#include "runtime/random_fill.h"
#include "runtime/reference_executor.h"
#include "runtime/weight_transforms.h"

namespace npusim::test {

inline const std::string kFixtures = std::string(NPUSIM_TEST_DATA) + "/fixtures";

// ---------------------------------------------------------------------------------------------------------------
// Cases

enum class Fill { Normal, Positive, Integers, Bools };

struct Operand {
  Shape shape;
  DType dtype = DType::Float32;
  bool weight = false;
  Fill fill = Fill::Normal;
  int64_t low = 0, high = 0;  // integers in [low, high)
};

inline Operand f(Shape shape) { return {std::move(shape)}; }
inline Operand positive(Shape shape) { return {std::move(shape), DType::Float32, false, Fill::Positive}; }
inline Operand w(Shape shape) { return {std::move(shape), DType::Float32, true}; }
inline Operand ints(Shape shape, int64_t low, int64_t high) {
  return {std::move(shape), DType::Int64, false, Fill::Integers, low, high};
}
inline Operand bools(Shape shape) { return {std::move(shape), DType::Bool, false, Fill::Bools}; }

struct Case {
  std::string op;
  std::vector<Operand> inputs;
  Attrs attrs;
  bool kernel = true;  // false: the op is expected to run on the reference fallback
  std::string label;
};

inline AttrValue I(int64_t v) { return AttrValue{v}; }
inline AttrValue F(double v) { return AttrValue{v}; }
inline AttrValue B(bool v) { return AttrValue{v}; }
inline AttrValue S(const char* v) { return AttrValue{std::string(v)}; }
inline AttrValue L(std::vector<int64_t> v) { return AttrValue{std::move(v)}; }
inline AttrValue FL(std::vector<double> v) { return AttrValue{std::move(v)}; }

inline Attrs attrs(std::initializer_list<std::pair<const char*, AttrValue>> values) {
  Attrs result;
  for (const auto& [name, value] : values) result.set(name, value);
  return result;
}

inline Case make(std::string op, std::vector<Operand> inputs, Attrs a = {}, std::string label = "") {
  return Case{std::move(op), std::move(inputs), std::move(a), true, std::move(label)};
}

inline Case fallback(Case c) {
  c.kernel = false;
  return c;
}

inline std::string case_name(const Case& c) { return c.op + (c.label.empty() ? "" : " (" + c.label + ")"); }

// ---------------------------------------------------------------------------------------------------------------
// Running a case

// Deterministic test values; floats rounded to what `storage` can hold exactly.
inline Tensor make_values(const Operand& operand, uint64_t seed, DType storage) {
  Tensor t(operand.dtype, operand.shape);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double unit = static_cast<double>(next() % 1000003) / 1000003.0;  // [0, 1)
    switch (operand.fill) {
      case Fill::Normal:
      case Fill::Positive: {
        float value =
            operand.fill == Fill::Normal ? static_cast<float>(unit * 4.0 - 2.0) : static_cast<float>(0.1 + unit * 2.0);
        if (storage == DType::BFloat16) value = bf16_to_float(float_to_bf16(value));
        if (storage == DType::Float16) value = fp16_to_float(float_to_fp16(value));
        t.mutable_data<float>()[i] = value;
        break;
      }
      case Fill::Integers:
        t.mutable_data<int64_t>()[i] =
            operand.low + static_cast<int64_t>(next() % static_cast<uint64_t>(operand.high - operand.low));
        break;
      case Fill::Bools:
        t.mutable_data<uint8_t>()[i] = (next() % 3) != 0;
        break;
    }
  }
  return t;
}

struct Built {
  Graph graph;
  std::map<std::string, Tensor> inputs;
  std::vector<std::pair<ValueId, Tensor>> weights;
};

// Adds `operand` to the graph as a weight or a graph input named `name`, with values from `seed`.
inline ValueId add_operand(Built& b, const std::string& name, const Operand& operand, uint64_t seed, DType storage) {
  const Tensor values = make_values(operand, seed, storage);
  const ValueId id = compiler::add_value(b.graph, name, TensorMeta{operand.shape, operand.dtype},
                                         operand.weight ? ValueKind::Weight : ValueKind::GraphInput);
  if (operand.weight) {
    b.graph.value(id).weight_key = name;
    b.graph.weights.push_back(id);
    b.weights.emplace_back(id, values);
  } else {
    b.graph.inputs.push_back(id);
    b.inputs[name] = values;
  }
  return id;
}

inline Built build(const Case& c, DType storage) {
  Built b;
  b.graph.source = "conformance " + case_name(c);
  std::vector<ValueId> inputs;
  std::vector<TensorMeta> metas;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    inputs.push_back(add_operand(b, "in" + std::to_string(i), c.inputs[i], i + 1, storage));
    metas.push_back(TensorMeta{c.inputs[i].shape, c.inputs[i].dtype});
  }
  const OpDef* def = OpRegistry::instance().find(c.op);
  if (!def) throw Error("unknown op " + c.op);
  Attrs a = c.attrs;
  OpRegistry::instance().normalize_attrs(*def, nullptr, a, b.graph.source);
  const std::vector<TensorMeta> outputs = def->infer(a, metas);
  std::vector<std::string> names;
  for (size_t i = 0; i < outputs.size(); ++i) names.push_back("out" + std::to_string(i));
  Node node = compiler::make_node(b.graph, c.op, "node", a, inputs, outputs, names);
  b.graph.outputs = node.outputs;
  b.graph.nodes.push_back(std::move(node));
  compiler::renumber_producers(b.graph);
  return b;
}

inline Program program_for(Graph graph, DType storage) {
  Program program;
  program.compute_dtype = storage;
  program.plan = compiler::plan_memory(graph, storage);
  program.graph = std::move(graph);
  return program;
}

inline double tolerance(DType storage) {
  switch (storage) {
    case DType::BFloat16:
      return 8e-3;
    case DType::Float16:
      return 1e-3;
    default:
      return 2e-5;
  }
}

// Every element: integers and bools exactly, floats within rtol * (|expected| + max |expected|), NaN where
// the reference has NaN; rtol is the storage's tolerance for one op, times `ops` for a chain of them (each rounds its
// output to the storage).
inline void expect_matches(const Tensor& actual, const Tensor& expected, DType storage, const std::string& what,
                           int ops = 1) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  if (expected.dtype() != DType::Float32) {
    for (int64_t i = 0; i < expected.numel(); ++i)
      ASSERT_EQ(actual.element_as_double(i), expected.element_as_double(i)) << what << " element " << i;
    return;
  }
  const float* a = actual.data<float>();
  const float* e = expected.data<float>();
  double scale = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i)
    if (std::isfinite(e[i])) scale = std::max(scale, static_cast<double>(std::fabs(e[i])));
  const double rtol = tolerance(storage) * ops;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    if (std::isnan(e[i])) {
      ASSERT_TRUE(std::isnan(a[i])) << what << " element " << i << ": " << a[i] << ", expected NaN";
      continue;
    }
    if (std::isinf(e[i])) {
      ASSERT_EQ(a[i], e[i]) << what << " element " << i;
      continue;
    }
    ASSERT_LE(std::fabs(a[i] - e[i]), rtol * (std::fabs(e[i]) + scale) + 1e-30)
        << what << " element " << i << ": " << a[i] << ", expected " << e[i];
  }
}

// What a backend checks on its own after a case's two runs (e.g. that the CUDA backend replays a captured graph).
using PreparedCheck = std::function<void(const Case& c, const PreparedProgram& prepared, const std::string& what)>;

// The case with each storage dtype on `backend`, against the reference executor: a kernel case must not touch the
// fallback, a fallback case must run its one node there, and both runs (the second sees the first one's leftovers)
// must match.
inline void run_case(const Case& c, Backend& backend, const PreparedCheck& check_prepared = {}) {
  for (const DType storage : {DType::Float32, DType::Float16, DType::BFloat16}) {
    const std::string what = case_name(c) + " " + std::string(dtype_name(storage));
    SCOPED_TRACE(what);
    Built b = build(c, storage);
    const NamedTensors expected = ReferenceExecutor(b.graph, b.weights).run(b.inputs);
    const auto prepared = backend.prepare(program_for(b.graph, storage), b.weights);
    if (c.kernel)
      EXPECT_TRUE(prepared->fallback_nodes().empty()) << what << " ran on the fallback";
    else
      EXPECT_EQ(prepared->fallback_nodes().size(), 1u) << what << " was expected on the fallback";
    for (int run = 0; run < 2; ++run) {
      const NamedTensors actual = prepared->run(b.inputs);
      ASSERT_EQ(actual.size(), expected.size());
      for (size_t i = 0; i < actual.size(); ++i) {
        EXPECT_EQ(actual[i].first, expected[i].first);
        expect_matches(actual[i].second, expected[i].second, storage,
                       what + " run " + std::to_string(run) + " output " + std::to_string(i));
      }
    }
    if (check_prepared) check_prepared(c, *prepared, what);
  }
}

// The ops of the kernel cases (not the fallback ones) in `case_lists`.
inline std::set<std::string> ops_with_a_kernel_case(std::initializer_list<std::vector<Case>> case_lists) {
  std::set<std::string> covered;
  for (const std::vector<Case>& cases : case_lists)
    for (const Case& c : cases)
      if (c.kernel) covered.insert(c.op);
  return covered;
}

// ---------------------------------------------------------------------------------------------------------------
// Whole models

// Random values (seed 7) for the weights of a graph as read, leaving out its constants and derived weights.
inline std::vector<std::pair<ValueId, Tensor>> random_weights(const Graph& graph) {
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (ValueId id : graph.weights) {
    const Value& value = graph.value(id);
    if (!value.transform && !graph.constants.count(value.weight_key)) weights.emplace_back(id, random_weight(value, 7));
  }
  return weights;
}

// Weights for the compiled graph: the uncompiled graph's (same ValueIds), plus what the passes derived or folded.
inline std::vector<std::pair<ValueId, Tensor>> compiled_weights(
    const Graph& compiled, const std::vector<std::pair<ValueId, Tensor>>& original) {
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (const auto& [id, tensor] : original)
    if (static_cast<size_t>(id) < compiled.values.size() && compiled.value(id).kind == ValueKind::Weight)
      weights.emplace_back(id, tensor);
  add_derived_weights(compiled, weights);
  return weights;
}

}  // namespace npusim::test
