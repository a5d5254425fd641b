#include "compiler/pass.h"

#include "compiler/graph_edit.h"

namespace npusim::compiler {

const std::vector<Pass>& all_passes() {
  static const std::vector<Pass> passes = {
      {"remove_noops", "drop identities: aliases, clones, dropout, same-dtype casts, metadata checks, getitem",
       false, remove_noops},
      {"fold_constants", "evaluate everything that depends on no input or weight (masks, aranges, shapes)", false,
       fold_constants},
      {"fold_batchnorm", "fold inference BatchNorm into the preceding conv or linear (load-time weight transform)",
       false, fold_batchnorm},
  };
  return passes;
}

const Pass* find_pass(const std::string& name) {
  for (const Pass& pass : all_passes())
    if (pass.name == name) return &pass;
  return nullptr;
}

void run_passes(Graph& graph, const PassOptions& options, PassContext& context) {
  for (const std::string& name : options.disabled)
    if (name != "fusions" && !find_pass(name)) {
      std::string known;
      for (const Pass& pass : all_passes()) known += std::string(known.empty() ? "" : ", ") + pass.name;
      fail("unknown pass '" + name + "' (passes: " + known + ", or 'fusions' for every fusion)");
    }
  for (const Pass& pass : all_passes()) {
    if (options.disabled.count(pass.name) || (pass.is_fusion && options.disabled.count("fusions"))) continue;
    pass.run(graph, context);
    if (options.verify_each) check_graph(graph, pass.name);
  }
}

}  // namespace npusim::compiler
