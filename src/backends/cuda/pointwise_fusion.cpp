#include "backends/cuda/pointwise_fusion.h"

#include <algorithm>
#include <map>

#include "backends/cuda/pointwise_ops.h"
#include "ops/op_util.h"

namespace npusim::cuda {

namespace {

class RunBuilder {
 public:
  RunBuilder(const FusionSite& site, const std::vector<std::vector<size_t>>& consumers)
      : site_(site), graph_(site.graph), consumers_(consumers) {}

  // Whether node n may be in a run of output shape `shape`.
  bool eligible(size_t n, const Shape& shape) const {
    const Node& node = graph_.nodes[n];
    if (node.outputs.size() != 1 || node.inputs.empty()) return false;
    const DeviceValue out = site_.value_at(node.outputs[0]);
    if (out.meta.shape != shape || !cpu::is_float_elem(out.elem) || site_.is_state(node.outputs[0])) return false;
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (!takes_elem(node, i, site_.value_at(node.inputs[i]).elem)) return false;
    return pointwise_steps_of(node, std::vector<int>(node.inputs.size(), 0), 0).has_value();
  }

  // Whether every value nodes first..last-1 make is read only by nodes first..last.
  bool closed(size_t first, size_t last) const {
    for (size_t n = first; n < last; ++n)
      for (size_t reader : consumers_[static_cast<size_t>(graph_.nodes[n].outputs[0])])
        if (reader < first || reader > last) return false;
    return true;
  }

  std::optional<PointwiseRun> build(size_t first, size_t last) const {
    const auto produced_inside = [&](ValueId id) {
      const Value& value = graph_.value(id);
      return value.kind == ValueKind::NodeOutput && value.producer >= static_cast<int32_t>(first) &&
             value.producer <= static_cast<int32_t>(last);
    };
    const ValueId output = graph_.nodes[last].outputs[0];
    const DeviceValue out = site_.value_at(output);
    PointwiseKernel kernel;
    kernel.shape = out.meta.shape;
    kernel.out_elem = out.elem;
    std::vector<ValueId> externals;
    std::vector<DeviceValue> inputs;
    for (size_t n = first; n <= last; ++n)
      for (ValueId id : graph_.nodes[n].inputs) {
        if (produced_inside(id) || std::find(externals.begin(), externals.end(), id) != externals.end()) continue;
        const DeviceValue value = site_.value_at(id);
        if (!readable_beside(value, out)) return std::nullopt;
        externals.push_back(id);
        inputs.push_back(value);
        kernel.inputs.push_back({value.elem, ops::broadcast_strides(value.meta.shape, kernel.shape)});
      }
    std::map<ValueId, int> value_of;
    for (size_t k = 0; k < externals.size(); ++k) value_of[externals[k]] = static_cast<int>(k);
    std::string label;
    for (size_t n = first; n <= last; ++n) {
      const Node& node = graph_.nodes[n];
      std::vector<int> in;
      for (ValueId id : node.inputs) in.push_back(value_of.at(id));
      const int first_value = static_cast<int>(externals.size() + kernel.steps.size());
      std::optional<std::vector<PointwiseStep>> steps = pointwise_steps_of(node, in, first_value);
      if (!steps) return std::nullopt;
      kernel.steps.insert(kernel.steps.end(), steps->begin(), steps->end());
      value_of[node.outputs[0]] = static_cast<int>(externals.size() + kernel.steps.size()) - 1;
      label += (label.empty() ? "" : "+") + node.op;
    }
    std::optional<Launch> launch;
    try {
      launch = generated_pointwise(graph_.nodes[last], std::move(kernel), out, inputs);
    } catch (const Error&) {
      // A run whose source does not compile stays unfused: its nodes take their own kernels, as a single node whose
      // source does not compile runs on the host.
    }
    if (!launch) return std::nullopt;
    return PointwiseRun{last, std::move(*launch), label};
  }

 private:
  const FusionSite& site_;
  const Graph& graph_;
  const std::vector<std::vector<size_t>>& consumers_;
};

}  // namespace

std::optional<PointwiseRun> fuse_pointwise_run(const FusionSite& site, size_t first,
                                               const std::vector<std::vector<size_t>>& consumers,
                                               const std::function<bool(size_t)>& taken) {
  const Graph& graph = site.graph;
  const Node& head = graph.nodes[first];
  if (head.outputs.size() != 1) return std::nullopt;
  const Shape shape = graph.value(head.outputs[0]).meta.shape;
  RunBuilder builder(site, consumers);
  if (!builder.eligible(first, shape)) return std::nullopt;
  size_t end = first + 1;
  while (end < graph.nodes.size() && !taken(end) && builder.eligible(end, shape)) ++end;
  for (size_t last = end - 1; last > first; --last) {
    if (!builder.closed(first, last)) continue;
    if (std::optional<PointwiseRun> run = builder.build(first, last)) return run;
  }
  return std::nullopt;
}

}  // namespace npusim::cuda
