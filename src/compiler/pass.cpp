#include "compiler/pass.h"

#include "compiler/graph_edit.h"

namespace npusim::compiler {

const std::vector<Pass>& all_passes() {
  static const std::vector<Pass> passes = {
      {"remove_noops", "drop identities: aliases, clones, dropout, same-dtype casts, metadata checks, getitem", false,
       remove_noops},
      {"fold_constants", "evaluate everything that depends on no input or weight (masks, aranges, shapes)", false,
       fold_constants},
      {"fold_batchnorm", "fold inference BatchNorm into the preceding conv or linear (load-time weight transform)",
       false, fold_batchnorm},
      {"fuse_conv_activation", "conv2d + optional residual add + activation in one kernel", true, fuse_conv_activation,
       "fused_conv2d"},
      {"fuse_batchnorm_activation", "a batch_norm left standing + its activation in one kernel", true,
       fuse_batchnorm_activation, "fused_batch_norm"},
      {"fuse_add_relu", "add + relu in one kernel", true, fuse_add_relu, "add_relu"},
      {"fuse_rms_norm", "the pow/mean/add/rsqrt/mul chain as one rms_norm", true, fuse_rms_norm, "rms_norm"},
      {"fuse_silu_mul", "silu(gate) * up in one kernel", true, fuse_silu_mul, "silu_mul"},
      {"fuse_rope", "rotary embedding (x*cos + rotate_half(x)*sin) in one kernel", true, fuse_rope, "rope"},
      {"fuse_attention", "QK^T, scale, mask, softmax, V (grouped-query aware) as one attention", true, fuse_attention,
       "attention"},
      {"fuse_masked_softmax", "add(mask) + softmax in one kernel", true, fuse_masked_softmax, "masked_softmax"},
      {"fuse_elementwise", "chains of elementwise ops as one generated kernel", true, fuse_elementwise,
       "elementwise_chain"},
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
  std::vector<Pass> enabled;
  for (const Pass& pass : all_passes())
    if (!options.disabled.count(pass.name) && !(pass.is_fusion && options.disabled.count("fusions")))
      enabled.push_back(pass);
  run_pass_list(graph, enabled, context, options.verify_each);
}

void run_pass_list(Graph& graph, const std::vector<Pass>& passes, PassContext& context, bool verify_each) {
  for (const Pass& pass : passes) {
    pass.run(graph, context);
    if (verify_each) check_graph(graph, pass.name);
  }
}

}  // namespace npusim::compiler
