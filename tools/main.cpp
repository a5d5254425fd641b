#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "core/cpu_features.h"
#include "npusim/error.h"

namespace {

std::chrono::steady_clock::time_point g_process_start;  // constant-initialized: no initializer overwrites it later

// Priority 101 runs before the static initializers of every translation unit (those have the default priority).
__attribute__((constructor(101))) void note_process_start() { g_process_start = std::chrono::steady_clock::now(); }

constexpr const char* kUsage = R"(npusim: compile and run PyTorch models exported as torch_ir JSON

usage: npusim COMMAND [options]   (npusim COMMAND --help for its options)

commands:
  compile  compile a graph into a program (.npubin) for a target; --report shows what runs where
  inspect  print a compiled program: inputs, outputs, kernels, buffers, weights, bytes
  run      run a graph or program on its backend (or --reference) and write or print its outputs
  bisect   find the compiler pass and node where a compiled model's output starts to diverge
  bench    time a graph or program on the CPU backend: min/median/max, GFLOP/s, GB/s (--json)
  probe    measure this machine: memory read bandwidth, fp32 FMA peak, CPU features (--json)
  passes   list the compiler passes (each can be switched off with --disable NAME)
  verify   compare two safetensors files tensor by tensor (Pearson r, top-5, argmax, max |diff|)
  ops      which canonical ops each backend covers (--target T, --markdown for docs/ops.md)
  kernel   compile a user kernel from a JSON spec and run it (kernel run SPEC.json)
  generate generate text from a Hugging Face model directory (--model DIR --prompt TEXT)
  chat     talk with a model interactively; the conversation and its KV cache persist between turns
)";

}  // namespace

std::chrono::steady_clock::time_point npusim::cli::process_start() { return g_process_start; }

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    npusim::cpu_features();  // an invalid NPUSIM_CPU_ISA fails here, before any kernel is chosen
    if (command == "run") return npusim::cli::run_command(args);
    if (command == "verify") return npusim::cli::verify_command(args);
    if (command == "ops") return npusim::cli::ops_command(args);
    if (command == "compile") return npusim::cli::compile_command(args);
    if (command == "inspect") return npusim::cli::inspect_command(args);
    if (command == "passes") return npusim::cli::passes_command(args);
    if (command == "bisect") return npusim::cli::bisect_command(args);
    if (command == "kernel") return npusim::cli::kernel_command(args);
    if (command == "bench") return npusim::cli::bench_command(args);
    if (command == "probe") return npusim::cli::probe_command(args);
    if (command == "generate") return npusim::cli::generate_command(args);
    if (command == "chat") return npusim::cli::chat_command(args);
    std::fprintf(stderr, "npusim: unknown command '%s' (see npusim --help)\n", command.c_str());
    return 2;
  } catch (const npusim::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
