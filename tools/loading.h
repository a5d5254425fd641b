#pragma once
// What several commands share: weights and inputs from the command line, compile options.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli_args.h"
#include "compiler/compile.h"
#include "llm/session.h"
#include "npusim/graph.h"
#include "runtime/dag_executor.h"

namespace npusim::cli {

// --weights/--config/--random-weights.
extern const std::vector<OptionSpec> kWeightOptions;
// --inputs/--input/--random-inputs.
extern const std::vector<OptionSpec> kInputOptions;
// --target/--dtype/--disable/--no-fallback.
extern const std::vector<OptionSpec> kCompileOptions;

// --pack-cache (prepare_model reads it, see pack_cache_directory).
extern const std::vector<OptionSpec> kPackCacheOptions;

std::vector<OptionSpec> join(std::initializer_list<std::vector<OptionSpec>> lists);

std::vector<std::pair<ValueId, Tensor>> load_weights(const Graph& graph, const Args& args);
std::map<std::string, Tensor> load_inputs(const Graph& graph, const Args& args);
compiler::CompileOptions compile_options(const Args& args);

bool is_program_file(const std::string& path);

// The CPU backend's pack cache for --pack-cache DIR|off, else $NPUSIM_PACK_CACHE (DIR or off), else
// $XDG_CACHE_HOME/npusim/packed-weights or ~/.cache/npusim/packed-weights; empty for none.
std::string pack_cache_directory(const Args& args);

// A graph compiled for --target (or a program read back and checked against its target), partitioned, with its
// weights bound and every partition prepared on its backend: what `run` and `bench` execute.
struct PreparedModel {
  Program program;
  compiler::Target target;
  std::unique_ptr<DagExecutor> executor;
  size_t partitions = 0;
  size_t fallback_nodes = 0;
  std::string label;  // "TARGET on BACKEND, DTYPE" and the partitions, for reports
};
PreparedModel prepare_model(const std::string& path, const Args& args, const BackendOptions& backend);

// The LLM session's options from --target, --ctx, --dtype, --threads, --quantize, --quantize-group, --compact-bf16,
// --prefill-chunk, --prefill-ir and --decode-ir (those the command declares).
SessionOptions session_options(const Args& args);

// The process's peak resident memory so far, in MB.
double peak_memory_mb();

}  // namespace npusim::cli
