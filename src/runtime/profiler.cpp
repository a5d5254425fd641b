#include "runtime/profiler.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "npusim/error.h"
#include "ops/op_util.h"

namespace npusim {

namespace {

// Bytes per microsecond is MB/s; GB/s is bytes / (us * 1e3).
double gigabytes_per_second(double bytes, double microseconds) {
  return microseconds > 0 ? bytes / (microseconds * 1e3) : 0.0;
}

std::string rate_or_dash(double value) {
  if (value <= 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

std::string partition_name(size_t index) {
  char text[32];
  std::snprintf(text, sizeof text, "#%zu", index);
  return text;
}

}  // namespace

int64_t kernel_bytes(const Graph& graph, const Node& node, const compiler::MemoryPlan& plan, DType compute_dtype) {
  for (ValueId id : node.outputs)
    if (static_cast<size_t>(id) < plan.values.size() &&
        plan.values[static_cast<size_t>(id)].placement == compiler::Placement::View)
      return 0;
  int64_t bytes = 0;
  for (const auto* ids : {&node.inputs, &node.outputs})
    for (ValueId id : *ids) bytes += compiler::storage_bytes(graph.value(id).meta, compute_dtype);
  return bytes;
}

double kernel_flops(const Graph& graph, const Node& node) {
  if (node.outputs.empty()) return 0.0;
  const Shape& out = graph.value(node.outputs[0]).meta.shape;
  const double out_elements = static_cast<double>(shape_numel(out));
  auto input_shape = [&](size_t i) -> const Shape& { return graph.value(node.inputs.at(i)).meta.shape; };
  if (ops::is_matrix_product(node.op)) {
    // The reduced dimension is the last of the left operand (input 1 for addmm/baddbmm, after the bias).
    const size_t left = node.op == "addmm" || node.op == "baddbmm" ? 1 : 0;
    if (node.inputs.size() <= left || input_shape(left).empty()) return 0.0;
    return 2.0 * out_elements * static_cast<double>(input_shape(left).back());
  }
  if (node.op == "conv2d" || node.op == "conv1d" || node.op == "convolution" || node.op == "fused_conv2d") {
    if (node.inputs.size() < 2 || input_shape(1).empty() || input_shape(1)[0] == 0) return 0.0;
    const Shape& weight = input_shape(1);  // [out channels, in channels / groups, kernel...]
    return 2.0 * out_elements * static_cast<double>(shape_numel(weight) / weight[0]);
  }
  if (node.op == "attention" || node.op == "scaled_dot_product_attention") {
    if (node.inputs.size() < 3 || input_shape(1).size() < 2) return 0.0;
    const double keys = static_cast<double>(input_shape(1).end()[-2]);
    return 2.0 * keys * (static_cast<double>(shape_numel(input_shape(0))) + out_elements);
  }
  return 0.0;
}

RunProfile fastest_of(const RunProfile& a, const RunProfile& b) {
  if (a.kernels.size() != b.kernels.size() || a.partitions.size() != b.partitions.size() ||
      a.transfers.size() != b.transfers.size())
    fail("profiles of different programs: " + std::to_string(a.kernels.size()) + " and " +
         std::to_string(b.kernels.size()) + " kernels");
  RunProfile fastest = a;
  for (size_t i = 0; i < a.kernels.size(); ++i) {
    if (a.kernels[i].node != b.kernels[i].node)
      fail("profiles of different programs: kernel " + std::to_string(i) + " is '" + a.kernels[i].node + "' and '" +
           b.kernels[i].node + "'");
    fastest.kernels[i].duration_us = std::min(a.kernels[i].duration_us, b.kernels[i].duration_us);
  }
  for (size_t i = 0; i < a.partitions.size(); ++i)
    fastest.partitions[i].duration_us = std::min(a.partitions[i].duration_us, b.partitions[i].duration_us);
  for (size_t i = 0; i < a.transfers.size(); ++i)
    fastest.transfers[i].duration_us = std::min(a.transfers[i].duration_us, b.transfers[i].duration_us);
  fastest.total_us = std::min(a.total_us, b.total_us);
  return fastest;
}

std::string format_profile(const RunProfile& profile) {
  struct OpStats {
    int calls = 0;
    double us = 0.0, bytes = 0.0, flops = 0.0;
  };
  std::map<std::string, OpStats> by_op;
  OpStats total;
  for (const KernelRecord& k : profile.kernels) {
    for (OpStats* stats : {&by_op[k.op], &total}) {
      stats->calls += 1;
      stats->us += k.duration_us;
      stats->bytes += static_cast<double>(k.bytes);
      stats->flops += k.flops;
    }
  }
  std::vector<std::pair<std::string, OpStats>> rows(by_op.begin(), by_op.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  rows.emplace_back("total", total);

  std::string text;
  char line[512];
  std::snprintf(line, sizeof line, "%-28s %6s %10s %10s %6s %10s %8s %8s\n", "kernel (op)", "calls", "total ms",
                "mean ms", "share", "MB moved", "GB/s", "GFLOP/s");
  text += line;
  for (const auto& [op, stats] : rows) {
    std::snprintf(line, sizeof line, "%-28s %6d %10.3f %10.4f %5.1f%% %10.3f %8s %8s\n", op.c_str(), stats.calls,
                  stats.us / 1e3, stats.calls ? stats.us / 1e3 / stats.calls : 0.0,
                  total.us > 0 ? 100.0 * stats.us / total.us : 0.0, stats.bytes / 1e6,
                  rate_or_dash(gigabytes_per_second(stats.bytes, stats.us)).c_str(),
                  rate_or_dash(stats.us > 0 ? stats.flops / (stats.us * 1e3) : 0.0).c_str());
    text += line;
  }

  std::snprintf(line, sizeof line, "\n%-4s %-30s %8s %10s %6s\n", "#", "partition", "kernels", "total ms", "share");
  text += line;
  for (size_t p = 0; p < profile.partitions.size(); ++p) {
    const PartitionRecord& partition = profile.partitions[p];
    std::snprintf(line, sizeof line, "%-4zu %-30s %8zu %10.3f %5.1f%%\n", p, partition.label.c_str(), partition.kernels,
                  partition.duration_us / 1e3,
                  profile.total_us > 0 ? 100.0 * partition.duration_us / profile.total_us : 0.0);
    text += line;
  }

  if (!profile.transfers.empty()) {
    std::snprintf(line, sizeof line, "\n%-28s %10s %12s %10s %8s\n", "transfer (value)", "from -> to", "bytes", "ms",
                  "GB/s");
    text += line;
    double bytes = 0.0, us = 0.0;
    for (const TransferRecord& t : profile.transfers) {
      char route[48];
      std::snprintf(route, sizeof route, "#%d -> #%d", t.from_partition, t.to_partition);
      std::snprintf(line, sizeof line, "%-28s %10s %12lld %10.4f %8s\n", t.value.c_str(), route,
                    static_cast<long long>(t.bytes), t.duration_us / 1e3,
                    rate_or_dash(gigabytes_per_second(static_cast<double>(t.bytes), t.duration_us)).c_str());
      text += line;
      bytes += static_cast<double>(t.bytes);
      us += t.duration_us;
    }
    std::snprintf(line, sizeof line, "%-28s %10s %12.0f %10.4f %8s\n", "total", "", bytes, us / 1e3,
                  rate_or_dash(gigabytes_per_second(bytes, us)).c_str());
    text += line;
  }
  std::snprintf(line, sizeof line, "\nrun: %.3f ms\n", profile.total_us / 1e3);
  text += line;
  return text;
}

std::string chrome_trace(const RunProfile& profile) {
  using nlohmann::json;
  constexpr int kProcess = 1;
  const int transfer_track = static_cast<int>(profile.partitions.size()) + 1;
  json events = json::array();
  auto name_track = [&](int track, const std::string& name) {
    events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", kProcess}, {"tid", track}, {"args", {{"name", name}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", kProcess},
                      {"tid", track},
                      {"args", {{"sort_index", track}}}});
  };
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", kProcess}, {"tid", 0}, {"args", {{"name", "npusim"}}}});
  for (size_t p = 0; p < profile.partitions.size(); ++p) {
    const PartitionRecord& partition = profile.partitions[p];
    const int track = static_cast<int>(p) + 1;
    name_track(track, partition_name(p) + " " + partition.label);
    double end_us = partition.start_us + partition.duration_us;
    for (const KernelRecord& k : profile.kernels)
      if (k.partition == static_cast<int32_t>(p)) end_us = std::max(end_us, k.start_us + k.duration_us);
    events.push_back({{"name", "partition " + partition_name(p)},
                      {"cat", "partition"},
                      {"ph", "X"},
                      {"ts", partition.start_us},
                      {"dur", end_us - partition.start_us},
                      {"pid", kProcess},
                      {"tid", track},
                      {"args", {{"backend", partition.backend}, {"kernels", partition.kernels}}}});
  }
  for (const KernelRecord& k : profile.kernels)
    events.push_back({{"name", k.node},
                      {"cat", "kernel"},
                      {"ph", "X"},
                      {"ts", k.start_us},
                      {"dur", k.duration_us},
                      {"pid", kProcess},
                      {"tid", k.partition + 1},
                      {"args",
                       {{"op", k.op},
                        {"bytes", k.bytes},
                        {"GB/s", gigabytes_per_second(static_cast<double>(k.bytes), k.duration_us)},
                        {"flops", k.flops}}}});
  if (!profile.transfers.empty()) name_track(transfer_track, "transfers");
  for (const TransferRecord& t : profile.transfers)
    events.push_back(
        {{"name", "transfer " + t.value},
         {"cat", "transfer"},
         {"ph", "X"},
         {"ts", t.start_us},
         {"dur", t.duration_us},
         {"pid", kProcess},
         {"tid", transfer_track},
         {"args", {{"bytes", t.bytes}, {"from_partition", t.from_partition}, {"to_partition", t.to_partition}}}});
  return json({{"traceEvents", events}, {"displayTimeUnit", "ms"}}).dump();
}

void write_chrome_trace(const std::string& path, const RunProfile& profile) {
  const std::string text = chrome_trace(profile);
  std::ofstream file(path, std::ios::binary);
  if (!file) fail(path + ": cannot open for writing");
  file << text;
  if (!file.flush()) fail(path + ": cannot write the trace");
}

}  // namespace npusim
