#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "npusim/op_registry.h"

namespace npusim::cli {

int ops_command(const std::vector<std::string>& argv) {
  const Args args("ops", {{"help", false, "show this help"}}, argv);
  if (args.flag("help") || !args.positionals().empty()) {
    std::printf("usage: npusim ops\n%s", args.usage().c_str());
    return args.positionals().empty() ? 0 : 2;
  }
  for (const OpDef* def : OpRegistry::instance().all()) {
    std::printf("%s\n", def->name.c_str());
    for (const AtenSpelling& spelling : def->spellings) std::printf("    %s\n", spelling.op_type.c_str());
  }
  return 0;
}

}  // namespace npusim::cli
