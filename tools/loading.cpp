#include "loading.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "compiler/compile.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "program/program.h"
#include "runtime/npy.h"
#include "runtime/random_fill.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"
#include "runtime/weight_transforms.h"

namespace npusim::cli {

const std::vector<OptionSpec> kWeightOptions = {
    {"weights", true, "a .safetensors file with the model's weights (repeatable)"},
    {"config", true, "Hugging Face config.json (rotary inv_freq when the weights lack it)"},
    {"random-weights", true, "SEED: seeded random weights instead of --weights"},
};

const std::vector<OptionSpec> kInputOptions = {
    {"inputs", true, "a .safetensors file with tensors named as the graph inputs (repeatable)"},
    {"input", true, "NAME=FILE.npy: one graph input from a .npy file (repeatable)"},
    {"random-inputs", true, "SEED: seeded random values for inputs not given otherwise"},
};

const std::vector<OptionSpec> kCompileOptions = {
    {"target", true, "built-in target name (cpu) or a target JSON file (default cpu)"},
    {"dtype", true, "storage dtype of activations and weights: float32 (default), float16, bfloat16"},
    {"disable", true, "PASS: switch a compiler pass off (repeatable; 'fusions' for all fusions)"},
    {"no-fallback", false, "fail instead of falling back for ops the target lacks"},
};

const std::vector<OptionSpec> kPackCacheOptions = {
    {"pack-cache", true,
     "DIR|off: where the CPU backend keeps the weights it packed, so that a later run of the same program, weights "
     "and build maps them instead of packing again (default: $NPUSIM_PACK_CACHE, else "
     "${XDG_CACHE_HOME:-~/.cache}/npusim/packed-weights; off: pack every run)"},
};

std::vector<OptionSpec> join(std::initializer_list<std::vector<OptionSpec>> lists) {
  std::vector<OptionSpec> all;
  for (const auto& list : lists) all.insert(all.end(), list.begin(), list.end());
  return all;
}

namespace {

// --weights, --config or --random-weights bound to `graph`, with the derived weights (BatchNorm folds) computed or
// left to the backend that prepares the graph.
std::vector<std::pair<ValueId, Tensor>> bind_weights(const Graph& graph, const Args& args, DerivedWeights derived) {
  if (args.value("random-weights")) {
    if (!args.values("weights").empty()) fail("npusim: give either --weights or --random-weights, not both");
    const auto seed = static_cast<uint64_t>(args.integer("random-weights", 0, 0, INT64_MAX));
    std::vector<std::pair<ValueId, Tensor>> weights = random_weights(graph, seed);
    if (derived == DerivedWeights::Computed) add_derived_weights(graph, weights);
    return weights;
  }
  WeightStore store;
  for (const std::string& path : args.values("weights")) store.add_file(path);
  if (auto config = args.value("config")) store.set_config(ModelConfig::load(*config));
  WeightBinding binding = store.bind(graph, derived);
  for (const std::string& note : binding.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  return std::move(binding.tensors);
}

}  // namespace

std::vector<std::pair<ValueId, Tensor>> load_weights(const Graph& graph, const Args& args) {
  return bind_weights(graph, args, DerivedWeights::Computed);
}

std::map<std::string, Tensor> load_inputs(const Graph& graph, const Args& args) {
  std::map<std::string, Tensor> inputs;
  auto is_graph_input = [&](const std::string& name) {
    return std::any_of(graph.inputs.begin(), graph.inputs.end(),
                       [&](ValueId id) { return graph.value(id).name == name; });
  };
  for (const std::string& path : args.values("inputs")) {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const std::string& name : file.names()) {
      if (!is_graph_input(name)) fail(path + ": tensor '" + name + "' is not an input of " + graph.source);
      inputs[name] = file.get(name);
    }
  }
  for (const std::string& spec : args.values("input")) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      fail("npusim: --input needs NAME=FILE.npy, got '" + spec + "'");
    inputs[spec.substr(0, eq)] = read_npy(spec.substr(eq + 1));
  }
  if (args.value("random-inputs")) {
    const auto seed = static_cast<uint64_t>(args.integer("random-inputs", 0, 0, INT64_MAX));
    for (ValueId id : graph.inputs)
      if (!inputs.count(graph.value(id).name)) inputs[graph.value(id).name] = random_input(graph.value(id), seed);
  }
  return inputs;
}

compiler::CompileOptions compile_options(const Args& args) {
  compiler::CompileOptions options;
  if (auto target = args.value("target")) options.target = *target;
  if (auto dtype = args.value("dtype")) {
    auto parsed = parse_dtype(*dtype);
    if (!parsed || !is_floating(*parsed) || *parsed == DType::Float64)
      fail("npusim: --dtype must be float32, float16 or bfloat16, got '" + *dtype + "'");
    options.compute_dtype = *parsed;
  }
  for (const std::string& name : args.values("disable")) options.disabled_passes.insert(name);
  options.allow_fallback = !args.flag("no-fallback");
  return options;
}

