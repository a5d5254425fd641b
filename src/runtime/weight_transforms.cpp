#include "runtime/weight_transforms.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

namespace npusim {

namespace {

std::vector<double> bn_scale(const Tensor& gamma, const Tensor& var, double eps, int64_t channels,
                             const std::string& name) {
  if (var.numel() != channels)
    fail(name + ": running_var has " + std::to_string(var.numel()) + " values for " + std::to_string(channels) +
         " channels");
  std::vector<double> scale(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const double g = gamma.defined() && gamma.numel() ? gamma.element_as_double(c) : 1.0;
    scale[static_cast<size_t>(c)] = g / std::sqrt(var.element_as_double(c) + eps);
  }
  return scale;
}

int64_t leading_dim(const Shape& shape) { return shape.empty() ? 1 : shape[0]; }

}  // namespace

std::vector<double> bn_fold_scales(const WeightTransform& transform, std::span<const Tensor> sources, int64_t channels,
                                   const std::string& name) {
  return bn_scale(sources[1], sources[2], transform.params.get_float("eps", 1e-5), channels, name);
}

Tensor scale_rows(const Tensor& weight, std::span<const double> scales, int threads) {
  const int64_t channels = leading_dim(weight.shape());
  if (weight.dtype() != DType::Float32 || static_cast<int64_t>(scales.size()) != channels)
    fail("scale_rows: needs an fp32 weight and one scale per row, got " + std::string(dtype_name(weight.dtype())) +
         " " + shape_string(weight.shape()) + " and " + std::to_string(scales.size()) + " scales");
  Tensor out(DType::Float32, weight.shape());  // written once, straight from the (often mapped) source
  const int64_t per_channel = channels ? weight.numel() / channels : 0;
  const float* in = weight.data<float>();
  float* data = out.mutable_data<float>();
  const auto fold = [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const double channel_scale = scales[static_cast<size_t>(c)];
      for (int64_t i = c * per_channel; i < (c + 1) * per_channel; ++i)
        data[i] = static_cast<float>(in[i] * channel_scale);
    }
  };
  // Large weights are split over the threads: most of the cost is the first touch of the output's fresh pages.
  const int wanted = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  const int64_t workers =
      weight.numel() >= (int64_t{1} << 18) ? std::max<int64_t>(1, std::min<int64_t>({wanted, channels, 8})) : 1;
  std::vector<std::thread> helpers;
  for (int64_t w = 1; w < workers; ++w)
    helpers.emplace_back(fold, channels * w / workers, channels * (w + 1) / workers);
  fold(0, channels / workers);
  for (std::thread& helper : helpers) helper.join();
  return out;
}

Tensor apply_weight_transform(const WeightTransform& transform, std::span<const Tensor> sources,
                              const std::string& name, int threads) {
  const double eps = transform.params.get_float("eps", 1e-5);
  if (transform.kind == "bn_fold_weight") {
    const Tensor weight = sources[0].to(DType::Float32);
    const int64_t channels = leading_dim(weight.shape());
    return scale_rows(weight, bn_fold_scales(transform, sources, channels, name), threads);
  }
  if (transform.kind == "bn_fold_bias") {
    const Tensor& bias = sources[0];
    const Tensor& beta = sources[2];
    const Tensor& mean = sources[3];
    const int64_t channels = mean.numel();
    const auto scale = bn_scale(sources[1], sources[4], eps, channels, name);
    Tensor out(DType::Float32, {channels});
    for (int64_t c = 0; c < channels; ++c) {
      const double b = bias.defined() && bias.numel() ? bias.element_as_double(c) : 0.0;
      const double shift = beta.defined() && beta.numel() ? beta.element_as_double(c) : 0.0;
      out.mutable_data<float>()[c] =
          static_cast<float>((b - mean.element_as_double(c)) * scale[static_cast<size_t>(c)] + shift);
    }
    return out;
  }
  fail(name + ": unknown weight transform '" + transform.kind + "'");
}

