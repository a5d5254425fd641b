#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "compiler/target.h"
#include "runtime/coverage.h"

namespace npusim::cli {

int ops_command(const std::vector<std::string>& argv) {
  const Args args("ops",
                  {{"target", true, "built-in target name or target JSON file: add where that target runs each op"},
                   {"markdown", false, "print the table as Markdown (docs/ops.md is this output)"},
                   {"help", false, "show this help"}},
                  argv);
  if (args.flag("help") || !args.positionals().empty()) {
    std::printf("usage: npusim ops [--target T] [--markdown]\n%s", args.usage().c_str());
    return args.positionals().empty() ? 0 : 2;
  }
  const std::vector<BackendCoverage> backends = builtin_coverages();
  if (args.flag("markdown")) {
    if (args.value("target")) fail("npusim ops: --markdown documents the backends; leave out --target");
    std::fputs(coverage_markdown(backends).c_str(), stdout);
    return 0;
  }
  if (auto name = args.value("target")) {
    const compiler::Target target = compiler::load_target(*name);
    std::fputs(format_coverage_table(backends, &target).c_str(), stdout);
  } else {
    std::fputs(format_coverage_table(backends).c_str(), stdout);
  }
  return 0;
}

}  // namespace npusim::cli
