#include "ops/pool_window.h"

#include <string>
#include <vector>

namespace npusim::ops {
namespace {

std::optional<std::array<int64_t, 2>> pair_attr(const Attrs& attrs, const std::string& name,
                                                std::vector<int64_t> fallback, std::string& reason) {
  std::vector<int64_t> values = attrs.get_ints(name, std::move(fallback));
  if (values.size() == 1) values.assign(2, values[0]);
  if (values.size() == 2) return std::array<int64_t, 2>{values[0], values[1]};
  if (reason.empty()) reason = "'" + name + "' needs 1 or 2 values, got " + std::to_string(values.size());
  return std::nullopt;
}

}  // namespace

PoolWindowReading read_pool_window(const Attrs& attrs, bool with_dilation) {
  std::string reason;
  const auto kernel = pair_attr(attrs, "kernel_size", {}, reason);
  const auto stride = attrs.get_ints("stride", {}).empty() ? kernel : pair_attr(attrs, "stride", {}, reason);
  const auto pad = pair_attr(attrs, "padding", {0}, reason);
  const auto dilation = with_dilation ? pair_attr(attrs, "dilation", {1}, reason) : std::array<int64_t, 2>{1, 1};
  if (!kernel || !stride || !pad || !dilation) return {std::nullopt, reason};
  const PoolWindow window{*kernel, *stride, *pad, *dilation};
  const auto below = [](const std::array<int64_t, 2>& values, int64_t minimum, const char* what) -> std::string {
    for (int64_t v : values)
      if (v < minimum)
        return std::string(what) + " must be " + (minimum == 0 ? "non-negative" : "positive") + ", got " +
               std::to_string(v);
    return "";
  };
  for (const std::string& why : {below(window.kernel, 1, "kernel_size"), below(window.stride, 1, "stride"),
                                 below(window.dilation, 1, "dilation"), below(window.pad, 0, "padding")})
    if (!why.empty()) return {std::nullopt, why};
  return {window, ""};
}

}  // namespace npusim::ops