namespace {

enum class WeightsWanted { All, UnboundDerived };

// By ValueId, the value of every weight a node or a graph output reads (other entries undefined): the bound tensor,
// else the graph's constant (by weight key or name), else computed by its transform (sources first, each once).
// UnboundDerived leaves out the weights without a transform and those `bound` already holds; derived weights that
// options.leave_derived names are replaced by their sources.
std::vector<Tensor> resolve_read_weights(const Graph& graph, const std::vector<std::pair<ValueId, Tensor>>& bound,
                                         WeightsWanted wanted, const ResolveOptions& options = {}) {
  std::vector<Tensor> given(graph.values.size());
  std::vector<bool> is_bound(graph.values.size(), false);
  for (const auto& [id, tensor] : bound) {
    given.at(static_cast<size_t>(id)) = tensor;
    is_bound[static_cast<size_t>(id)] = true;
  }
  std::function<const Tensor&(ValueId, const std::string&)> value_of = [&](ValueId id,
                                                                           const std::string& user) -> const Tensor& {
    Tensor& slot = given[static_cast<size_t>(id)];
    if (slot.defined()) return slot;
    const Value& value = graph.value(id);
    for (const std::string* key : {&value.weight_key, &value.name})
      if (auto it = graph.constants.find(*key); it != graph.constants.end()) return slot = it->second;
    if (!value.transform)
      fail(graph.source + ": weight '" + (value.weight_key.empty() ? value.name : value.weight_key) + "' (used by " +
           user + ") has no value");
    std::vector<Tensor> sources;
    for (int32_t source : value.transform->sources)
      sources.push_back(source < 0 ? Tensor() : value_of(source, "the derived weight '" + value.name + "'"));
    slot = apply_weight_transform(*value.transform, sources, value.name, options.threads);
    if (slot.shape() != value.meta.shape)
      fail(graph.source + ": weight transform '" + value.transform->kind + "' for '" + value.name + "' gave shape " +
           shape_string(slot.shape()) + ", expected " + shape_string(value.meta.shape));
    return slot;
  };
  std::vector<Tensor> resolved(graph.values.size());
  auto resolve = [&](ValueId id, const std::string& user) {
    const Value& value = graph.value(id);
    const auto index = static_cast<size_t>(id);
    if (value.kind != ValueKind::Weight || resolved[index].defined()) return;
    if (wanted == WeightsWanted::UnboundDerived && (!value.transform || is_bound[index])) return;
    if (value.transform && !is_bound[index] && options.leave_derived && options.leave_derived(id)) {
      for (int32_t source : value.transform->sources)
        if (source >= 0)
          resolved[static_cast<size_t>(source)] = value_of(source, "the derived weight '" + value.name + "'");
      return;
    }
    resolved[index] = value_of(id, user);
  };
  for (const Node& node : graph.nodes)
    for (ValueId id : node.inputs) resolve(id, "node '" + node.name + "'");
  for (ValueId id : graph.outputs) resolve(id, "the graph outputs");
  return resolved;
}

}  // namespace

void add_derived_weights(const Graph& graph, std::vector<std::pair<ValueId, Tensor>>& tensors) {
  const std::vector<Tensor> derived = resolve_read_weights(graph, tensors, WeightsWanted::UnboundDerived);
  for (ValueId id : graph.weights)
    if (const Tensor& tensor = derived[static_cast<size_t>(id)]; tensor.defined()) tensors.emplace_back(id, tensor);
}

std::vector<Tensor> resolve_weights(const Graph& graph, const std::vector<std::pair<ValueId, Tensor>>& binding,
                                    const ResolveOptions& options) {
  for (const auto& [id, tensor] : binding) {
    if (id < 0 || static_cast<size_t>(id) >= graph.values.size() || graph.value(id).kind != ValueKind::Weight)
      fail(graph.source + ": weight binding names value " + std::to_string(id) + ", which is not a weight");
    const Value& value = graph.value(id);
    if (tensor.shape() != value.meta.shape)
      fail(graph.source + ": weight '" + value.weight_key + "' has shape " + shape_string(tensor.shape()) +
           ", the graph expects " + shape_string(value.meta.shape));
  }
  return resolve_read_weights(graph, binding, WeightsWanted::All, options);
}

}  // namespace npusim
