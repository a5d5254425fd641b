// Seeds for fuzz_npubin: runs the compiler passes over torch_ir graphs, plans their memory and writes each
// program's FlatBuffer (the .npubin without its footer, which the fuzz target adds) as OUT_DIR/<name>.npubin.
// compile_graph itself is not used: it asks the backends for their coverage, and the CPU backend is not built
// with clang. usage: make_npubin_seeds OUT_DIR GRAPH.json...   (graphs that fail are skipped with a note)
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "ir/torch_ir_reader.h"
#include "npusim/error.h"
#include "program/program.h"

namespace {

npusim::Program program_of(const std::string& path) {
  npusim::Program program;
  program.graph = npusim::read_torch_ir(path);
  npusim::compiler::PassContext context;
  npusim::compiler::run_passes(program.graph, {}, context);
  program.pass_log = context.log;
  program.plan = npusim::compiler::plan_memory(program.graph, program.compute_dtype);
  return program;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: make_npubin_seeds OUT_DIR GRAPH.json...\n");
    return 2;
  }
  const std::filesystem::path out_dir = argv[1];
  std::filesystem::create_directories(out_dir);
  int written = 0;
  for (int i = 2; i < argc; ++i) {
    try {
      const std::vector<uint8_t> bytes = npusim::write_program_bytes(program_of(argv[i]));
      const auto path = out_dir / (std::filesystem::path(argv[i]).stem().string() + ".npubin");
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()),
                 static_cast<std::streamsize>(bytes.size() - npusim::kNpubinFooterBytes));
      ++written;
    } catch (const npusim::Error& error) {
      std::fprintf(stderr, "note: skipped: %s\n", error.what());
    }
  }
  std::printf("%d .npubin seeds in %s\n", written, out_dir.c_str());
  return written > 0 ? 0 : 1;
}
