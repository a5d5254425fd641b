#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>

#include "cli_args.h"
#include "commands.h"
#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "loading.h"
#include "runtime/backend.h"
#include "runtime/compare.h"
#include "runtime/dag_executor.h"
#include "runtime/profiler.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"

namespace npusim::cli {

namespace {

const std::vector<OptionSpec> kRunOnlyOptions = {
    {"reference", false, "run the uncompiled graph on the reference path (the oracle) instead of the backend"},
    {"outputs", true, "write the graph outputs to this .safetensors file"},
    {"top", true, "K: print the top-K classes of the last row of the first output"},
    {"iters", true, "N: run N times and report min and median latency (default 1)"},
    {"threads", true, "N: CPU threads, counting the caller (default: one per hardware thread)"},
    {"profile", false, "print per kernel, partition and transfer: calls, time, share, bytes moved, GB/s (last run)"},
    {"trace", true, "FILE.json: write a Chrome/Perfetto trace of the last run (ui.perfetto.dev, chrome://tracing)"},
    {"help", false, "show this help"},
};

void print_top(const NamedTensors& outputs, int k) {
  if (outputs.empty()) return;
  const Tensor logits = outputs.front().second.to(DType::Float32);
  const int64_t row = logits.rank() == 0 ? 1 : logits.shape().back();
  if (row == 0) return;
  const float* last = logits.data<float>() + (logits.numel() - row);
  std::printf("top-%d of '%s':\n", k, outputs.front().first.c_str());
  for (int64_t index : top_k_indices(last, row, k))
    std::printf("  class %6lld  %10.4f\n", static_cast<long long>(index), last[index]);
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  const Args args("run", join({kWeightOptions, kInputOptions, kCompileOptions, kPackCacheOptions, kRunOnlyOptions}),
                  argv);
  if (args.flag("help")) {
    std::printf("usage: npusim run GRAPH.json|PROGRAM.npubin [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (args.positionals().size() != 1) fail("npusim run: expected one graph or program file (see npusim run --help)");
  const int64_t iters = args.integer("iters", 1, 1, 1000000);
  const int top = static_cast<int>(args.integer("top", 0, 0, 1000000));
  const int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const std::string path = args.positionals()[0];

  std::vector<double> latencies;
  NamedTensors outputs;
  std::chrono::steady_clock::time_point first_result;
  auto timed = [&](auto&& run_once) {
    for (int64_t i = 0; i < iters; ++i) {
      const auto start = std::chrono::steady_clock::now();
      outputs = run_once();
      const auto end = std::chrono::steady_clock::now();
      if (i == 0) first_result = end;
      latencies.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    }
  };
  // Everything is printed and written, and stdout flushed, while the prepared model still lives: its teardown
  // (unmapping the packed weights) comes after the first result, not before it.
  auto report = [&](const std::string& path_label, const std::string& memory_line) {
    const double first_ms = latencies.front();
    const double startup_ms = std::chrono::duration<double, std::milli>(first_result - process_start()).count();
    std::sort(latencies.begin(), latencies.end());
    for (const auto& [name, tensor] : outputs)
      std::printf("output %s %s %s\n", name.c_str(), shape_string(tensor.shape()).c_str(),
                  std::string(dtype_name(tensor.dtype())).c_str());
    if (top > 0) print_top(outputs, top);
    std::printf("latency: min %.2f ms, median %.2f ms over %lld run(s) (%s)\n", latencies.front(),
                latencies[latencies.size() / 2], static_cast<long long>(iters), path_label.c_str());
    std::fputs(memory_line.c_str(), stdout);
    std::printf("start-up: first result %.1f ms after start, %.1f ms beyond its run\n", startup_ms,
                startup_ms - first_ms);
    if (auto out = args.value("outputs")) write_safetensors(*out, outputs);
    std::fflush(stdout);
  };

  if (args.flag("reference")) {
    if (is_program_file(path)) fail("npusim run: --reference runs a graph JSON, not a compiled program");
    if (args.value("trace")) fail("npusim run: --trace times the compiled program's kernels; leave out --reference");
    const Graph graph = read_torch_ir(path);
    check_supported(graph);
    const auto weights = load_weights(graph, args);
    const auto inputs = load_inputs(graph, args);
    const ReferenceExecutor executor(graph, weights);
    timed([&] { return executor.run(inputs); });
    report("reference path", "");
    return 0;
  }
  const PreparedModel model = prepare_model(path, args, BackendOptions{.threads = threads});
  DagExecutor& prepared = *model.executor;
  const auto inputs = load_inputs(model.program.graph, args);
  prepared.set_profiling(args.flag("profile") || args.value("trace"));
  timed([&] { return prepared.run(inputs); });
  const PrepareCost cost = prepared.prepare_cost();
  char line[256];
  std::snprintf(line, sizeof line,
                "memory: planned %.2f MB, allocated %.2f MB\nprepare: %.1f ms, %.2f MB of weights packed for the "
                "kernels",
                prepared.planned_bytes() / 1e6, prepared.allocated_bytes() / 1e6, cost.milliseconds,
                static_cast<double>(cost.packed_bytes) / 1e6);
  std::string memory_line = line;
  if (cost.mapped_bytes > 0) {
    std::snprintf(line, sizeof line, " (%.2f MB of them mapped from the pack cache)",
                  static_cast<double>(cost.mapped_bytes) / 1e6);
    memory_line += line;
  }
  memory_line += "\n";
  for (const std::string& note : cost.notes) memory_line += "pack cache: " + note + "\n";
  if (args.flag("profile")) std::fputs(format_profile(prepared.last_profile()).c_str(), stdout);
  if (auto trace = args.value("trace")) {
    write_chrome_trace(*trace, prepared.last_profile());
    std::printf("wrote trace %s (%zu kernels)\n", trace->c_str(), prepared.last_profile().kernels.size());
  }
  report(model.label, memory_line);
  // After the first result: writing the packed weights to the pack cache is for the next run.
  for (const std::string& note : prepared.keep_packed_weights()) std::printf("pack cache: %s\n", note.c_str());
  return 0;
}

}  // namespace npusim::cli
