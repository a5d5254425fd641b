// The explicit patch (im2col) matrix of a convolution operand, the reference the packed-patch tests compare with.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/packed_gemm.h"

namespace npusim::test {

// [channels * kernel_h * kernel_w, out_h * out_w] of s.input, zero where a tap falls in the padding.
inline std::vector<float> explicit_patch_matrix(const cpu::Im2colOperand& s) {
  const int64_t n = s.out_h * s.out_w;
  std::vector<float> patches(static_cast<size_t>(s.channels * s.kernel_h * s.kernel_w * n), 0.0f);
  for (int64_t c = 0; c < s.channels; ++c)
    for (int64_t ky = 0; ky < s.kernel_h; ++ky)
      for (int64_t kx = 0; kx < s.kernel_w; ++kx)
        for (int64_t oy = 0; oy < s.out_h; ++oy)
          for (int64_t ox = 0; ox < s.out_w; ++ox) {
            const int64_t iy = oy * s.stride_h - s.pad_h + ky * s.dilation_h;
            const int64_t ix = ox * s.stride_w - s.pad_w + kx * s.dilation_w;
            if (iy >= 0 && iy < s.height && ix >= 0 && ix < s.width)
              patches[static_cast<size_t>(((c * s.kernel_h + ky) * s.kernel_w + kx) * n + oy * s.out_w + ox)] =
                  s.input[(c * s.height + iy) * s.width + ix];
          }
  return patches;
}

}  // namespace npusim::test
