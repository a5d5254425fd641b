#pragma once
#include <set>
#include <string>
#include <vector>

#include "npusim/graph.h"

namespace npusim::compiler {

// What a target can run, as data: built-in descriptions are JSON text in target.cpp, and a user's own is a
// JSON file with the same fields (`--target FILE.json`).
struct Target {
  std::string name;
  std::string backend = "cpu";   // the runtime backend that executes it
  int64_t alignment = 64;        // bytes, for buffer offsets
  int max_rank = 8;
  std::vector<DType> compute_dtypes = {DType::Float32, DType::Float16, DType::BFloat16};
  bool all_ops = true;           // "ops": "*" — every op in the registry
  std::set<std::string> ops;     // canonical op names otherwise
  int64_t memory_bytes = 0;      // 0: no limit
  std::string fallback = "cpu";  // where ops the target lacks run; "" for none

  bool supports_op(const std::string& op) const { return all_ops || ops.count(op) != 0; }
};

Target parse_target(const std::string& json_text, const std::string& source);
// A built-in name ("cpu") or a path to a JSON file.
Target load_target(const std::string& name_or_path);
std::vector<std::string> builtin_target_names();

struct Violation {
  std::string node;  // empty for whole-program violations
  std::string op;
  std::string reason;
  bool fallback_possible = false;  // an unsupported op the fallback can run
};

// Every violation, each with the node and the reason, before anything runs.
std::vector<Violation> check_target(const Graph& graph, const Target& target, DType compute_dtype,
                                    int64_t planned_bytes);

}  // namespace npusim::compiler
