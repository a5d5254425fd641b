// Seeded uniform values for kernel tests: the same seed always gives the same values.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "npusim/tensor.h"

namespace npusim::test {

inline std::vector<float> random_floats(int64_t count, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& x : values) x = dist(gen);
  return values;
}

// An fp32 tensor of random_floats.
inline Tensor random_tensor(const Shape& shape, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  Tensor t(DType::Float32, shape);
  const std::vector<float> values = random_floats(t.numel(), seed, low, high);
  std::copy(values.begin(), values.end(), t.mutable_data<float>());
  return t;
}

}  // namespace npusim::test
