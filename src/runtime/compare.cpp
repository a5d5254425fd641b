#include "runtime/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

namespace npusim {

std::vector<int64_t> top_k_indices(const float* values, int64_t count, int k) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  const auto keep = static_cast<size_t>(std::min<int64_t>(k, count));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    [&](int64_t a, int64_t b) { return values[a] > values[b] || (values[a] == values[b] && a < b); });
  order.resize(keep);
  return order;
}

Comparison compare_tensors(const Tensor& actual_in, const Tensor& reference_in, int top_k) {
  if (actual_in.shape() != reference_in.shape())
    fail("cannot compare tensors of shapes " + shape_string(actual_in.shape()) + " and " +
         shape_string(reference_in.shape()));
  const Tensor actual = actual_in.to(DType::Float32);
  const Tensor reference = reference_in.to(DType::Float32);
  const float* a = actual.data<float>();
  const float* r = reference.data<float>();
  Comparison result;
  result.top_k = top_k;
  result.elements = actual.numel();
  double mean_a = 0, mean_r = 0;
  for (int64_t i = 0; i < result.elements; ++i) {
    mean_a += a[i];
    mean_r += r[i];
    const bool nan_a = std::isnan(a[i]), nan_r = std::isnan(r[i]);
    const double diff = nan_a && nan_r   ? 0.0
                        : nan_a || nan_r ? std::numeric_limits<double>::infinity()
                                         : std::abs(static_cast<double>(a[i]) - r[i]);
    result.max_abs_diff = std::max(result.max_abs_diff, diff);
    if (std::isfinite(r[i])) result.max_abs_reference = std::max(result.max_abs_reference, std::abs(double(r[i])));
  }
  if (result.elements > 0) {
    mean_a /= static_cast<double>(result.elements);
    mean_r /= static_cast<double>(result.elements);
  }
  double cov = 0, var_a = 0, var_r = 0;
  for (int64_t i = 0; i < result.elements; ++i) {
    cov += (a[i] - mean_a) * (r[i] - mean_r);
    var_a += (a[i] - mean_a) * (a[i] - mean_a);
    var_r += (r[i] - mean_r) * (r[i] - mean_r);
  }
  if (var_a == 0 && var_r == 0) result.pearson = result.max_abs_diff == 0 ? 1.0 : 0.0;
  else if (var_a == 0 || var_r == 0) result.pearson = 0.0;
  else result.pearson = cov / std::sqrt(var_a * var_r);
  if (std::isnan(result.pearson)) result.pearson = 0.0;

  const int64_t row_length = actual.rank() == 0 ? 1 : actual.shape().back();
  result.rows = row_length == 0 ? 0 : result.elements / row_length;
  for (int64_t row = 0; row < result.rows; ++row) {
    const auto ta = top_k_indices(a + row * row_length, row_length, top_k);
    const auto tr = top_k_indices(r + row * row_length, row_length, top_k);
    if (!ta.empty() && ta[0] == tr[0]) ++result.argmax_matches;
    auto sa = ta, sr = tr;
    std::sort(sa.begin(), sa.end());
    std::sort(sr.begin(), sr.end());
    if (sa == sr) ++result.topk_identical_rows;
  }
  return result;
}

std::string Comparison::summary() const {
  char text[256];
  std::snprintf(text, sizeof text, "pearson %.7f  max|diff| %.3g  argmax %lld/%lld  top-%d %lld/%lld", pearson,
                max_abs_diff, static_cast<long long>(argmax_matches), static_cast<long long>(rows), top_k,
                static_cast<long long>(topk_identical_rows), static_cast<long long>(rows));
  return text;
}

}  // namespace npusim
