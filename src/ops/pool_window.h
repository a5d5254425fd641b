#pragma once
// The window of a 2-D pooling node from its attributes: kernel_size, stride (the kernel's when absent), padding and
// dilation, each one number or two. The registry's shape inference reports why a node has none; the backends'
// kernels leave such a node to the reference.
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "npusim/attrs.h"

namespace npusim::ops {

struct PoolWindow {
  std::array<int64_t, 2> kernel{1, 1}, stride{1, 1}, pad{0, 0}, dilation{1, 1};
};

// The window, or (empty `window`) why the attributes give none: an attribute of other than one or two values, a
// kernel, stride or dilation below 1, negative padding. Without `with_dilation` the dilation is 1 whatever the node
// says.
struct PoolWindowReading {
  std::optional<PoolWindow> window;
  std::string reason;  // "'stride' needs 1 or 2 values, got 3", "kernel_size must be positive, got 0", ...
};
PoolWindowReading read_pool_window(const Attrs& attrs, bool with_dilation);

inline std::optional<PoolWindow> pool_window(const Attrs& attrs, bool with_dilation) {
  return read_pool_window(attrs, with_dilation).window;
}

}  // namespace npusim::ops
