#pragma once
#include <string>

#include "npusim/tensor.h"

namespace npusim {

// How closely one output matches a reference. Top-k and argmax are taken per row of the last dimension.
struct Comparison {
  int64_t elements = 0;
  double pearson = 0.0;       // 1.0 for identical constant tensors
  double max_abs_diff = 0.0;  // NaN on one side only counts as infinite
  double max_abs_reference = 0.0;
  int64_t rows = 0;
  int64_t argmax_matches = 0;
  int64_t topk_identical_rows = 0;  // rows whose top-k sets are equal
  int top_k = 5;

  bool all_argmax_match() const { return argmax_matches == rows; }
  bool all_topk_match() const { return topk_identical_rows == rows; }
  std::string summary() const;
};

// Fails when shapes differ.
Comparison compare_tensors(const Tensor& actual, const Tensor& reference, int top_k = 5);

// Indices of the k largest values of a 1-D slice, largest first (ties by lower index).
std::vector<int64_t> top_k_indices(const float* values, int64_t count, int k);

}  // namespace npusim
