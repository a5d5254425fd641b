// Compile time of exported graphs: read + validate + passes + memory plan (+ write), min/median over runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "program/program.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_compile GRAPH.json [...] [--iters N]\n");
    return 2;
  }
  int iters = 10;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else
      files.push_back(arg);
  }
  try {
    for (const std::string& file : files) {
      std::vector<double> read_ms, compile_ms, cpu_ms, load_ms;
      size_t kernels = 0;
      const std::string program_path = (std::filesystem::temp_directory_path() / "bench_compile.npubin").string();
      for (int i = 0; i < iters; ++i) {
        const std::clock_t c0 = std::clock();
        const auto t0 = std::chrono::steady_clock::now();
        npusim::Graph graph = npusim::read_torch_ir(file);
        const auto t1 = std::chrono::steady_clock::now();
        const npusim::Program program = npusim::compiler::compile_graph(std::move(graph), {});
        const auto t2 = std::chrono::steady_clock::now();
        kernels = program.graph.nodes.size();
        npusim::write_program(program_path, program);
        const auto t3 = std::chrono::steady_clock::now();
        const npusim::Program loaded = npusim::read_program(program_path);
        load_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t3).count());
        read_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        compile_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
        cpu_ms.push_back(1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
      }
      std::sort(read_ms.begin(), read_ms.end());
      std::sort(compile_ms.begin(), compile_ms.end());
      std::sort(cpu_ms.begin(), cpu_ms.end());
      std::sort(load_ms.begin(), load_ms.end());
      std::filesystem::remove(program_path);
      std::printf(
          "%s: %zu kernels; read+validate min %.1f ms median %.1f ms; total compile min %.1f ms median %.1f ms; CPU "
          "time min %.1f ms median %.1f ms; .npubin read min %.1f ms median %.1f ms\n",
          file.c_str(), kernels, read_ms.front(), read_ms[read_ms.size() / 2], compile_ms.front(),
          compile_ms[compile_ms.size() / 2], cpu_ms.front(), cpu_ms[cpu_ms.size() / 2], load_ms.front(),
          load_ms[load_ms.size() / 2]);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
