#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "ir/torch_ir_reader.h"
#include "loading.h"
#include "runtime/bisect.h"

namespace npusim::cli {

int bisect_command(const std::vector<std::string>& argv) {
  const Args args("bisect",
                  join({kWeightOptions,
                        kInputOptions,
                        {{"dtype", true, "storage dtype: float32 (default), float16, bfloat16"},
                         {"min-pearson", true, "R: a step diverges below this Pearson r (default 0.9999)"},
                         {"help", false, "show this help"}}}),
                  argv);
  if (args.flag("help")) {
    std::printf("usage: npusim bisect GRAPH.json [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (args.positionals().size() != 1) fail("npusim bisect: expected one graph file");
  const Graph graph = read_torch_ir(args.positionals()[0]);
  check_supported(graph);
  const auto inputs = load_inputs(graph, args);
  BisectOptions options;
  options.compute_dtype = compile_options(args).compute_dtype;
  if (auto r = args.value("min-pearson")) options.min_pearson = std::stod(*r);
  const BisectResult result = bisect_passes(
      graph, compiler::all_passes(), [&](const Graph& g) { return load_weights(g, args); }, inputs, options);
  std::fputs(format_bisect(result).c_str(), stdout);
  return result.first_bad ? 1 : 0;
}

}  // namespace npusim::cli
