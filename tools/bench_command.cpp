#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "cli_args.h"
#include "commands.h"
#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "loading.h"
#include "runtime/profiler.h"

namespace npusim::cli {

namespace {

const std::vector<OptionSpec> kBenchOnlyOptions = {
    {"threads", true, "N: CPU threads, counting the caller (default: one per hardware thread)"},
    {"iters", true, "N: timed runs (default 20)"},
    {"warmup", true, "N: untimed runs first (default 3)"},
    {"json", false, "end with one JSON object (min_ms, median_ms, max_ms, gflops, gbps, ...) on the last line"},
    {"help", false, "show this help"},
};

}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  const Args args("bench", join({kWeightOptions, kInputOptions, kCompileOptions, kBenchOnlyOptions}), argv);
  if (args.flag("help")) {
    std::printf("usage: npusim bench GRAPH.json|PROGRAM.npubin [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (args.positionals().size() != 1) fail("npusim bench: expected one graph or program file");
  const int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const int64_t iters = args.integer("iters", 20, 1, 1000000);
  const int64_t warmup = args.integer("warmup", 3, 0, 1000000);
  const std::string path = args.positionals()[0];

  const auto load_start = std::chrono::steady_clock::now();
  Program program;
  if (is_program_file(path)) {
    program = read_program(path);
  } else {
    program = compiler::compile_graph(read_torch_ir(path), compile_options(args));
  }
  const auto weights = load_weights(program.graph, args);
  std::map<std::string, Tensor> inputs = load_inputs(program.graph, args);
  cpu::CpuBackend backend(cpu::CpuOptions{threads, false});
  auto prepared = backend.prepare(program, weights);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();

  for (int64_t i = 0; i < warmup; ++i) prepared->run(inputs);
  std::vector<double> ms;
  for (int64_t i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    prepared->run(inputs);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];

  double flops = 0;
  int64_t bytes = 0;
  for (const Node& node : program.graph.nodes) {
    flops += kernel_flops(program.graph, node);
    bytes += kernel_bytes(program.graph, node, program.plan, program.compute_dtype);
  }
  const double gflops = flops / (median * 1e6);
  const double gbps = static_cast<double>(bytes) / (median * 1e6);
  std::printf("%s: %zu kernels, %s storage, %d thread(s)\n", path.c_str(), program.graph.nodes.size(),
              std::string(dtype_name(program.compute_dtype)).c_str(), threads);
  std::printf("latency: min %.3f ms  median %.3f ms  max %.3f ms  (%lld runs after %lld warm-up)\n", ms.front(),
              median, ms.back(), static_cast<long long>(iters), static_cast<long long>(warmup));
  std::printf("work: %.3f GFLOP, %.1f MB moved -> %.1f GFLOP/s, %.1f GB/s; load and prepare %.1f ms\n", flops / 1e9,
              bytes / 1e6, gflops, gbps, load_ms);
  if (args.flag("json"))
    std::printf(
        "{\"file\": \"%s\", \"kernels\": %zu, \"dtype\": \"%s\", \"threads\": %d, \"iters\": %lld, \"min_ms\": %.4f, "
        "\"median_ms\": %.4f, \"max_ms\": %.4f, \"gflop\": %.4f, \"gflops\": %.2f, \"bytes\": %lld, \"gbps\": %.2f, "
        "\"load_ms\": %.2f}\n",
        path.c_str(), program.graph.nodes.size(), std::string(dtype_name(program.compute_dtype)).c_str(), threads,
        static_cast<long long>(iters), ms.front(), median, ms.back(), flops / 1e9, gflops,
        static_cast<long long>(bytes), gbps, load_ms);
  return 0;
}

}  // namespace npusim::cli
