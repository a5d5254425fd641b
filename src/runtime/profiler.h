#pragma once
// What one profiled run did: every kernel, partition and transfer with its time and bytes; the `--profile`
// table and a Chrome/Perfetto trace (`--trace FILE.json`, open it in ui.perfetto.dev or chrome://tracing).
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/memory_plan.h"
#include "npusim/graph.h"

namespace npusim {

// Times are microseconds from the start of the run. Backends report how long each kernel took, not when it
// started: a kernel's start is its partition's start plus the durations of the kernels before it.
struct KernelRecord {
  std::string node;
  std::string op;
  int32_t partition = 0;
  double start_us = 0.0;
  double duration_us = 0.0;
  int64_t bytes = 0;   // read and written, as stored (0 for views, which move nothing)
  double flops = 0.0;  // 0 where not estimated
};

struct TransferRecord {
  std::string value;
  int32_t from_partition = 0;
  int32_t to_partition = 0;
  int64_t bytes = 0;
  double start_us = 0.0;
  double duration_us = 0.0;
};

struct PartitionRecord {
  std::string label;  // "npu-lite (cpu)", "fallback (cpu)"
  std::string backend;
  double start_us = 0.0;
  double duration_us = 0.0;
  size_t kernels = 0;
};

struct RunProfile {
  std::vector<PartitionRecord> partitions;  // by partition index
  std::vector<KernelRecord> kernels;        // in execution order
  std::vector<TransferRecord> transfers;    // in execution order
  double total_us = 0.0;
};

// Two profiles of the same program with each kernel's, partition's and transfer's shorter duration and the shorter
// total (starts stay the first profile's): what every kernel takes at best over several runs. Fails when the two
// profiles are not of the same program's kernels.
RunProfile fastest_of(const RunProfile& a, const RunProfile& b);

// Bytes a kernel reads and writes: every input and output as the program stores it; 0 for a node whose output
// is planned as a view (no kernel copies anything).
int64_t kernel_bytes(const Graph& graph, const Node& node, const compiler::MemoryPlan& plan, DType compute_dtype);
// Multiply-adds counted as 2 FLOPs for matrix products, convolutions and attention; 0 for other ops.
double kernel_flops(const Graph& graph, const Node& node);

// Per kernel (by op: calls, total and mean time, share, bytes moved, GB/s, GFLOP/s), per partition and per
// transfer.
std::string format_profile(const RunProfile& profile);
// Chrome trace event format: a complete ("X") event per partition, kernel and transfer, one track per partition
// and one for the transfers, ts and dur in microseconds.
std::string chrome_trace(const RunProfile& profile);
void write_chrome_trace(const std::string& path, const RunProfile& profile);

}  // namespace npusim
