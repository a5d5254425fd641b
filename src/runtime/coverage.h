#pragma once
// What each backend can run, as data: the canonical ops, the dtypes of the values they touch and the attribute
// ranges. The partitioner asks it "can this backend run this node"; `npusim ops` prints it and docs/ops.md is
// generated from it.
//
// A coverage is declared as JSON:
//   {"backend": "cpu",
//    "compute_dtypes": ["float32", "float16", "bfloat16"],  // storage of floating activations it accepts
//    "dtypes": ["float32", "int64", "bool"],                  // stored value dtypes it accepts; "*" (default) all
//    "ops": "*"                                               // every registry op, or a list of entries:
//           | ["relu", {"op": "softmax", "dtypes": ["float32"], "attrs": {"dim": {"min": -1, "max": -1}}}]}
// An attribute range bounds an int or float attribute, and every element of an int or float list attribute;
// both ends are inclusive and either may be absent. An attribute the node lacks is not constrained.
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/target.h"
#include "npusim/graph.h"

namespace npusim {

struct BackendCapabilities;

struct AttrRange {
  std::string name;
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();

  std::string describe() const;  // "dim in [-1, -1]", "groups >= 1"
};

struct OpCoverage {
  std::string op;
  bool kernel = false;           // a dedicated kernel; false: the backend's generic kernel runs it
  std::vector<DType> dtypes;     // stored dtypes of its inputs and outputs; empty: the backend's `dtypes`
  std::vector<AttrRange> attrs;  // limits on attribute values
};

struct BackendCoverage {
  std::string backend;
  std::vector<DType> compute_dtypes;
  std::vector<DType> dtypes;              // empty: every dtype
  std::map<std::string, OpCoverage> ops;  // by canonical op name

  const OpCoverage* find(const std::string& op) const;
  // Why the backend cannot run `node` of `graph` in a program whose floats are stored as `compute_dtype`, or
  // nothing when it can.
  std::optional<std::string> unsupported_reason(const Graph& graph, const Node& node, DType compute_dtype) const;
  bool supports_compute_dtype(DType compute_dtype) const;
};

BackendCoverage parse_coverage(const std::string& json_text, const std::string& source);

// Declared here: "cpu" (every registry op: its kernels, and the generic kernel that runs the registry's reference
// for the rest) and "reference" (the registry's reference implementations, fp32 storage only). Any other backend
// that make_backend knows covers what its capabilities say (its kernels, every registry op when it has the
// reference fallback), without dtype or attribute limits until it declares them here.
BackendCoverage backend_coverage(const std::string& backend);
BackendCoverage coverage_from_capabilities(const BackendCapabilities& capabilities);
std::vector<std::string> coverage_backend_names();
// The coverage of every built-in backend, in coverage_backend_names() order.
std::vector<BackendCoverage> builtin_coverages();

// The table `npusim ops` prints: a row per registry op, a column per backend ("kernel": a dedicated kernel,
// "generic": the backend's generic kernel), and with a target, where the target runs each op.
std::string format_coverage_table(const std::vector<BackendCoverage>& backends,
                                  const compiler::Target* target = nullptr);
// docs/ops.md: the same, as Markdown, with the ATen spellings of each op.
std::string coverage_markdown(const std::vector<BackendCoverage>& backends);

// How a value of `dtype` is stored by a program whose floating activations use `compute_dtype`.
DType stored_dtype(DType dtype, DType compute_dtype);

}  // namespace npusim
