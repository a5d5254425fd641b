// The reference the direct convolution kernels' tests compare with: one output plane over `channels` input planes
// by a direct loop in double, zero outside the input, clamped to [low, high]; and their geometries.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace npusim::test {

// A square kernel k over an h x w input with the same stride (or stride_w across), padding and dilation on both
// sides; the output size follows.
template <class Geometry>
Geometry conv_geometry(int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                       int64_t stride_w = 0) {
  Geometry g;
  g.in = {h, w};
  g.kernel = {k, k};
  g.stride = {stride, stride_w > 0 ? stride_w : stride};
  g.dilation = {dilation, dilation};
  g.pad = {pad, pad};
  for (int d = 0; d < 2; ++d) g.out[d] = (g.in[d] + 2 * g.pad[d] - g.dilation[d] * (k - 1) - 1) / g.stride[d] + 1;
  return g;
}

// `g` has in, kernel, stride, dilation, pad and out (a ConvWindow); `in` points at the
// first of the planes ([channels][in_h][in_w]), `w` at their taps ([channels][kernel_h * kernel_w]).
template <class Geometry>
std::vector<float> direct_conv_plane(const Geometry& g, int64_t channels, const float* in, const float* w, float bias,
                                     float low, float high) {
  const int64_t taps = g.kernel[0] * g.kernel[1];
  std::vector<float> out(static_cast<size_t>(g.out[0] * g.out[1]));
  for (int64_t oy = 0; oy < g.out[0]; ++oy)
    for (int64_t ox = 0; ox < g.out[1]; ++ox) {
      double sum = bias;
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t ky = 0; ky < g.kernel[0]; ++ky)
          for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
            const int64_t iy = oy * g.stride[0] - g.pad[0] + ky * g.dilation[0];
            const int64_t ix = ox * g.stride[1] - g.pad[1] + kx * g.dilation[1];
            if (iy >= 0 && iy < g.in[0] && ix >= 0 && ix < g.in[1])
              sum += static_cast<double>(w[c * taps + ky * g.kernel[1] + kx]) * in[(c * g.in[0] + iy) * g.in[1] + ix];
          }
      out[static_cast<size_t>(oy * g.out[1] + ox)] = std::clamp(static_cast<float>(sum), low, high);
    }
  return out;
}

}  // namespace npusim::test
