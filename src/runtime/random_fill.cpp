#include "runtime/random_fill.h"

#include <cmath>
#include <functional>
#include <random>

namespace npusim {

namespace {

std::mt19937_64 generator_for(const std::string& name, uint64_t seed) {
  return std::mt19937_64(seed * 0x9E3779B97F4A7C15ull ^ std::hash<std::string>{}(name));
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Tensor random_weight(const Value& weight, uint64_t seed) {
  const std::string& key = weight.weight_key.empty() ? weight.name : weight.weight_key;
  Tensor out(DType::Float32, weight.meta.shape);
  if (!is_floating(weight.meta.dtype)) return out.to(weight.meta.dtype);
  auto generator = generator_for(key, seed);
  float* data = out.mutable_data<float>();
  const int64_t n = out.numel();
  if (weight.meta.shape.size() >= 2) {
    const double fan_in = static_cast<double>(n / std::max<int64_t>(weight.meta.shape[0], 1));
    std::normal_distribution<float> normal(0.0f, static_cast<float>(std::sqrt(2.0 / std::max(fan_in, 1.0))));
    for (int64_t i = 0; i < n; ++i) data[i] = normal(generator);
  } else if (ends_with(key, "running_var") || ends_with(key, ".weight")) {
    std::uniform_real_distribution<float> near_one(0.5f, 1.5f);
    for (int64_t i = 0; i < n; ++i) data[i] = near_one(generator);
  } else {
    std::normal_distribution<float> small(0.0f, 0.1f);
    for (int64_t i = 0; i < n; ++i) data[i] = small(generator);
  }
  return out;
}

std::vector<std::pair<ValueId, Tensor>> random_weights(const Graph& graph, uint64_t seed) {
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (ValueId id : graph.weights) {
    const Value& value = graph.value(id);
    if (value.transform) continue;
    const auto constant = graph.constants.find(value.weight_key);
    weights.emplace_back(id, constant != graph.constants.end() ? constant->second : random_weight(value, seed));
  }
  return weights;
}

Tensor random_input(const Value& input, uint64_t seed) {
  Tensor out(DType::Float32, input.meta.shape);
  if (input.meta.dtype == DType::Bool) {
    for (int64_t i = 0; i < out.numel(); ++i) out.mutable_data<float>()[i] = 1.0f;
  } else if (is_floating(input.meta.dtype)) {
    auto generator = generator_for(input.name, seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < out.numel(); ++i) out.mutable_data<float>()[i] = normal(generator);
  }
  return out.to(input.meta.dtype);
}

}  // namespace npusim
