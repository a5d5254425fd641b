// DirectConv (a group of few input channels convolved directly) against a direct loop in double, every output
// element, on the vector path and on the portable loops, over odd sizes, strides, dilations, paddings wider than the
// kernel and 1 to 5 channels; outputs start as a sentinel, and the inputs load three times onto the same scratch
// (its padding must stay zero).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/direct_conv.h"
#include "unit/random_values.h"

namespace npusim::cpu {
namespace {

constexpr float kSentinel = -12345.0f;

using test::random_floats;

DirectConvGeometry geometry(int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                            int64_t channels, int64_t stride_w = 0) {
  DirectConvGeometry g;
  g.in = {h, w};
  g.kernel = {k, k};
  g.stride = {stride, stride_w > 0 ? stride_w : stride};
  g.dilation = {dilation, dilation};
  g.pad = {pad, pad};
  g.channels = channels;
  for (int d = 0; d < 2; ++d) g.out[d] = (g.in[d] + 2 * g.pad[d] - g.dilation[d] * (k - 1) - 1) / g.stride[d] + 1;
  return g;
}

std::vector<float> expected_plane(const DirectConvGeometry& g, const std::vector<float>& in,
                                  const std::vector<float>& w, float bias, float low, float high) {
  const int64_t taps = g.kernel[0] * g.kernel[1];
  std::vector<float> out(static_cast<size_t>(g.out[0] * g.out[1]));
  for (int64_t oy = 0; oy < g.out[0]; ++oy)
    for (int64_t ox = 0; ox < g.out[1]; ++ox) {
      double sum = bias;
      for (int64_t c = 0; c < g.channels; ++c)
        for (int64_t ky = 0; ky < g.kernel[0]; ++ky)
          for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
            const int64_t iy = oy * g.stride[0] - g.pad[0] + ky * g.dilation[0];
            const int64_t ix = ox * g.stride[1] - g.pad[1] + kx * g.dilation[1];
            if (iy >= 0 && iy < g.in[0] && ix >= 0 && ix < g.in[1])
              sum += static_cast<double>(w[static_cast<size_t>(c * taps + ky * g.kernel[1] + kx)]) *
                     in[static_cast<size_t>((c * g.in[0] + iy) * g.in[1] + ix)];
          }
      out[static_cast<size_t>(oy * g.out[1] + ox)] = std::clamp(static_cast<float>(sum), low, high);
    }
  return out;
}

void check(const DirectConvGeometry& g, const std::string& label) {
  const DirectConv conv(g);
  std::vector<float> scratch(static_cast<size_t>(conv.scratch_floats()), kSentinel);
  conv.clear(scratch.data());
  const std::vector<float> w = random_floats(g.channels * g.kernel[0] * g.kernel[1], 3);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<float, float>> clamps = {{-kInf, kInf}, {0.0f, kInf}, {-0.3f, 0.4f}};
  for (bool vectors : {true, false})
    for (size_t round = 0; round < clamps.size(); ++round) {
      const auto [low, high] = clamps[round];
      const std::vector<float> in = random_floats(g.channels * g.in[0] * g.in[1], 10 + static_cast<uint32_t>(round));
      conv.load_inputs(in.data(), scratch.data(), vectors);
      // One spare float past the plane: nothing may be written there.
      std::vector<float> out(static_cast<size_t>(g.out[0] * g.out[1]) + 1, kSentinel);
      conv.compute(scratch.data(), w.data(), 0.25f, low, high, out.data(), vectors);
      const std::vector<float> expected = expected_plane(g, in, w, 0.25f, low, high);
      for (size_t i = 0; i < expected.size(); ++i)
        ASSERT_NEAR(out[i], expected[i], 1e-5 * static_cast<double>(g.channels))
            << label << " vectors " << vectors << " round " << round << " at " << i;
      ASSERT_EQ(out.back(), kSentinel) << label << ": written past the plane";
    }
}

TEST(DirectConv, MatchesADirectLoopOnBothPaths) {
  struct Case {
    int64_t h, w, k, stride, pad, dilation, channels, stride_w;
  };
  const std::vector<Case> cases = {
      {7, 7, 3, 1, 1, 1, 1, 0},
      {14, 14, 3, 1, 1, 1, 1, 0},
      {13, 17, 3, 2, 1, 1, 1, 0},
      {112, 112, 3, 2, 1, 1, 1, 0},
      {11, 74, 5, 2, 2, 1, 1, 0},
      {9, 41, 7, 1, 3, 1, 1, 0},
      {14, 20, 3, 3, 2, 2, 1, 0},
      {9, 10, 3, 2, 1, 1, 1, 1},
      {5, 3, 3, 1, 0, 1, 1, 0},
      {6, 6, 1, 1, 0, 1, 1, 0},
      {4, 4, 3, 1, 3, 1, 1, 0},
      {1, 1, 3, 1, 1, 1, 1, 0},
      {3, 70, 3, 1, 1, 1, 1, 0},
      {10, 33, 3, 1, 1, 1, 1, 0},
      {8, 31, 3, 2, 0, 1, 1, 0},
      {12, 12, 5, 1, 4, 2, 1, 0},
      {5, 9, 3, 4, 1, 1, 1, 0},
      {2, 200, 3, 1, 1, 1, 1, 0},
      {29, 31, 7, 2, 3, 1, 3, 0},
      {15, 17, 3, 2, 1, 1, 3, 0},
      {14, 14, 3, 1, 1, 1, 4, 0},
      {7, 7, 3, 1, 1, 1, 5, 0},
      {9, 13, 3, 2, 1, 1, 2, 0},
      {3, 3, 3, 1, 0, 1, 2, 0},
      // ConvNeXt's 7x7 depthwise planes; whole 32-column chunks with and without columns after them.
      {14, 14, 7, 1, 3, 1, 1, 0},
      {5, 56, 7, 1, 3, 1, 1, 0},
      {6, 32, 3, 1, 1, 1, 1, 0},
      {5, 40, 3, 1, 1, 1, 1, 0},
  };
  for (const Case& c : cases) {
    const DirectConvGeometry g = geometry(c.h, c.w, c.k, c.stride, c.pad, c.dilation, c.channels, c.stride_w);
    check(g, std::to_string(c.h) + "x" + std::to_string(c.w) + " k" + std::to_string(c.k) + " s" +
                 std::to_string(c.stride) + "/" + std::to_string(c.stride_w) + " p" + std::to_string(c.pad) + " d" +
                 std::to_string(c.dilation) + " c" + std::to_string(c.channels));
    if (testing::Test::HasFailure()) return;
  }
}

TEST(DirectConv, EmptyOutputWritesNothing) {
  DirectConvGeometry g = geometry(4, 4, 3, 1, 0, 1, 2);
  g.out = {0, 2};
  const DirectConv conv(g);
  std::vector<float> scratch(static_cast<size_t>(conv.scratch_floats()) + 1);
  conv.clear(scratch.data());
  const std::vector<float> in = random_floats(32, 1), w = random_floats(18, 2);
  conv.load_inputs(in.data(), scratch.data());
  float out = kSentinel;
  conv.compute(scratch.data(), w.data(), 0.0f, -1.0f, 1.0f, &out);
  EXPECT_EQ(out, kSentinel);
}

}  // namespace
}  // namespace npusim::cpu
