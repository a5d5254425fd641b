#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "cli_args.h"
#include "commands.h"
#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "loading.h"
#include "runtime/backend.h"
#include "runtime/compare.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"

namespace npusim::cli {

namespace {

const std::vector<OptionSpec> kRunOnlyOptions = {
    {"reference", false, "run the uncompiled graph on the reference path (the oracle) instead of the backend"},
    {"outputs", true, "write the graph outputs to this .safetensors file"},
    {"top", true, "K: print the top-K classes of the last row of the first output"},
    {"iters", true, "N: run N times and report min and median latency (default 1)"},
    {"profile", false, "print the time of every kernel of the last run"},
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

void print_profile(const std::vector<KernelTiming>& timings) {
  std::map<std::string, std::pair<int, double>> by_op;
  double total = 0;
  for (const KernelTiming& t : timings) {
    by_op[t.op].first += 1;
    by_op[t.op].second += t.milliseconds;
    total += t.milliseconds;
  }
  std::vector<std::pair<std::string, std::pair<int, double>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::printf("%-28s %6s %10s %10s %6s\n", "op", "calls", "total ms", "mean ms", "share");
  for (const auto& [op, stats] : rows)
    std::printf("%-28s %6d %10.3f %10.4f %5.1f%%\n", op.c_str(), stats.first, stats.second, stats.second / stats.first,
                total > 0 ? 100.0 * stats.second / total : 0.0);
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  const Args args("run", join({kWeightOptions, kInputOptions, kCompileOptions, kRunOnlyOptions}), argv);
  if (args.flag("help")) {
    std::printf("usage: npusim run GRAPH.json|PROGRAM.npubin [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (args.positionals().size() != 1) fail("npusim run: expected one graph or program file (see npusim run --help)");
  const int64_t iters = args.integer("iters", 1, 1, 1000000);
  const int top = static_cast<int>(args.integer("top", 0, 0, 1000000));
  const std::string path = args.positionals()[0];

  std::vector<double> latencies;
  NamedTensors outputs;
  auto timed = [&](auto&& run_once) {
    for (int64_t i = 0; i < iters; ++i) {
      const auto start = std::chrono::steady_clock::now();
      outputs = run_once();
      latencies.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  };

  std::string path_label;
  std::string memory_line;
  if (args.flag("reference")) {
    if (is_program_file(path)) fail("npusim run: --reference runs a graph JSON, not a compiled program");
    const Graph graph = read_torch_ir(path);
    check_supported(graph);
    const auto weights = load_weights(graph, args);
    const auto inputs = load_inputs(graph, args);
    const ReferenceExecutor executor(graph, weights);
    timed([&] { return executor.run(inputs); });
    path_label = "reference path";
  } else {
    Program program;
    if (is_program_file(path)) {
      program = read_program(path);
    } else {
      const Graph graph = read_torch_ir(path);
      check_supported(graph);
      program = compiler::compile_graph(graph, compile_options(args));
    }
    const auto weights = load_weights(program.graph, args);
    const auto inputs = load_inputs(program.graph, args);
    auto backend = make_backend(compiler::load_target(program.target).backend);
    auto prepared = backend->prepare(program, weights);
    prepared->set_profiling(args.flag("profile"));
    timed([&] { return prepared->run(inputs); });
    path_label = program.target + " backend, " + std::string(dtype_name(program.compute_dtype));
    char line[160];
    std::snprintf(line, sizeof line, "memory: planned %.2f MB, allocated %.2f MB\n", prepared->planned_bytes() / 1e6,
                  prepared->allocated_bytes() / 1e6);
    memory_line = line;
    if (args.flag("profile")) print_profile(prepared->last_timings());
  }
  std::sort(latencies.begin(), latencies.end());

  for (const auto& [name, tensor] : outputs)
    std::printf("output %s %s %s\n", name.c_str(), shape_string(tensor.shape()).c_str(),
                std::string(dtype_name(tensor.dtype())).c_str());
  if (top > 0) print_top(outputs, top);
  std::printf("latency: min %.2f ms, median %.2f ms over %lld run(s) (%s)\n", latencies.front(),
              latencies[latencies.size() / 2], static_cast<long long>(iters), path_label.c_str());
  std::fputs(memory_line.c_str(), stdout);
  if (auto out = args.value("outputs")) write_safetensors(*out, outputs);
  return 0;
}

}  // namespace npusim::cli
