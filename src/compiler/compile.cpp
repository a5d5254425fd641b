#include "compiler/compile.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "compiler/pass.h"

namespace npusim::compiler {

Program compile_graph(Graph graph, const CompileOptions& options, CompileReport* report) {
  const auto start = std::chrono::steady_clock::now();
  if (!is_floating(options.compute_dtype))
    fail("compute dtype must be float32, float16 or bfloat16, got " + std::string(dtype_name(options.compute_dtype)));
  const Target target = load_target(options.target);
  CompileReport local;
  CompileReport& out = report ? *report : local;
  out.nodes_before = graph.nodes.size();

  PassContext context;
  run_passes(graph, PassOptions{options.disabled_passes, true}, context);

  Program program;
  program.target = target.name;
  program.compute_dtype = options.compute_dtype;
  program.disabled_passes.assign(options.disabled_passes.begin(), options.disabled_passes.end());
  program.pass_log = context.log;
  program.plan = plan_memory(graph, options.compute_dtype, target.alignment);
  program.graph = std::move(graph);

  out.nodes_after = program.graph.nodes.size();
  out.pass_log = context.log;
  out.violations = check_target(program.graph, target, options.compute_dtype,
                                program.plan.arena_bytes + program.plan.persistent_bytes);
  std::string errors;
  for (const Violation& v : out.violations) {
    if (v.fallback_possible && options.allow_fallback) continue;
    errors += "\n  " + (v.node.empty() ? std::string("program") : "node '" + v.node + "' (" + v.op + ")") + ": " +
              v.reason;
  }
  if (!errors.empty()) fail(program.graph.source + ": cannot compile for target '" + target.name + "':" + errors);
  out.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return program;
}

std::string format_report(const Program& program, const CompileReport& report, const Target& target) {
  std::map<std::string, int> counts, fallback_counts;
  std::map<std::string, std::string> fallback_nodes;
  for (const Node& node : program.graph.nodes) {
    ++counts[node.op];
    if (!target.supports_op(node.op)) {
      ++fallback_counts[node.op];
      fallback_nodes[node.op] += (fallback_nodes[node.op].empty() ? "" : ", ") + node.name;
    }
  }
  std::string text;
  char line[512];
  std::snprintf(line, sizeof line, "compiled %s for target '%s' (%s): %zu nodes -> %zu kernels in %.1f ms\n",
                program.graph.source.c_str(), target.name.c_str(), std::string(dtype_name(program.compute_dtype)).c_str(),
                report.nodes_before, report.nodes_after, report.milliseconds);
  text += line;
  for (const std::string& entry : report.pass_log) text += "  pass " + entry + "\n";
  text += "ops:\n";
  for (const auto& [op, count] : counts) {
    const bool fallback = fallback_counts.count(op) != 0;
    std::snprintf(line, sizeof line, "  %-28s %5d  on %s\n", op.c_str(), count,
                  fallback ? ("FALLBACK " + target.fallback).c_str() : target.backend.c_str());
    text += line;
  }
  if (!fallback_nodes.empty()) {
    text += "fallbacks:\n";
    for (const auto& [op, nodes] : fallback_nodes) text += "  " + op + ": " + nodes + "\n";
  }
  for (const Violation& v : report.violations)
    if (!v.fallback_possible) text += "violation: " + (v.node.empty() ? "" : v.node + ": ") + v.reason + "\n";
  std::snprintf(line, sizeof line, "memory: arena %.2f MB planned (%.2f MB without reuse), persistent %.2f MB\n",
                program.plan.arena_bytes / 1e6, program.plan.unplanned_bytes / 1e6,
                program.plan.persistent_bytes / 1e6);
  text += line;
  return text;
}

}  // namespace npusim::compiler