std::string pack_cache_directory(const Args& args) {
  std::string directory;
  if (const auto option = args.value("pack-cache")) {
    if (option->empty()) fail("--pack-cache needs a directory or 'off'");
    directory = *option;
  } else if (const char* variable = std::getenv("NPUSIM_PACK_CACHE")) {
    if (*variable == '\0') fail("NPUSIM_PACK_CACHE is set but empty: give it a directory or 'off'");
    directory = variable;
  } else if (const char* cache_home = std::getenv("XDG_CACHE_HOME"); cache_home && *cache_home) {
    directory = std::string(cache_home) + "/npusim/packed-weights";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    directory = std::string(home) + "/.cache/npusim/packed-weights";
  }
  return directory == "off" ? "" : directory;
}

bool is_program_file(const std::string& path) {
  return path.size() >= 7 && path.compare(path.size() - 7, 7, ".npubin") == 0;
}

PreparedModel prepare_model(const std::string& path, const Args& args, const BackendOptions& backend) {
  PreparedModel model;
  std::optional<compiler::PartitionPlan> plan;
  if (is_program_file(path)) {
    model.program = read_program(path);
    // A program compiled for a target file names the target; the file itself is given again with --target.
    const auto builtin = compiler::builtin_target_names();
    const std::string& target = model.program.target;
    if (!args.value("target") && std::find(builtin.begin(), builtin.end(), target) == builtin.end())
      fail(path + ": compiled for target '" + target + "'; give its target file with --target");
    model.target = compiler::load_target(args.value("target").value_or(target));
    if (model.target.name != target)
      fail(path + ": compiled for target '" + target + "', not '" + model.target.name + "'");
  } else {
    const Graph graph = read_torch_ir(path);
    check_supported(graph);
    const compiler::CompileOptions options = compile_options(args);
    compiler::CompileReport report;
    model.program = compiler::compile_graph(graph, options, &report);
    model.target = compiler::load_target(options.target);
    plan = std::move(report.partitions);
  }
  if (!plan) plan = compiler::partition_graph(model.program.graph, model.target, model.program.compute_dtype);
  // Every backend computes the derived weights itself; the CPU backend folds them while it packs.
  const auto weights = bind_weights(model.program.graph, args, DerivedWeights::LeftToBackend);
  model.partitions = plan->partitions.size();
  model.fallback_nodes = plan->fallback_nodes();
  BackendOptions options = backend;
  options.pack_cache = pack_cache_directory(args);
  model.executor = std::make_unique<DagExecutor>(model.program, std::move(*plan), weights, partition_backends(options));
  model.label =
      model.target.name + " on " + model.target.backend + ", " + std::string(dtype_name(model.program.compute_dtype));
  if (model.partitions > 1)
    model.label += ", " + std::to_string(model.partitions) + " partitions, " + std::to_string(model.fallback_nodes) +
                   " of " + std::to_string(model.program.graph.nodes.size()) + " nodes on the fallback " +
                   model.target.fallback;
  return model;
}

SessionOptions session_options(const Args& args) {
  SessionOptions options;
  if (const auto target = args.value("target")) options.backend = compiler::load_target(*target).backend;
  options.context = args.integer("ctx", 0, 1, int64_t{1} << 30);
  options.prefill_chunk = args.integer("prefill-chunk", 128, 1, int64_t{1} << 20);
  options.threads = static_cast<int>(args.integer("threads", 0, 0, 4096));
  if (const auto dtype = args.value("dtype")) {
    const auto parsed = parse_dtype(*dtype);
    if (!parsed || !is_floating(*parsed) || *parsed == DType::Float64)
      fail("--dtype must be float32, bfloat16 or float16, got '" + *dtype + "'");
    options.dtype = *parsed;
  }
  if (const auto quantize = args.value("quantize")) {
    if (*quantize == "int8")
      options.quantize = WeightQuantization::Int8;
    else if (*quantize != "none")
      fail("--quantize must be none or int8, got '" + *quantize + "'");
  }
  options.quantization_group = args.integer("quantize-group", 0, 0, int64_t{1} << 30);
  if (options.quantization_group % 8 != 0)
    fail("--quantize-group must be a multiple of 8, got " + std::to_string(options.quantization_group));
  if (options.quantization_group > 0 && options.quantize != WeightQuantization::Int8)
    fail("--quantize-group needs --quantize int8");
  if (const auto compact = args.value("compact-bf16")) {
    if (*compact != "on" && *compact != "off") fail("--compact-bf16 must be on or off, got '" + *compact + "'");
    options.compact_bf16 = *compact == "on";
    if (options.compact_bf16 && options.backend != "cpu")
      fail("--compact-bf16 on: compact weights are a CPU backend form; the target's backend is " + options.backend);
  }
  options.prefill_ir = args.value("prefill-ir").value_or("");
  options.decode_ir = args.value("decode-ir").value_or("");
  if (!options.prefill_ir.empty() && options.decode_ir.empty())
    fail("--prefill-ir needs --decode-ir (the decode step that uses the KV cache)");
  return options;
}

double peak_memory_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports kilobytes
}

}  // namespace npusim::cli
