#pragma once
#include <set>
#include <string>
#include <vector>

#include "compiler/partition.h"
#include "compiler/target.h"
#include "program/program.h"

namespace npusim::compiler {

struct CompileOptions {
  std::string target = "cpu";  // built-in name or target JSON file
  DType compute_dtype = DType::Float32;
  std::set<std::string> disabled_passes;  // names, or "fusions"
  bool allow_fallback = true;             // false: an op the target lacks is a compile error
};

struct CompileReport {
  size_t nodes_before = 0;
  size_t nodes_after = 0;
  std::vector<std::string> pass_log;
  std::vector<Violation> violations;
  PartitionPlan partitions;  // what runs where, and the transfers between
  double milliseconds = 0.0;
};

// Passes, target constraints, memory plan, partitions. Fails listing every violation (node and reason) that
// cannot run; ops the target cannot run are reported as fallbacks when the target has one, and are errors that
// list those ops when `allow_fallback` is off.
Program compile_graph(Graph graph, const CompileOptions& options, CompileReport* report = nullptr);

// The coverage report users ask for: op counts, which backend runs each op, the fallbacks, the partitions with
// their ops and the transfers with their bytes, memory totals.
std::string format_report(const Program& program, const CompileReport& report, const Target& target);

}  // namespace npusim::compiler
