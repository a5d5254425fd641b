// DepthwiseConv (eight channels at a time, band by band) against a direct loop in double, every output element:
// each band is run on its own into an output full of a sentinel, and only that band's rows of the live channels may
// change. Odd sizes, strides, dilations, paddings wider than the kernel, 1 to 8 channels, several bands per plane.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/depthwise_conv.h"
#include "core/cpu_features.h"
#include "unit/direct_conv_reference.h"
#include "unit/random_values.h"

namespace npusim::cpu {
namespace {

constexpr float kSentinel = -12345.0f;

using test::random_floats;

ConvWindow geometry(int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                    int64_t stride_w = 0) {
  return test::conv_geometry<ConvWindow>(h, w, k, stride, pad, dilation, stride_w);
}

void check(const ConvWindow& g, int64_t channels, const std::string& label) {
  const DepthwiseConv conv(g);
  const int64_t taps = g.kernel[0] * g.kernel[1], pixels = g.out[0] * g.out[1];
  const std::vector<float> in = random_floats(channels * g.in[0] * g.in[1], 11);
  const std::vector<float> w = random_floats(channels * taps, 12);
  const std::vector<float> bias = random_floats(channels, 13);
  std::vector<float> scratch(static_cast<size_t>(conv.scratch_floats()), kSentinel);
  const float low = -0.7f, high = 0.8f;
  std::vector<std::vector<float>> expected;
  for (int64_t c = 0; c < channels; ++c)
    expected.push_back(test::direct_conv_plane(g, 1, in.data() + c * g.in[0] * g.in[1], w.data() + c * taps,
                                               bias[static_cast<size_t>(c)], low, high));
  // Channel planes one plane apart, and one spare plane after the last: nothing may be written there.
  for (int64_t band = 0; band < conv.bands(); ++band) {
    std::vector<float> out(static_cast<size_t>((channels + 1) * pixels), kSentinel);
    const int64_t first = band * conv.band_rows() * g.out[1];
    conv.run_band(in.data(), w.data(), bias.data(), channels, band, low, high, out.data() + first, pixels,
                  scratch.data());
    const int64_t last = std::min(pixels, first + conv.band_rows() * g.out[1]);
    for (int64_t c = 0; c <= channels; ++c)
      for (int64_t i = 0; i < pixels; ++i) {
        const float actual = out[static_cast<size_t>(c * pixels + i)];
        if (c == channels || i < first || i >= last) {
          ASSERT_EQ(actual, kSentinel) << label << ": band " << band << " wrote channel " << c << " at " << i;
          continue;
        }
        ASSERT_NEAR(actual, expected[static_cast<size_t>(c)][static_cast<size_t>(i)], 1e-5)
            << label << " band " << band << " channel " << c << " at " << i;
      }
  }
}

TEST(DepthwiseConv, EveryBandMatchesADirectLoop) {
  if (!cpu_features().avx2_fma_f16c()) GTEST_SKIP() << "needs AVX2 and FMA";
  struct Case {
    std::string label;
    ConvWindow g;
    int64_t channels;
  };
  const std::vector<Case> cases = {
      {"3x3 on 7x7, eight channels", geometry(7, 7, 3, 1, 1, 1), 8},
      {"3x3 stride 2 on 14x14, five channels", geometry(14, 14, 3, 2, 1, 1), 5},
      {"5x5 stride 2 odd sizes", geometry(13, 17, 5, 2, 2, 1), 8},
      {"one channel, one column", geometry(5, 3, 3, 1, 0, 1), 1},
      {"dilation 2 stride 3", geometry(14, 20, 3, 3, 2, 2), 7},
      {"stride 2 by 1", geometry(9, 10, 3, 2, 1, 1, 1), 3},
      {"padding wider than the kernel", geometry(4, 4, 3, 1, 3, 1), 2},
      {"1x1", geometry(6, 6, 1, 1, 0, 1), 6},
      {"7x7 pad 3", geometry(9, 11, 7, 1, 3, 1), 8},
      {"tall: many bands", geometry(300, 20, 3, 1, 1, 1), 8},
      {"tall stride 2: many bands, a last short one", geometry(281, 45, 3, 2, 1, 1), 6},
  };
  for (const Case& c : cases) {
    const DepthwiseConv conv(c.g);
    if (c.label.starts_with("tall")) ASSERT_GT(conv.bands(), 2) << c.label;
    check(c.g, c.channels, c.label);
  }
}

TEST(DepthwiseConv, NanSumsStayNan) {
  if (!cpu_features().avx2_fma_f16c()) GTEST_SKIP() << "needs AVX2 and FMA";
  const ConvWindow g = geometry(6, 6, 3, 1, 1, 1);
  const DepthwiseConv conv(g);
  std::vector<float> in(static_cast<size_t>(2 * 36), 1.0f);
  in[7] = std::numeric_limits<float>::quiet_NaN();  // channel 0, row 1, column 1
  const std::vector<float> w(18, 0.5f), bias(2, 0.0f);
  std::vector<float> scratch(static_cast<size_t>(conv.scratch_floats()));
  std::vector<float> out(72, kSentinel);
  conv.run_band(in.data(), w.data(), bias.data(), 2, 0, 0.0f, 6.0f, out.data(), 36, scratch.data());
  EXPECT_TRUE(std::isnan(out[0])) << "the NaN's neighbour";
  EXPECT_FALSE(std::isnan(out[36])) << "the other channel";
  EXPECT_EQ(out[35], 2.0f) << "a corner: four taps of 0.5 inside, clamped to [0, 6]";
}

}  // namespace
}  // namespace npusim::cpu
