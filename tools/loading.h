#pragma once
// What several commands share: weights and inputs from the command line, compile options.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli_args.h"
#include "compiler/compile.h"
#include "npusim/graph.h"

namespace npusim::cli {

// --weights/--config/--random-weights.
extern const std::vector<OptionSpec> kWeightOptions;
// --inputs/--input/--random-inputs.
extern const std::vector<OptionSpec> kInputOptions;
// --target/--dtype/--disable/--no-fallback.
extern const std::vector<OptionSpec> kCompileOptions;

std::vector<OptionSpec> join(std::initializer_list<std::vector<OptionSpec>> lists);

std::vector<std::pair<ValueId, Tensor>> load_weights(const Graph& graph, const Args& args);
std::map<std::string, Tensor> load_inputs(const Graph& graph, const Args& args);
compiler::CompileOptions compile_options(const Args& args);

bool is_program_file(const std::string& path);

}  // namespace npusim::cli
