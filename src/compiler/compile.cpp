#include "compiler/compile.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "compiler/pass.h"

namespace npusim::compiler {

namespace {

// What check_target cannot see: nodes whose op the target lists but whose dtypes or attributes its backend does
// not cover (they fall back), and nodes that the fallback cannot run either.
void add_placement_violations(const Graph& graph, const Target& target, const std::vector<NodePlacement>& placements,
                              std::vector<Violation>& violations) {
  std::map<std::string, size_t> listed;  // node -> its "op not supported by the target" violation
  for (size_t i = 0; i < violations.size(); ++i)
    if (!violations[i].node.empty() && !target.supports_op(violations[i].op)) listed[violations[i].node] = i;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    const NodePlacement& placement = placements[n];
    if (!node.def || placement.side == Side::Target) continue;
    if (auto it = listed.find(node.name); it != listed.end()) {
      if (!placement.side) {
        violations[it->second].fallback_possible = false;
        violations[it->second].reason = placement.reason;
      }
      continue;
    }
    violations.push_back({node.name, node.op, placement.reason, placement.side.has_value()});
  }
}

// `disabled` and the fusions whose fused op the target's backend runs only through its generic kernel (the
// registry's reference on converted copies): that is slower than the ops the fusion replaces, which have kernels.
std::set<std::string> fusions_off_for(const Target& target, std::set<std::string> disabled, PassContext& context) {
  const BackendCoverage coverage = backend_coverage(target.backend);
  for (const Pass& pass : all_passes()) {
    if (!pass.creates || disabled.count(pass.name)) continue;
    const OpCoverage* op = coverage.find(pass.creates);
    if (op && op->kernel) continue;
    disabled.insert(pass.name);
    context.note(pass.name, std::string("off: backend '") + target.backend + "' has no kernel for " + pass.creates);
  }
  return disabled;
}

}  // namespace

Program compile_graph(Graph graph, const CompileOptions& options, CompileReport* report) {
  const auto start = std::chrono::steady_clock::now();
  if (!is_floating(options.compute_dtype))
    fail("compute dtype must be float32, float16 or bfloat16, got " + std::string(dtype_name(options.compute_dtype)));
  const Target target = load_target(options.target);
  CompileReport local;
  CompileReport& out = report ? *report : local;
  out.nodes_before = graph.nodes.size();

  PassContext context;
  run_passes(graph, PassOptions{fusions_off_for(target, options.disabled_passes, context), true}, context);

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
  const std::vector<NodePlacement> placements = place_nodes(program.graph, target, options.compute_dtype);
  add_placement_violations(program.graph, target, placements, out.violations);
  std::string errors;
  std::set<std::string> fallback_ops;
  for (const Violation& v : out.violations) {
    if (v.fallback_possible && options.allow_fallback) continue;
    if (v.fallback_possible) fallback_ops.insert(v.op);
    errors +=
        "\n  " + (v.node.empty() ? std::string("program") : "node '" + v.node + "' (" + v.op + ")") + ": " + v.reason;
  }
  if (!errors.empty()) {
    std::string lacking;
    for (const std::string& op : fallback_ops) lacking += (lacking.empty() ? "" : ", ") + op;
    fail(program.graph.source + ": cannot compile for target '" + target.name + "'" +
         (lacking.empty() ? "" : " without fallback (ops it cannot run: " + lacking + ")") + ":" + errors);
  }
  out.partitions = partition_graph(program.graph, target, options.compute_dtype, placements);
  out.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return program;
}

std::string format_report(const Program& program, const CompileReport& report, const Target& target) {
  std::map<std::string, int> counts, fallback_counts;
  std::map<std::string, std::string> fallback_nodes;
  const PartitionPlan& plan = report.partitions;
  const bool partitioned = plan.partition_of_node.size() == program.graph.nodes.size();
  for (size_t n = 0; n < program.graph.nodes.size(); ++n) {
    const Node& node = program.graph.nodes[n];
    ++counts[node.op];
    const bool on_fallback =
        partitioned ? plan.partitions.at(static_cast<size_t>(plan.partition_of_node[n])).side == Side::Fallback
                    : !target.supports_op(node.op);
    if (on_fallback) {
      ++fallback_counts[node.op];
      fallback_nodes[node.op] += (fallback_nodes[node.op].empty() ? "" : ", ") + node.name;
    }
  }
  std::string text;
  char line[512];
  std::snprintf(line, sizeof line, "compiled %s for target '%s' (%s): %zu nodes -> %zu kernels in %.1f ms\n",
                program.graph.source.c_str(), target.name.c_str(),
                std::string(dtype_name(program.compute_dtype)).c_str(), report.nodes_before, report.nodes_after,
                report.milliseconds);
  text += line;
  for (const std::string& entry : report.pass_log) text += "  pass " + entry + "\n";
  text += "ops:\n";
  for (const auto& [op, count] : counts) {
    const int on_fallback = fallback_counts.count(op) ? fallback_counts.at(op) : 0;
    const std::string where = on_fallback == 0       ? target.backend
                              : on_fallback == count ? "FALLBACK " + target.fallback
                                                     : target.backend + ", " + std::to_string(on_fallback) +
                                                           " on FALLBACK " + target.fallback;
    std::snprintf(line, sizeof line, "  %-28s %5d  on %s\n", op.c_str(), count, where.c_str());
    text += line;
  }
  if (!fallback_nodes.empty()) {
    text += "fallbacks:\n";
    for (const auto& [op, nodes] : fallback_nodes) text += "  " + op + ": " + nodes + "\n";
  }
  for (const Violation& v : report.violations)
    if (!v.fallback_possible) text += "violation: " + (v.node.empty() ? "" : v.node + ": ") + v.reason + "\n";
  if (partitioned) text += format_partitions(program.graph, plan);
  std::snprintf(line, sizeof line, "memory: arena %.2f MB planned (%.2f MB without reuse), persistent %.2f MB\n",
                program.plan.arena_bytes / 1e6, program.plan.unplanned_bytes / 1e6,
                program.plan.persistent_bytes / 1e6);
  text += line;
  return text;
}

}  // namespace npusim::compiler
