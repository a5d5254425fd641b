#include "compiler/partition.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <queue>

#include "compiler/memory_plan.h"

namespace npusim::compiler {

namespace {

constexpr size_t kSides = 2;

size_t side_index(Side side) { return static_cast<size_t>(side); }

// For each node, the nodes that read one of its outputs (deduplicated), and how many distinct nodes it reads.
struct Dependencies {
  std::vector<std::vector<int32_t>> successors;
  std::vector<int32_t> predecessor_count;
};

std::vector<int32_t> producers_by_value(const Graph& graph) {
  std::vector<int32_t> producer(graph.values.size(), -1);
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (ValueId id : graph.nodes[n].outputs) producer[static_cast<size_t>(id)] = static_cast<int32_t>(n);
  return producer;
}

Dependencies dependencies(const Graph& graph, const std::vector<int32_t>& producer) {
  Dependencies deps;
  deps.successors.resize(graph.nodes.size());
  deps.predecessor_count.assign(graph.nodes.size(), 0);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    std::vector<int32_t> preds;
    for (ValueId id : graph.nodes[n].inputs)
      if (const int32_t p = producer[static_cast<size_t>(id)]; p >= 0) preds.push_back(p);
    std::sort(preds.begin(), preds.end());
    preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
    for (int32_t p : preds) {
      if (p >= static_cast<int32_t>(n))
        fail(graph.source + ": node '" + graph.nodes[n].name + "' reads a value produced after it");
      deps.successors[static_cast<size_t>(p)].push_back(static_cast<int32_t>(n));
    }
    deps.predecessor_count[n] = static_cast<int32_t>(preds.size());
  }
  return deps;
}

struct Group {
  Side side;
  std::vector<int32_t> nodes;
};

// One topological order that stays on the current side while any node of that side is ready, switching only
// when none is; each stretch is one group. Ready nodes are taken in graph order.
std::vector<Group> greedy_groups(const Dependencies& deps, const std::vector<Side>& sides, Side start) {
  using MinHeap = std::priority_queue<int32_t, std::vector<int32_t>, std::greater<int32_t>>;
  std::vector<MinHeap> ready(kSides);
  std::vector<int32_t> waiting = deps.predecessor_count;
  for (size_t n = 0; n < sides.size(); ++n)
    if (waiting[n] == 0) ready[side_index(sides[n])].push(static_cast<int32_t>(n));
  std::vector<Group> groups;
  Side current = start;
  for (size_t done = 0; done < sides.size(); ++done) {
    if (ready[side_index(current)].empty()) current = current == Side::Target ? Side::Fallback : Side::Target;
    if (groups.empty() || groups.back().side != current) groups.push_back({current, {}});
    const int32_t node = ready[side_index(current)].top();
    ready[side_index(current)].pop();
    groups.back().nodes.push_back(node);
    for (int32_t next : deps.successors[static_cast<size_t>(node)])
      if (--waiting[static_cast<size_t>(next)] == 0) ready[side_index(sides[static_cast<size_t>(next)])].push(next);
  }
  for (Group& group : groups) std::sort(group.nodes.begin(), group.nodes.end());
  return groups;
}

template <typename T>
void push_unique(std::vector<T>& list, T item) {
  if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
}

// Inputs, outputs and transfers of the partitions, from which partition produces each value.
void connect(const Graph& graph, DType compute_dtype, PartitionPlan& plan) {
  const std::vector<int32_t> producer = producers_by_value(graph);
  auto partition_of_value = [&](ValueId id) {
    const int32_t node = producer[static_cast<size_t>(id)];
    return node < 0 ? -1 : plan.partition_of_node[static_cast<size_t>(node)];
  };
  std::vector<std::vector<bool>> on_side(kSides, std::vector<bool>(graph.values.size(), false));
  for (size_t p = 0; p < plan.partitions.size(); ++p) {
    Partition& partition = plan.partitions[p];
    for (int32_t n : partition.nodes) {
      for (ValueId id : graph.nodes[static_cast<size_t>(n)].inputs) {
        const Value& value = graph.value(id);
        if (value.kind == ValueKind::Weight) continue;  // bound to every partition that reads it, at load
        const int32_t from = partition_of_value(id);
        if (from == static_cast<int32_t>(p)) continue;
        push_unique(partition.inputs, id);
        if (from < 0) continue;  // a graph input
        push_unique(plan.partitions[static_cast<size_t>(from)].outputs, id);
        const Side from_side = plan.partitions[static_cast<size_t>(from)].side;
        if (from_side == partition.side || on_side[side_index(partition.side)][static_cast<size_t>(id)]) continue;
        on_side[side_index(partition.side)][static_cast<size_t>(id)] = true;
        plan.transfers.push_back(
            {id, from, static_cast<int32_t>(p), partition.side, storage_bytes(value.meta, compute_dtype)});
      }
    }
  }
  for (ValueId id : graph.outputs)
    if (const int32_t from = partition_of_value(id); from >= 0)
      push_unique(plan.partitions[static_cast<size_t>(from)].outputs, id);
}

std::string describe_bytes(int64_t bytes) {
  char text[32];
  if (bytes < 10 * 1024)
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  else if (bytes < 10 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  else
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

std::string value_list(const Graph& graph, const std::vector<ValueId>& ids, size_t limit) {
  std::string text;
  for (size_t i = 0; i < ids.size() && i < limit; ++i) text += (i ? ", " : "") + graph.value(ids[i]).name;
  if (ids.size() > limit) text += ", ... (" + std::to_string(ids.size() - limit) + " more)";
  return text;
}

}  // namespace

std::string side_name(Side side) { return side == Side::Target ? "target" : "fallback"; }

int64_t PartitionPlan::transfer_bytes() const {
  int64_t total = 0;
  for (const Transfer& transfer : transfers) total += transfer.bytes;
  return total;
}

size_t PartitionPlan::fallback_nodes() const {
  size_t count = 0;
  for (const Partition& partition : partitions)
    if (partition.side == Side::Fallback) count += partition.nodes.size();
  return count;
}

std::string PartitionPlan::label(const Partition& partition) const {
  return (partition.side == Side::Target ? target : std::string("fallback")) + " (" + partition.backend + ")";
}

std::vector<NodePlacement> place_nodes(const Graph& graph, const Target& target, DType compute_dtype,
                                       const BackendCoverage& target_coverage,
                                       const BackendCoverage* fallback_coverage) {
  std::vector<NodePlacement> placements;
  placements.reserve(graph.nodes.size());
  for (const Node& node : graph.nodes) {
    NodePlacement placement;
    if (!node.def) {
      placement.reason = "op is unknown to npusim";
      placements.push_back(placement);
      continue;
    }
    if (!target.supports_op(node.op))
      placement.reason = "target '" + target.name + "' does not list op '" + node.op + "'";
    else if (auto reason = target_coverage.unsupported_reason(graph, node, compute_dtype))
      placement.reason = *reason;
    if (placement.reason.empty()) {
      placement.side = Side::Target;
    } else if (!fallback_coverage) {
      placement.reason += "; the target has no fallback";
    } else if (auto reason = fallback_coverage->unsupported_reason(graph, node, compute_dtype)) {
      placement.reason += "; fallback: " + *reason;
    } else {
      placement.side = Side::Fallback;
    }
    placements.push_back(placement);
  }
  return placements;
}

std::vector<NodePlacement> place_nodes(const Graph& graph, const Target& target, DType compute_dtype) {
  const BackendCoverage on_target = backend_coverage(target.backend);
  if (target.fallback.empty()) return place_nodes(graph, target, compute_dtype, on_target, nullptr);
  const BackendCoverage fallback = backend_coverage(target.fallback);
  return place_nodes(graph, target, compute_dtype, on_target, &fallback);
}

PartitionPlan partition_graph(const Graph& graph, const Target& target, DType compute_dtype,
                              const std::vector<NodePlacement>& placements) {
  if (placements.size() != graph.nodes.size())
    fail(graph.source + ": " + std::to_string(placements.size()) + " placements for " +
         std::to_string(graph.nodes.size()) + " nodes");
  std::string unplaced;
  std::vector<Side> sides;
  for (size_t n = 0; n < placements.size(); ++n) {
    if (placements[n].side) {
      sides.push_back(*placements[n].side);
      continue;
    }
    const Node& node = graph.nodes[n];
    unplaced += "\n  node '" + node.name + "' (" + (node.def ? node.op : node.source_op) + "): " + placements[n].reason;
  }
  if (!unplaced.empty()) fail(graph.source + ": no backend of target '" + target.name + "' can run:" + unplaced);

  const Dependencies deps = dependencies(graph, producers_by_value(graph));
  std::vector<Group> best;
  for (Side start : {Side::Target, Side::Fallback}) {
    const bool has_start = std::any_of(sides.begin(), sides.end(), [&](Side side) { return side == start; });
    if (!has_start) continue;
    std::vector<Group> groups = greedy_groups(deps, sides, start);
    if (best.empty() || groups.size() < best.size()) best = std::move(groups);
  }

  PartitionPlan plan;
  plan.target = target.name;
  plan.backend = target.backend;
  plan.fallback = target.fallback;
  plan.partition_of_node.assign(graph.nodes.size(), -1);
  for (Group& group : best) {
    Partition partition;
    partition.side = group.side;
    partition.backend = group.side == Side::Target ? target.backend : target.fallback;
    partition.nodes = std::move(group.nodes);
    for (int32_t n : partition.nodes)
      plan.partition_of_node[static_cast<size_t>(n)] = static_cast<int32_t>(plan.partitions.size());
    plan.partitions.push_back(std::move(partition));
  }
  connect(graph, compute_dtype, plan);
  return plan;
}

PartitionPlan partition_graph(const Graph& graph, const Target& target, DType compute_dtype) {
  return partition_graph(graph, target, compute_dtype, place_nodes(graph, target, compute_dtype));
}

std::string format_partitions(const Graph& graph, const PartitionPlan& plan) {
  std::map<Side, size_t> per_side;
  for (const Partition& partition : plan.partitions) ++per_side[partition.side];
  std::string text =
      "partitions: " + std::to_string(plan.partitions.size()) + " (" + std::to_string(per_side[Side::Target]) + " on " +
      plan.target + ", " + std::to_string(per_side[Side::Fallback]) + " on the fallback" +
      (plan.fallback.empty() ? "" : " " + plan.fallback) + "), " + std::to_string(plan.transfers.size()) +
      " transfers of " + describe_bytes(plan.transfer_bytes()) + "\n";
  for (size_t p = 0; p < plan.partitions.size(); ++p) {
    const Partition& partition = plan.partitions[p];
    std::map<std::string, int> ops;
    for (int32_t n : partition.nodes) ++ops[graph.nodes[static_cast<size_t>(n)].op];
    std::string op_counts;
    for (const auto& [op, count] : ops)
      op_counts += (op_counts.empty() ? "" : ", ") + op + " x" + std::to_string(count);
    text += "  #" + std::to_string(p) + " " + plan.label(partition) + ": " + std::to_string(partition.nodes.size()) +
            (partition.nodes.size() == 1 ? " op: " : " ops: ") + op_counts + "\n";
    if (partition.side == Side::Fallback) {
      std::string names;
      for (int32_t n : partition.nodes) names += (names.empty() ? "" : ", ") + graph.nodes[static_cast<size_t>(n)].name;
      text += "      nodes: " + names + "\n";
    }
    if (!partition.inputs.empty()) text += "      reads: " + value_list(graph, partition.inputs, 8) + "\n";
    if (!partition.outputs.empty()) text += "      writes: " + value_list(graph, partition.outputs, 8) + "\n";
  }
  if (!plan.transfers.empty()) text += "transfers:\n";
  for (const Transfer& transfer : plan.transfers) {
    const Value& value = graph.value(transfer.value);
    char line[512];
    std::snprintf(line, sizeof line, "  %-24s %s %s  #%d -> #%d (%s)  %s\n", value.name.c_str(),
                  shape_string(value.meta.shape).c_str(), std::string(dtype_name(value.meta.dtype)).c_str(),
                  transfer.from_partition, transfer.before_partition, side_name(transfer.to).c_str(),
                  describe_bytes(transfer.bytes).c_str());
    text += line;
  }
  return text;
}

}  // namespace npusim::compiler
