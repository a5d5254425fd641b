#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "compiler/compile.h"
#include "compiler/pass.h"
#include "ir/torch_ir_reader.h"
#include "loading.h"

namespace npusim::cli {

int compile_command(const std::vector<std::string>& argv) {
  const Args args("compile",
                  join({kCompileOptions,
                        {{"o", true, "FILE.npubin: where to write the program"},
                         {"output", true, "FILE.npubin: same as -o"},
                         {"report", false,
                          "print which ops run where, the partitions, the transfers and their bytes, the memory plan"},
                         {"help", false, "show this help"}}}),
                  [&] {
                    std::vector<std::string> fixed;
                    for (const std::string& a : argv) fixed.push_back(a == "-o" ? "--o" : a);
                    return fixed;
                  }());
  if (args.flag("help")) {
    std::printf("usage: npusim compile GRAPH.json -o PROGRAM.npubin [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (args.positionals().size() != 1) fail("npusim compile: expected one graph file (see npusim compile --help)");
  auto output = args.value("o");
  if (!output) output = args.value("output");
  if (!output && !args.flag("report")) fail("npusim compile: give -o FILE.npubin (or --report to only report)");
  const Graph graph = read_torch_ir(args.positionals()[0]);
  const compiler::CompileOptions options = compile_options(args);
  compiler::CompileReport report;
  if (args.flag("report")) {
    // Report unknown ops together with everything else instead of stopping at the first.
    for (const std::string& line : graph.unsupported_ops()) std::printf("unsupported: %s\n", line.c_str());
  }
  const Program program = compiler::compile_graph(graph, options, &report);
  if (args.flag("report"))
    std::fputs(compiler::format_report(program, report, compiler::load_target(options.target)).c_str(), stdout);
  if (output) {
    write_program(*output, program);
    std::printf("wrote %s (%zu kernels, arena %.2f MB) in %.1f ms\n", output->c_str(), program.graph.nodes.size(),
                program.plan.arena_bytes / 1e6, report.milliseconds);
  }
  return 0;
}

int inspect_command(const std::vector<std::string>& argv) {
  const Args args("inspect", {{"help", false, "show this help"}}, argv);
  if (args.flag("help")) {
    std::printf("usage: npusim inspect PROGRAM.npubin\n");
    return 0;
  }
  if (args.positionals().size() != 1) fail("npusim inspect: expected one .npubin file");
  std::fputs(describe_program(read_program(args.positionals()[0])).c_str(), stdout);
  return 0;
}

int passes_command(const std::vector<std::string>& argv) {
  const Args args("passes", {{"help", false, "show this help"}}, argv);
  for (const compiler::Pass& pass : compiler::all_passes())
    std::printf("%-22s %-7s %s\n", pass.name, pass.is_fusion ? "fusion" : "", pass.summary);
  return 0;
}

}  // namespace npusim::cli
