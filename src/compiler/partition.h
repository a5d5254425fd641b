#pragma once
// Splits a compiled graph between a target's backend and its fallback: every node goes where it can run (the
// target when it lists the op and its backend covers the node, else the fallback), then nodes of one side are
// grouped into maximal convex partitions that run one after the other. Values that cross from one side to the
// other get an explicit transfer; values that stay on one side do not.
#include <optional>
#include <string>
#include <vector>

#include "compiler/target.h"
#include "npusim/graph.h"
#include "runtime/coverage.h"

namespace npusim::compiler {

enum class Side : uint8_t { Target, Fallback };

// Where one node runs, and why it is not on the target.
struct NodePlacement {
  std::optional<Side> side;  // none: neither the target nor its fallback can run the node
  std::string reason;        // why not on the target (empty when it is)
};

struct Partition {
  Side side = Side::Target;
  std::string backend;           // runtime backend that runs it
  std::vector<int32_t> nodes;    // node indices, in graph order
  std::vector<ValueId> inputs;   // graph inputs and other partitions' values it reads, in first-use order
  std::vector<ValueId> outputs;  // its values that later partitions or the graph outputs read
};

// A value copied from one side to the other, right before `before_partition` (its first reader there) runs.
struct Transfer {
  ValueId value = kNoValue;
  int32_t from_partition = 0;  // producer
  int32_t before_partition = 0;
  Side to = Side::Fallback;
  int64_t bytes = 0;  // as stored: floats in the compute dtype, integers and bools in their own dtype
};

struct PartitionPlan {
  std::string target;                 // target name
  std::string backend;                // the target's backend
  std::string fallback;               // fallback backend ("" for none)
  std::vector<Partition> partitions;  // in execution order; every edge goes from an earlier partition to a later one
  std::vector<Transfer> transfers;    // in execution order
  std::vector<int32_t> partition_of_node;  // by node index

  int64_t transfer_bytes() const;
  size_t fallback_nodes() const;
  // "npu-lite (cpu)" or "fallback (cpu)".
  std::string label(const Partition& partition) const;
};

// Where each node of `graph` runs. The coverages are those of the target's backend and of its fallback (null
// for no fallback).
std::vector<NodePlacement> place_nodes(const Graph& graph, const Target& target, DType compute_dtype,
                                       const BackendCoverage& target_coverage,
                                       const BackendCoverage* fallback_coverage);
std::vector<NodePlacement> place_nodes(const Graph& graph, const Target& target, DType compute_dtype);

// Groups placed nodes into the fewest partitions that are each convex and ordered without cycles: greedy over a
// topological order, extending the current side while any node of it is ready, tried from each starting side.
// Fails naming the nodes that have no side.
PartitionPlan partition_graph(const Graph& graph, const Target& target, DType compute_dtype,
                              const std::vector<NodePlacement>& placements);
PartitionPlan partition_graph(const Graph& graph, const Target& target, DType compute_dtype);

// The partitions, the ops in each, their inputs and outputs, and the transfers with their bytes.
std::string format_partitions(const Graph& graph, const PartitionPlan& plan);

std::string side_name(Side side);

}  // namespace npusim::compiler
