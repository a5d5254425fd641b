#pragma once
#include <set>
#include <string>
#include <vector>

#include "npusim/graph.h"

namespace npusim::compiler {

struct PassContext {
  std::vector<std::string> log;  // one line per pass that changed something: "fold_batchnorm: 20 folded"
  void note(const std::string& pass, const std::string& what) { log.push_back(pass + ": " + what); }
};

// A graph-to-graph rewrite that can be switched off by name (`--disable NAME`).
struct Pass {
  const char* name;
  const char* summary;
  bool is_fusion;
  void (*run)(Graph& graph, PassContext& context);
  const char* creates = nullptr;  // a fusion's fused op
};

// Every pass, in pipeline order.
const std::vector<Pass>& all_passes();
const Pass* find_pass(const std::string& name);

struct PassOptions {
  std::set<std::string> disabled;  // pass names; "fusions" disables every fusion
  bool verify_each = true;         // check graph invariants after each pass
};

// Fails on an unknown pass name in `disabled`.
void run_passes(Graph& graph, const PassOptions& options, PassContext& context);
// Runs exactly the given passes, in order (bisecting, tests).
void run_pass_list(Graph& graph, const std::vector<Pass>& passes, PassContext& context, bool verify_each = true);

// The passes, one file each under compiler/passes/.
void remove_noops(Graph& graph, PassContext& context);
void fold_constants(Graph& graph, PassContext& context);
void fold_batchnorm(Graph& graph, PassContext& context);
void fuse_conv_activation(Graph& graph, PassContext& context);
void fuse_batchnorm_activation(Graph& graph, PassContext& context);
void fuse_add_relu(Graph& graph, PassContext& context);
void fuse_rms_norm(Graph& graph, PassContext& context);
void fuse_silu_mul(Graph& graph, PassContext& context);
void fuse_rope(Graph& graph, PassContext& context);
void fuse_attention(Graph& graph, PassContext& context);
void fuse_masked_softmax(Graph& graph, PassContext& context);
void fuse_elementwise(Graph& graph, PassContext& context);

}  // namespace npusim::compiler
