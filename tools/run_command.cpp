#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "cli_args.h"
#include "commands.h"
#include "ir/torch_ir_reader.h"
#include "llm/model_config.h"
#include "runtime/compare.h"
#include "runtime/npy.h"
#include "runtime/random_fill.h"
#include "runtime/reference_executor.h"
#include "runtime/safetensors.h"
#include "runtime/weight_store.h"

namespace npusim::cli {

namespace {

const std::vector<OptionSpec> kRunOptions = {
    {"weights", true, "a .safetensors file with the model's weights (repeatable)"},
    {"config", true, "Hugging Face config.json (rotary inv_freq when the weights lack it)"},
    {"inputs", true, "a .safetensors file with tensors named as the graph inputs (repeatable)"},
    {"input", true, "NAME=FILE.npy: one graph input from a .npy file (repeatable)"},
    {"outputs", true, "write the graph outputs to this .safetensors file"},
    {"random-weights", true, "SEED: seeded random weights instead of --weights"},
    {"random-inputs", true, "SEED: seeded random values for inputs not given otherwise"},
    {"top", true, "K: print the top-K classes of the last row of the first output"},
    {"iters", true, "N: run N times and report min and median latency (default 1)"},
    {"help", false, "show this help"},
};

std::map<std::string, Tensor> gather_inputs(const Graph& graph, const Args& args) {
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
      fail("npusim run: --input needs NAME=FILE.npy, got '" + spec + "'");
    inputs[spec.substr(0, eq)] = read_npy(spec.substr(eq + 1));
  }
  if (args.value("random-inputs")) {
    const auto seed = static_cast<uint64_t>(args.integer("random-inputs", 0, 0, INT64_MAX));
    for (ValueId id : graph.inputs)
      if (!inputs.count(graph.value(id).name)) inputs[graph.value(id).name] = random_input(graph.value(id), seed);
  }
  return inputs;
}

std::vector<std::pair<ValueId, Tensor>> gather_weights(const Graph& graph, const Args& args) {
  if (args.value("random-weights")) {
    if (!args.values("weights").empty()) fail("npusim run: give either --weights or --random-weights, not both");
    const auto seed = static_cast<uint64_t>(args.integer("random-weights", 0, 0, INT64_MAX));
    std::vector<std::pair<ValueId, Tensor>> weights;
    for (ValueId id : graph.weights) weights.emplace_back(id, random_weight(graph.value(id), seed));
    return weights;
  }
  WeightStore store;
  for (const std::string& path : args.values("weights")) store.add_file(path);
  if (auto config = args.value("config")) store.set_config(ModelConfig::load(*config));
  WeightBinding binding = store.bind(graph);
  for (const std::string& note : binding.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  return std::move(binding.tensors);
}

void print_top(const NamedTensors& outputs, int k) {
  if (outputs.empty()) return;
  const Tensor logits = outputs.front().second.to(DType::Float32);
  const int64_t row = logits.rank() == 0 ? 1 : logits.shape().back();
  if (row == 0) return;
  const float* last = logits.data<float>() + (logits.numel() - row);
  std::printf("top-%d of '%s':\n", k, outputs.front().first.c_str());
  for (int64_t index : top_k_indices(last, row, k))
    std::printf("  class %6lld  %10.4f\n", static_cast<long long>(index), last[index]);
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  const Args args("run", kRunOptions, argv);
  if (args.flag("help")) {
    std::printf("usage: npusim run GRAPH.json [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (args.positionals().size() != 1) fail("npusim run: expected one graph file (see npusim run --help)");
  const int64_t iters = args.integer("iters", 1, 1, 1000000);
  const int top = static_cast<int>(args.integer("top", 0, 0, 1000000));

  const Graph graph = read_torch_ir(args.positionals()[0]);
  check_supported(graph);
  const auto weights = gather_weights(graph, args);
  const auto inputs = gather_inputs(graph, args);
  const ReferenceExecutor executor(graph, weights);

  std::vector<double> latencies;
  NamedTensors outputs;
  for (int64_t i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    outputs = executor.run(inputs);
    latencies.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(latencies.begin(), latencies.end());

  for (const auto& [name, tensor] : outputs)
    std::printf("output %s %s %s\n", name.c_str(), shape_string(tensor.shape()).c_str(),
                std::string(dtype_name(tensor.dtype())).c_str());
  if (top > 0) print_top(outputs, top);
  std::printf("latency: min %.2f ms, median %.2f ms over %lld run(s) (reference path)\n", latencies.front(),
              latencies[latencies.size() / 2], static_cast<long long>(iters));
  if (auto path = args.value("outputs")) write_safetensors(*path, outputs);
  return 0;
}

}  // namespace npusim::cli
