// npusim probe: what this machine can do at best (memory read bandwidth, fp32 FMA peak, CPU features).
#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "npusim/error.h"
#include "runtime/machine_probe.h"

namespace npusim::cli {

int probe_command(const std::vector<std::string>& argv) {
  const Args args(
      "probe",
      {{"threads", true, "N: threads of the multi-threaded measurements (default: one per hardware thread)"},
       {"json", false, "print one JSON object instead"},
       {"help", false, "show this help"}},
      argv);
  if (args.flag("help")) {
    std::printf("usage: npusim probe [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (!args.positionals().empty()) fail("npusim probe: takes no file arguments");
  ProbeOptions options;
  options.threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  const MachineProbe probe = probe_machine(options);
  if (args.flag("json"))
    std::printf("%s\n", probe_json(probe).c_str());
  else
    std::printf("%s", format_probe(probe).c_str());
  return 0;
}

}  // namespace npusim::cli
