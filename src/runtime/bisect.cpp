#include "runtime/bisect.h"

#include <cmath>

#include "compiler/memory_plan.h"
#include "runtime/backend.h"

namespace npusim {

namespace {

bool agrees(const Comparison& c, const BisectOptions& options) {
  return c.pearson >= options.min_pearson &&
         c.max_abs_diff <= options.max_abs_relative * std::max(1.0, c.max_abs_reference);
}

// Every node output of a reference run, by value name.
std::map<std::string, Tensor> trace_values(const Graph& graph, const BindWeights& bind,
                                           const std::map<std::string, Tensor>& inputs) {
  std::map<std::string, Tensor> values;
  const ReferenceExecutor executor(graph, bind(graph));
  executor.run(inputs, [&](const Node& node, const std::vector<Tensor>& outputs) {
    for (size_t i = 0; i < outputs.size(); ++i) values[graph.value(node.outputs[i]).name] = outputs[i];
  });
  return values;
}

}  // namespace

BisectResult bisect_passes(const Graph& graph, const std::vector<compiler::Pass>& passes, const BindWeights& bind,
                           const std::map<std::string, Tensor>& inputs, const BisectOptions& options) {
  const std::map<std::string, Tensor> reference_values = trace_values(graph, bind, inputs);
  NamedTensors reference_outputs;
  for (ValueId id : graph.outputs) {
    const std::string& name = graph.value(id).name;
    auto it = reference_values.find(name);
    reference_outputs.emplace_back(name, it != reference_values.end() ? it->second : Tensor());
  }

  std::vector<compiler::Pass> baseline;
  std::vector<compiler::Pass> fusions;
  for (const compiler::Pass& pass : passes) (pass.is_fusion ? fusions : baseline).push_back(pass);

  auto backend = make_backend("cpu");
  BisectResult result;
  auto evaluate = [&](const std::string& label, std::vector<compiler::Pass> enabled) {
    BisectStep step;
    step.pass = label;
    Graph compiled = graph;
    compiler::PassContext context;
    compiler::run_pass_list(compiled, enabled, context);
    Program program;
    program.compute_dtype = options.compute_dtype;
    program.plan = compiler::plan_memory(compiled, options.compute_dtype);
    program.graph = std::move(compiled);
    auto prepared = backend->prepare(program, bind(program.graph));
    const NamedTensors outputs = prepared->run(inputs);
    for (size_t i = 0; i < outputs.size() && i < reference_outputs.size(); ++i) {
      step.outputs.push_back(compare_tensors(outputs[i].second, reference_outputs[i].second));
      step.diverged = step.diverged || !agrees(step.outputs.back(), options);
    }
    if (step.diverged) {
      const Graph& g = program.graph;
      const auto values = trace_values(g, bind, inputs);
      for (const Node& node : g.nodes) {
        for (ValueId id : node.outputs) {
          const std::string& name = g.value(id).name;
          auto mine = values.find(name);
          auto theirs = reference_values.find(name);
          if (mine == values.end() || theirs == reference_values.end()) continue;
          if (mine->second.shape() != theirs->second.shape()) continue;
          const Comparison c = compare_tensors(mine->second, theirs->second);
          if (agrees(c, options)) continue;
          step.first_node = node.name;
          step.first_node_op = node.op;
          step.first_node_comparison = c;
          break;
        }
        if (!step.first_node.empty()) break;
      }
    }
    result.steps.push_back(std::move(step));
  };

  evaluate("", baseline);
  for (const compiler::Pass& fusion : fusions) {
    std::vector<compiler::Pass> enabled = baseline;
    enabled.push_back(fusion);
    evaluate(fusion.name, enabled);
  }
  for (size_t i = 0; i < result.steps.size(); ++i)
    if (result.steps[i].diverged) {
      result.first_bad = i;
      break;
    }
  return result;
}

std::string format_bisect(const BisectResult& result) {
  std::string text;
  for (const BisectStep& step : result.steps) {
    text += (step.pass.empty() ? std::string("baseline (no fusions)") : "+ " + step.pass) + ": " +
            (step.diverged ? "DIVERGES" : "ok") + "\n";
    for (const Comparison& c : step.outputs) text += "    " + c.summary() + "\n";
    if (!step.first_node.empty())
      text += "    first diverging node: " + step.first_node + " (" + step.first_node_op + ")  " +
              step.first_node_comparison->summary() + "\n";
  }
  if (result.first_bad)
    text += "first divergence: " +
            (result.steps[*result.first_bad].pass.empty() ? std::string("the baseline itself")
                                                          : "pass " + result.steps[*result.first_bad].pass) +
            "\n";
  else
    text += "no divergence\n";
  return text;
}

}  // namespace npusim
