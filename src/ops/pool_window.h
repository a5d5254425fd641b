#pragma once
// The window of a 2-D pooling node from its attributes: kernel_size, stride (the kernel's when absent), padding and
// dilation, each one number or two. For the backends' kernels, which leave a node they cannot take to the reference
// (whose shape inference reports what is wrong).
#include <array>
#include <cstdint>
#include <optional>

#include "npusim/attrs.h"

namespace npusim::ops {

struct PoolWindow {
  std::array<int64_t, 2> kernel{1, 1}, stride{1, 1}, pad{0, 0}, dilation{1, 1};
};

// Nothing when an attribute is malformed or out of range (a kernel, stride or dilation below 1, negative padding);
// without `with_dilation` the dilation is 1 whatever the node says.
std::optional<PoolWindow> pool_window(const Attrs& attrs, bool with_dilation);

}  // namespace npusim::ops
