#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "npusim/graph.h"

namespace npusim {

// Seeded stand-ins for real data, so any graph can run without a checkpoint. The same seed and tensor name
// always give the same values.
// Weights: rank >= 2 He-normal over the fan-in; rank-1 norm scales and variances near 1; other vectors small.
Tensor random_weight(const Value& weight, uint64_t seed);
// Every source weight of `graph` (not the ones a transform derives): its constant where the graph carries one, else
// random_weight. Derived weights are the caller's (add_derived_weights).
std::vector<std::pair<ValueId, Tensor>> random_weights(const Graph& graph, uint64_t seed);
// Inputs: floats standard normal; integers 0; bools true.
Tensor random_input(const Value& input, uint64_t seed);

}  // namespace npusim
