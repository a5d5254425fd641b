// DirectConv (a group of few input channels convolved directly) against a direct loop in double, every output
// element, on the vector path and on the portable loops, over odd sizes, strides, dilations, paddings wider than the
// kernel and 1 to 5 channels; outputs start as a sentinel, and the inputs load three times onto the same scratch
// (its padding must stay zero). Then the panels of several output planes at once (compute_panel), 5 to 16 channels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/direct_conv.h"
#include "unit/direct_conv_reference.h"
#include "unit/random_values.h"

namespace npusim::cpu {
namespace {

constexpr float kSentinel = -12345.0f;

using test::random_floats;

DirectConvGeometry geometry(int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                            int64_t channels, int64_t stride_w = 0) {
  DirectConvGeometry g = test::conv_geometry<DirectConvGeometry>(h, w, k, stride, pad, dilation, stride_w);
  g.channels = channels;
  return g;
}

std::vector<float> expected_plane(const DirectConvGeometry& g, const std::vector<float>& in,
                                  const std::vector<float>& w, float bias, float low, float high) {
  return test::direct_conv_plane(g, g.channels, in.data(), w.data(), bias, low, high);
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

// compute_panel: `outs` planes at once from a packed weight panel (six values per (channel, tap) step), each plane
// against the direct loop; a spare plane after them must stay untouched.
void check_panel(const DirectConvGeometry& g, int64_t outs, const std::string& label) {
  constexpr int64_t kPanelRows = 6;
  const DirectConv conv(g);
  std::vector<float> scratch(static_cast<size_t>(conv.scratch_floats()), kSentinel);
  conv.clear(scratch.data());
  const int64_t taps = g.kernel[0] * g.kernel[1], steps = g.channels * taps, pixels = g.out[0] * g.out[1];
  const std::vector<float> in = random_floats(g.channels * g.in[0] * g.in[1], 21);
  const std::vector<float> w = random_floats(outs * steps, 22), bias = random_floats(outs, 23);
  std::vector<float> panel(static_cast<size_t>(steps * kPanelRows), 0.0f);
  for (int64_t p = 0; p < steps; ++p)
    for (int64_t o = 0; o < outs; ++o)
      panel[static_cast<size_t>(p * kPanelRows + o)] = w[static_cast<size_t>(o * steps + p)];
  conv.load_inputs(in.data(), scratch.data());
  std::vector<float> out(static_cast<size_t>((outs + 1) * pixels), kSentinel);
  const float low = -0.6f, high = 0.9f;
  conv.compute_panel(scratch.data(), panel.data(), outs, bias.data(), low, high, out.data(), pixels);
  for (int64_t o = 0; o < outs; ++o) {
    const std::vector<float> plane_w(w.begin() + o * steps, w.begin() + (o + 1) * steps);
    const std::vector<float> expected = expected_plane(g, in, plane_w, bias[static_cast<size_t>(o)], low, high);
    for (int64_t i = 0; i < pixels; ++i)
      ASSERT_NEAR(out[static_cast<size_t>(o * pixels + i)], expected[static_cast<size_t>(i)],
                  1e-5 * static_cast<double>(g.channels))
          << label << " outs " << outs << " plane " << o << " at " << i;
  }
  for (int64_t i = 0; i < pixels; ++i)
    ASSERT_EQ(out[static_cast<size_t>(outs * pixels + i)], kSentinel) << label << ": written past plane " << outs;
  // The same planes in three bands of rows (how workers share a stem's planes): each band writes only its rows, and
  // the bands together are the whole computation bit for bit.
  const int64_t out_h = g.out[0], out_w = g.out[1];
  const int64_t cuts[] = {0, out_h / 3, (2 * out_h + 1) / 3, out_h};
  std::vector<float> bands(out.size(), kSentinel);
  for (int b = 0; b < 3; ++b) {
    conv.compute_panel(scratch.data(), panel.data(), outs, bias.data(), low, high, bands.data(), pixels, cuts[b],
                       cuts[b + 1]);
    for (int64_t o = 0; o <= outs; ++o)
      for (int64_t i = 0; i < pixels; ++i) {
        const float value = bands[static_cast<size_t>(o * pixels + i)];
        if (o < outs && i / out_w < cuts[b + 1])
          ASSERT_EQ(value, out[static_cast<size_t>(o * pixels + i)])
              << label << " band " << b << " plane " << o << " at " << i;
        else
          ASSERT_EQ(value, kSentinel) << label << " band " << b << " wrote plane " << o << " at " << i;
      }
  }
}

TEST(DirectConv, PanelsMatchADirectLoop) {
  if (!DirectConv::panels_supported()) GTEST_SKIP() << "needs AVX2 and FMA";
  struct Case {
    int64_t h, w, k, stride, pad, dilation, channels, stride_w;
  };
  const std::vector<Case> cases = {
      {7, 7, 3, 1, 1, 1, 8, 0},     // rows of 7: two rows a tile, the last one alone
      {14, 14, 3, 2, 1, 1, 16, 0},  // 7x7 out of a stride-2 plane
      {14, 14, 3, 1, 1, 1, 5, 0},   // rows of 14: one tile of 16
      {28, 28, 3, 1, 1, 1, 8, 0},   // rows of 16 + 12
      {56, 56, 3, 2, 1, 1, 8, 0},   // stride 2, rows of 28
      {13, 17, 3, 2, 1, 1, 9, 0},   // odd sizes
      {14, 20, 3, 3, 2, 2, 6, 0},   // stride 3, dilation 2
      {9, 10, 3, 2, 1, 1, 7, 1},    // stride 2 by 1
      {4, 4, 3, 1, 3, 1, 6, 0},     // padding wider than the kernel
      {1, 1, 3, 1, 1, 1, 12, 0},    // one pixel
      {3, 70, 3, 1, 1, 1, 5, 0},    // long rows
      {12, 12, 5, 1, 4, 2, 6, 0},   // 5x5 dilated
      {23, 45, 7, 2, 3, 1, 3, 0},   // a 7x7 stride-2 stem over three channels, rows of 23
      {5, 33, 3, 1, 1, 1, 5, 0},    // rows of 33: a whole AVX-512 tile of 32 and one pixel
      {3, 40, 3, 1, 1, 1, 4, 0},    // rows of 40: one AVX-512 tile of three vectors, the last one partial
      {3, 50, 3, 1, 1, 1, 2, 0},    // rows of 50: tiles of two vectors, the last one partial
      {3, 65, 3, 1, 1, 1, 2, 0},    // rows of 65: tiles of three and two vectors, one pixel in the last
      {4, 112, 3, 1, 1, 1, 3, 0},   // rows of 112: three, two and two vectors
      {12, 224, 7, 2, 3, 1, 3, 0},  // ResNet's stem: rows of 112 at stride 2
  };
  for (const Case& c : cases)
    for (int64_t outs : {1, 4, 5, 6}) {
      const DirectConvGeometry g = geometry(c.h, c.w, c.k, c.stride, c.pad, c.dilation, c.channels, c.stride_w);
      check_panel(g, outs,
                  std::to_string(c.h) + "x" + std::to_string(c.w) + " k" + std::to_string(c.k) + " s" +
                      std::to_string(c.stride) + " p" + std::to_string(c.pad) + " c" + std::to_string(c.channels));
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
