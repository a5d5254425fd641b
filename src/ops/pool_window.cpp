#include "ops/pool_window.h"

#include <string>
#include <vector>

namespace npusim::ops {
namespace {

std::optional<std::array<int64_t, 2>> pair_attr(const Attrs& attrs, const std::string& name,
                                                std::vector<int64_t> fallback) {
  std::vector<int64_t> values = attrs.get_ints(name, std::move(fallback));
  if (values.size() == 1) values.assign(2, values[0]);
  if (values.size() != 2) return std::nullopt;
  return std::array<int64_t, 2>{values[0], values[1]};
}

}  // namespace

std::optional<PoolWindow> pool_window(const Attrs& attrs, bool with_dilation) {
  const auto kernel = pair_attr(attrs, "kernel_size", {});
  const auto stride = attrs.get_ints("stride", {}).empty() ? kernel : pair_attr(attrs, "stride", {});
  const auto pad = pair_attr(attrs, "padding", {0});
  const auto dilation = with_dilation ? pair_attr(attrs, "dilation", {1}) : std::array<int64_t, 2>{1, 1};
  if (!kernel || !stride || !pad || !dilation) return std::nullopt;
  const PoolWindow window{*kernel, *stride, *pad, *dilation};
  for (int d = 0; d < 2; ++d)
    if (window.kernel[d] < 1 || window.stride[d] < 1 || window.dilation[d] < 1 || window.pad[d] < 0)
      return std::nullopt;
  return window;
}

}  // namespace npusim::ops
