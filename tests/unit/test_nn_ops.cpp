#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"
#include "ops/pool_window.h"
#include "unit/error_expectations.h"
#include "unit/op_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

using Ints = std::vector<int64_t>;

// ====================================================================================================================
// Convolution

// Direct convolution of x [N, C, H, W] with w [O, C/groups, KH, KW] from the definition.
std::vector<float> naive_conv2d(const Tensor& x, const Tensor& w, const float* bias, Ints stride, Ints pad,
                                Ints dilation, int64_t groups) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  const int64_t n_ = xs[0], c_ = xs[1], h = xs[2], wd = xs[3], o_ = ws[0], cg = ws[1], kh = ws[2], kw = ws[3];
  const int64_t oh = (h + 2 * pad[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1;
  const int64_t ow = (wd + 2 * pad[1] - dilation[1] * (kw - 1) - 1) / stride[1] + 1;
  const int64_t og = o_ / groups;
  std::vector<float> out;
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t o = 0; o < o_; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double sum = bias ? bias[o] : 0.0;
          const int64_t g = o / og;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t iy = y * stride[0] - pad[0] + ky * dilation[0];
                const int64_t ix = xx * stride[1] - pad[1] + kx * dilation[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                sum += static_cast<double>(x.data<float>()[((n * c_ + g * cg + c) * h + iy) * wd + ix]) *
                       w.data<float>()[((o * cg + c) * kh + ky) * kw + kx];
              }
          out.push_back(static_cast<float>(sum));
        }
  return out;
}

TEST(Conv2d, OnesKernelNoPadding) {
  const Tensor out =
      run_op("aten.conv2d.default", {iota({1, 1, 4, 4}), floats({1, 1, 3, 3}, std::vector<float>(9, 1.0f))}).out();
  ASSERT_EQ(out.shape(), (Shape{1, 1, 2, 2}));
  expect_values(out, {45, 54, 81, 90});
}

TEST(Conv2d, PaddingAndStride) {
  const Tensor ones = floats({1, 1, 3, 3}, std::vector<float>(9, 1.0f));
  const Tensor out = run_op("aten.conv2d.default", {iota({1, 1, 4, 4}), ones},
                            make_attrs({{"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}))
                         .out();
  ASSERT_EQ(out.shape(), (Shape{1, 1, 2, 2}));
  expect_values(out, {10, 24, 51, 90});
  // A single int applies to both dims; padding 1 keeps the size.
  const Tensor same =
      run_op("aten.conv2d.default", {iota({1, 1, 3, 3}), ones}, make_attrs({{"padding", int64_t{1}}})).out();
  ASSERT_EQ(same.shape(), (Shape{1, 1, 3, 3}));
  expect_values(same, {8, 15, 12, 21, 36, 27, 20, 33, 24});
}

TEST(Conv2d, Dilation) {
  const Tensor ones = floats({1, 1, 3, 3}, std::vector<float>(9, 1.0f));
  const Tensor out =
      run_op("aten.conv2d.default", {iota({1, 1, 5, 5}), ones}, make_attrs({{"dilation", Ints{2, 2}}})).out();
  ASSERT_EQ(out.shape(), (Shape{1, 1, 1, 1}));
  expect_values(out, {108});  // x at rows and columns {0, 2, 4}
}

TEST(Conv2d, DepthwiseWithBias) {
  const Tensor x = floats({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor w = floats({2, 1, 1, 1}, {2, -1});
  const Tensor bias = floats({2}, {0.5, 1});
  expect_values(run_op("aten.conv2d.default", {x, w, bias}, make_attrs({{"groups", int64_t{2}}})).out(),
                {2.5, 4.5, 6.5, 8.5, -4, -5, -6, -7});
  expect_values(run_op("aten.conv2d.default", {x, w}, make_attrs({{"groups", int64_t{2}}})).out(),
                {2, 4, 6, 8, -5, -6, -7, -8});
}

TEST(Conv2d, GroupedStridedDilatedMatchesDirectConvolution) {
  const Tensor x = pattern({2, 6, 9, 11});
  const Tensor w = pattern({4, 3, 3, 2}, 1.0f);
  const Tensor bias = floats({4}, {0.1f, -0.2f, 0.3f, -0.4f});
  const Tensor out =
      run_op("aten.conv2d.default", {x, w, bias},
             make_attrs(
                 {{"stride", Ints{2, 1}}, {"padding", Ints{1, 2}}, {"dilation", Ints{1, 2}}, {"groups", int64_t{2}}}))
          .out();
  ASSERT_EQ(out.shape(), (Shape{2, 4, 5, 13}));
  expect_values(out, naive_conv2d(x, w, bias.data<float>(), {2, 1}, {1, 2}, {1, 2}, 2), 1e-4f);
}

TEST(Conv2d, LargerChannelsMatchDirectConvolution) {
  // Enough channels and pixels for the blocked, threaded GEMM path; also a pointwise (1x1) convolution.
  const Tensor x = pattern({1, 33, 17, 15});
  const Tensor w3 = pattern({65, 33, 3, 3}, 2.0f);
  const Tensor out3 = run_op("aten.conv2d.default", {x, w3}, make_attrs({{"padding", Ints{1, 1}}})).out();
  ASSERT_EQ(out3.shape(), (Shape{1, 65, 17, 15}));
  expect_values(out3, naive_conv2d(x, w3, nullptr, {1, 1}, {1, 1}, {1, 1}, 1), 1e-4f);
  const Tensor w1 = pattern({7, 33, 1, 1}, 3.0f);
  const Tensor x2 = pattern({2, 33, 5, 7}, 4.0f);
  const Tensor out1 = run_op("aten.conv2d.default", {x2, w1}).out();
  expect_values(out1, naive_conv2d(x2, w1, nullptr, {1, 1}, {0, 0}, {1, 1}, 1), 1e-4f);
}

TEST(Conv2d, UnbatchedInput) {
  const Tensor out =
      run_op("aten.conv2d.default", {iota({1, 4, 4}), floats({1, 1, 3, 3}, std::vector<float>(9, 1.0f))}).out();
  ASSERT_EQ(out.shape(), (Shape{1, 2, 2}));
  expect_values(out, {45, 54, 81, 90});
}

TEST(Conv2d, StringPadding) {
  // padding="same" with an even kernel pads the extra element at the end: out[i] = x[i] + 10 * x[i + 1].
  const Tensor x = floats({1, 1, 4}, {1, 2, 3, 4});
  const Tensor w = floats({1, 1, 2}, {1, 10});
  expect_values(run_op("aten.conv1d.padding", {x, w}, make_attrs({{"padding", std::string("same")}})).out(),
                {21, 32, 43, 4});
  const Tensor valid = run_op("aten.conv1d.padding", {x, w}, make_attrs({{"padding", std::string("valid")}})).out();
  ASSERT_EQ(valid.shape(), (Shape{1, 1, 3}));
  expect_values(valid, {21, 32, 43});
  const Tensor same2d =
      run_op("aten.conv2d.padding", {iota({1, 1, 3, 3}), floats({1, 1, 3, 3}, std::vector<float>(9, 1.0f))},
             make_attrs({{"padding", std::string("same")}}))
          .out();
  expect_values(same2d, {8, 15, 12, 21, 36, 27, 20, 33, 24});
  EXPECT_THROW(infer_op("aten.conv1d.padding", {meta({1, 1, 4}), meta({1, 1, 2})},
                        make_attrs({{"padding", std::string("same")}, {"stride", Ints{2}}})),
               Error);
  EXPECT_THROW(infer_op("aten.conv1d.padding", {meta({1, 1, 4}), meta({1, 1, 2})},
                        make_attrs({{"padding", std::string("full")}})),
               Error);
}

TEST(Conv1d, StrideAndUnbatched) {
  const Tensor x = floats({2, 5}, {1, 2, 3, 4, 5, 10, 20, 30, 40, 50});  // [C, L]
  const Tensor w = floats({1, 2, 3}, {1, 0, -1, 1, 1, 1});
  const Tensor out = run_op("aten.conv1d.default", {x, w}, make_attrs({{"stride", Ints{2}}})).out();
  ASSERT_EQ(out.shape(), (Shape{1, 2}));
  expect_values(out, {-2 + 60, -2 + 120});
}

TEST(Convolution, GenericOpDispatchesOnWeightRank) {
  const Tensor ones = floats({1, 1, 3, 3}, std::vector<float>(9, 1.0f));
  const Attrs attrs = make_attrs({{"stride", Ints{1, 1}},
                                  {"padding", Ints{0, 0}},
                                  {"dilation", Ints{1, 1}},
                                  {"transposed", false},
                                  {"output_padding", Ints{0, 0}},
                                  {"groups", int64_t{1}}});
  expect_values(run_op("aten.convolution.default", {iota({1, 1, 4, 4}), ones}, attrs).out(), {45, 54, 81, 90});
  const Tensor out1d =
      run_op("aten.convolution.default", {floats({1, 1, 4}, {1, 2, 3, 4}), floats({1, 1, 2}, {1, 10})}).out();
  expect_values(out1d, {21, 32, 43});
  EXPECT_THROW(infer_op("aten.convolution.default", {meta({1, 1, 4, 4}), meta({1, 1, 3, 3})},
                        make_attrs({{"transposed", true}})),
               Error);
}

TEST(Conv2d, EmptyBatchAndChannels) {
  const Tensor no_batch = run_op("aten.conv2d.default", {pattern({0, 2, 4, 4}), pattern({3, 2, 3, 3})}).out();
  EXPECT_EQ(no_batch.shape(), (Shape{0, 3, 2, 2}));
  // No input channels: every output is the bias.
  const Tensor no_channels =
      run_op("aten.conv2d.default", {pattern({1, 0, 2, 2}), pattern({2, 0, 3, 3}), floats({2}, {1.5f, -2.0f})},
             make_attrs({{"padding", Ints{1, 1}}}))
          .out();
  ASSERT_EQ(no_channels.shape(), (Shape{1, 2, 2, 2}));
  expect_values(no_channels, {1.5f, 1.5f, 1.5f, 1.5f, -2, -2, -2, -2});
}

TEST(Conv2d, RejectsBadAttributesAndShapes) {
  const auto conv = [](Attrs attrs, std::vector<TensorMeta> inputs) {
    return infer_op("aten.conv2d.default", inputs, std::move(attrs));
  };
  const TensorMeta x = meta({1, 4, 5, 5});
  const TensorMeta w = meta({6, 4, 3, 3});
  EXPECT_NO_THROW(conv(make_attrs(), {x, w}));
  EXPECT_THROW(conv(make_attrs({{"stride", Ints{0, 1}}}), {x, w}), Error);
  EXPECT_THROW(conv(make_attrs({{"stride", Ints{-1, 1}}}), {x, w}), Error);
  EXPECT_THROW(conv(make_attrs({{"padding", Ints{-1, 0}}}), {x, w}), Error);
  EXPECT_THROW(conv(make_attrs({{"dilation", Ints{0, 1}}}), {x, w}), Error);
  EXPECT_THROW(conv(make_attrs({{"stride", Ints{1, 1, 1}}}), {x, w}), Error);
  EXPECT_THROW(conv(make_attrs(), {x, meta({6, 4, 7, 3})}), Error);                          // kernel taller than input
  EXPECT_NO_THROW(conv(make_attrs({{"padding", Ints{1, 0}}}), {x, meta({6, 4, 7, 3})}));     // fits once padded
  EXPECT_THROW(conv(make_attrs({{"dilation", Ints{3, 1}}}), {x, w}), Error);                 // dilated extent 7 > 5
  EXPECT_THROW(conv(make_attrs(), {x, meta({6, 3, 3, 3})}), Error);                          // channel mismatch
  EXPECT_THROW(conv(make_attrs({{"groups", int64_t{3}}}), {x, meta({6, 1, 3, 3})}), Error);  // 4 % 3
  EXPECT_THROW(conv(make_attrs({{"groups", int64_t{4}}}), {x, meta({6, 1, 3, 3})}), Error);  // 6 outputs % 4
  EXPECT_THROW(conv(make_attrs({{"groups", int64_t{0}}}), {x, w}), Error);
  EXPECT_THROW(conv(make_attrs(), {x, w, meta({5})}), Error);     // bias size
  EXPECT_THROW(conv(make_attrs(), {meta({4, 5}), w}), Error);     // input rank
  EXPECT_THROW(conv(make_attrs(), {x, meta({6, 4, 3})}), Error);  // weight rank
  EXPECT_THROW(conv(make_attrs(), {{{1, 4, 5, 5}, DType::Int64}, w}), Error);
}

// ====================================================================================================================
// Normalization

TEST(BatchNorm, InferenceWithRunningStats) {
  const Tensor x = floats({2, 2, 1, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const std::vector<float> weight = {2, 0.5}, bias = {1, -1}, mean = {1.5, 3}, var = {0.25, 4};
  const double eps = 1e-3;
  const Tensor out = run_op("aten.batch_norm.default",
                            {x, floats({2}, weight), floats({2}, bias), floats({2}, mean), floats({2}, var)},
                            make_attrs({{"eps", eps}}))
                         .out();
  std::vector<float> expected;
  for (int64_t i = 0; i < 8; ++i) {
    const int64_t c = (i / 2) % 2;
    expected.push_back(
        static_cast<float>((x.data<float>()[i] - mean[c]) / std::sqrt(var[c] + eps) * weight[c] + bias[c]));
  }
  expect_values(out, expected);
}

TEST(BatchNorm, OptionalAffineAndDefaults) {
  const Tensor x = floats({1, 2, 2}, {1, 2, 3, 4});
  const Tensor mean = floats({2}, {1, 2}), var = floats({2}, {4, 1});
  const double eps = 1e-5;  // the default
  const auto normalized = [&](float v, float m, float s) { return static_cast<float>((v - m) / std::sqrt(s + eps)); };
  expect_values(run_op("aten.batch_norm.default", {x, mean, var}).out(),
                {normalized(1, 1, 4), normalized(2, 1, 4), normalized(3, 2, 1), normalized(4, 2, 1)});
  // Four inputs: weight without bias.
  expect_values(run_op("aten.batch_norm.default", {x, floats({2}, {3, -1}), mean, var}).out(),
                {3 * normalized(1, 1, 4), 3 * normalized(2, 1, 4), -normalized(3, 2, 1), -normalized(4, 2, 1)});
}

TEST(BatchNorm, NativeNoTrainingHasEmptyStats) {
  const auto outputs =
      run_op("aten._native_batch_norm_legit_no_training.default",
             {floats({1, 1, 2}, {2, 4}), floats({1}, {2}), floats({1}, {1}), floats({1}, {3}), floats({1}, {4})},
             make_attrs({{"eps", 0.0}}))
          .outputs;
  ASSERT_EQ(outputs.size(), 3u);
  expect_values(outputs[0], {0, 2});  // (x - 3) / 2 * 2 + 1
  EXPECT_EQ(outputs[1].shape(), Shape{0});
  EXPECT_EQ(outputs[2].shape(), Shape{0});
}

TEST(BatchNorm, RejectsBadInputs) {
  const TensorMeta x = meta({1, 3, 2, 2});
  EXPECT_THROW(infer_op("aten.batch_norm.default", {x, meta({2}), meta({3})}), Error);
  EXPECT_THROW(infer_op("aten.batch_norm.default", {meta({3}), meta({3}), meta({3})}), Error);
  EXPECT_THROW(infer_op("aten.batch_norm.default", {x, meta({3}), meta({3})}, make_attrs({{"training", true}})), Error);
}

TEST(LayerNorm, LastDimWithAffine) {
  const Tensor x = floats({2, 3}, {1, 2, 3, 2, 4, 9});
  const double eps = 1e-5;
  // Row 1: mean 2, variance 2/3. Row 2: mean 5, variance 26/3.
  const double r1 = 1.0 / std::sqrt(2.0 / 3.0 + eps), r2 = 1.0 / std::sqrt(26.0 / 3.0 + eps);
  const std::vector<float> plain = {static_cast<float>(-r1), 0,
                                    static_cast<float>(r1),  static_cast<float>(-3 * r2),
                                    static_cast<float>(-r2), static_cast<float>(4 * r2)};
  expect_values(run_op("aten.layer_norm.default", {x}, make_attrs({{"normalized_shape", Ints{3}}})).out(), plain);
  const Tensor weight = floats({3}, {1, 2, 3}), bias = floats({3}, {0, 1, -1});
  std::vector<float> affine;
  for (size_t i = 0; i < plain.size(); ++i)
    affine.push_back(plain[i] * weight.data<float>()[i % 3] + bias.data<float>()[i % 3]);
  expect_values(run_op("aten.layer_norm.default", {x, weight, bias}, make_attrs({{"normalized_shape", Ints{3}}})).out(),
                affine);

  const auto native =
      run_op("aten.native_layer_norm.default", {x, weight, bias}, make_attrs({{"normalized_shape", Ints{3}}})).outputs;
  expect_values(native[0], affine);
  EXPECT_EQ(native[1].shape(), (Shape{2, 1}));
  expect_values(native[1], {2, 5});
  expect_values(native[2], {static_cast<float>(r1), static_cast<float>(r2)});
}

TEST(LayerNorm, SeveralNormalizedDims) {
  const Tensor x = floats({1, 2, 2}, {1, 3, 5, 7});  // mean 4, variance 5
  const double r = 1.0 / std::sqrt(5.0 + 1e-5);
  expect_values(run_op("aten.layer_norm.default", {x}, make_attrs({{"normalized_shape", Ints{2, 2}}})).out(),
                {static_cast<float>(-3 * r), static_cast<float>(-r), static_cast<float>(r), static_cast<float>(3 * r)});
  EXPECT_THROW(infer_op("aten.layer_norm.default", {meta({2, 2})}, make_attrs({{"normalized_shape", Ints{3}}})), Error);
  EXPECT_THROW(
      infer_op("aten.layer_norm.default", {meta({2, 2}), meta({3})}, make_attrs({{"normalized_shape", Ints{2}}})),
      Error);
}

TEST(GroupNorm, StatisticsPerGroup) {
  // N=1, C=4, L=2, two groups of channels {0, 1} and {2, 3}.
  const Tensor x = floats({1, 4, 2}, {1, 2, 3, 4, 10, 10, 20, 20});
  const double eps = 1e-5;
  const double r1 = 1.0 / std::sqrt(1.25 + eps), r2 = 1.0 / std::sqrt(25.0 + eps);  // means 2.5 and 15
  const Tensor weight = floats({4}, {1, 2, 3, 4}), bias = floats({4}, {0, 0, 1, 1});
  const auto outputs =
      run_op(
          "aten.native_group_norm.default", {x, weight, bias},
          make_attrs({{"N", int64_t{1}}, {"C", int64_t{4}}, {"HxW", int64_t{2}}, {"group", int64_t{2}}, {"eps", eps}}))
          .outputs;
  const std::vector<float> expected = {static_cast<float>(-1.5 * r1),       static_cast<float>(-0.5 * r1),
                                       static_cast<float>(2 * 0.5 * r1),    static_cast<float>(2 * 1.5 * r1),
                                       static_cast<float>(3 * -5 * r2 + 1), static_cast<float>(3 * -5 * r2 + 1),
                                       static_cast<float>(4 * 5 * r2 + 1),  static_cast<float>(4 * 5 * r2 + 1)};
  expect_values(outputs[0], expected);
  EXPECT_EQ(outputs[1].shape(), (Shape{1, 2}));
  expect_values(outputs[1], {2.5, 15});
  expect_values(outputs[2], {static_cast<float>(r1), static_cast<float>(r2)});
  expect_values(run_op("aten.group_norm.default", {x, weight, bias}, make_attrs({{"num_groups", int64_t{2}}})).out(),
                expected);
  EXPECT_THROW(infer_op("aten.group_norm.default", {meta({1, 4, 2})}, make_attrs({{"num_groups", int64_t{3}}})), Error);
  EXPECT_THROW(infer_op("aten.group_norm.default", {meta({1, 4, 2})}, make_attrs({{"num_groups", int64_t{0}}})), Error);
  EXPECT_THROW(
      infer_op("aten.group_norm.default", {meta({1, 4, 2}), meta({2})}, make_attrs({{"num_groups", int64_t{2}}})),
      Error);
}

TEST(RmsNorm, DefaultEpsilonAndWeight) {
  const Tensor x = floats({2, 2}, {3, 4, 1, -1});  // mean squares 12.5 and 1
  const double eps = std::numeric_limits<float>::epsilon();
  const double r1 = 1.0 / std::sqrt(12.5 + eps), r2 = 1.0 / std::sqrt(1.0 + eps);
  expect_values(
      run_op("aten.rms_norm.default", {x}, make_attrs({{"normalized_shape", Ints{2}}})).out(),
      {static_cast<float>(3 * r1), static_cast<float>(4 * r1), static_cast<float>(r2), static_cast<float>(-r2)});
  const Tensor weight = floats({2}, {2, 0.5});
  expect_values(
      run_op("aten.rms_norm.default", {x, weight}, make_attrs({{"normalized_shape", Ints{2}}, {"eps", 0.5}})).out(),
      {static_cast<float>(6 / std::sqrt(13.0)), static_cast<float>(2 / std::sqrt(13.0)),
       static_cast<float>(2 / std::sqrt(1.5)), static_cast<float>(-0.5 / std::sqrt(1.5))});
}

// ====================================================================================================================
// Pooling

TEST(MaxPool2d, KernelDefaultsStride) {
  const Tensor out =
      run_op("aten.max_pool2d.default", {iota({1, 1, 4, 4})}, make_attrs({{"kernel_size", Ints{2, 2}}})).out();
  ASSERT_EQ(out.shape(), (Shape{1, 1, 2, 2}));
  expect_values(out, {5, 7, 13, 15});
}

TEST(MaxPool2d, PaddingIsNeverTheMaximum) {
  // All values negative: padding must act as -inf, not 0.
  Tensor x = iota({1, 1, 4, 4});
  for (int64_t i = 0; i < 16; ++i) x.mutable_data<float>()[i] -= 100.0f;
  const Tensor out = run_op("aten.max_pool2d.default", {x},
                            make_attrs({{"kernel_size", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}))
                         .out();
  ASSERT_EQ(out.shape(), (Shape{1, 1, 2, 2}));
  expect_values(out, {-95, -93, -87, -85});
}

TEST(MaxPool2d, CeilModeWithIndices) {
  const auto outputs = run_op("aten.max_pool2d_with_indices.default", {iota({1, 5, 5})},
                              make_attrs({{"kernel_size", Ints{2}}, {"stride", Ints{2}}, {"ceil_mode", true}}))
                           .outputs;
  ASSERT_EQ(outputs[0].shape(), (Shape{1, 3, 3}));
  expect_values(outputs[0], {6, 8, 9, 16, 18, 19, 21, 23, 24});
  EXPECT_EQ(outputs[1].dtype(), DType::Int64);
  expect_values(outputs[1], {6, 8, 9, 16, 18, 19, 21, 23, 24});
  // Without ceil_mode the partial windows are dropped.
  const Tensor floor =
      run_op("aten.max_pool2d.default", {iota({1, 5, 5})}, make_attrs({{"kernel_size", Ints{2}}})).out();
  expect_values(floor, {6, 8, 16, 18});
}

TEST(MaxPool2d, CeilModeDropsWindowStartingInPadding) {
  // in 4, kernel 2, stride 2, pad 1: ceil gives 3 windows starting at -1, 1, 3; all start inside input + pad.
  const Tensor out =
      run_op("aten.max_pool2d.default", {iota({1, 1, 1, 4})},
             make_attrs({{"kernel_size", Ints{2}}, {"stride", Ints{2}}, {"padding", Ints{1}}, {"ceil_mode", true}}))
          .out();
  ASSERT_EQ(out.shape(), (Shape{1, 1, 1, 3}));
  expect_values(out, {0, 2, 3});
  // in 5, kernel 2, stride 2, pad 1: a 4th window would start at 5, inside the right padding, so ceil gives 3.
  const auto metas = infer_op(
      "aten.max_pool2d.default", {meta({1, 1, 1, 5})},
      make_attrs({{"kernel_size", Ints{1, 2}}, {"stride", Ints{1, 2}}, {"padding", Ints{0, 1}}, {"ceil_mode", true}}));
  EXPECT_EQ(metas[0].shape, (Shape{1, 1, 1, 3}));
}

TEST(MaxPool2d, DilationAndNaN) {
  const Tensor out = run_op("aten.max_pool2d.default", {iota({1, 1, 4, 4})},
                            make_attrs({{"kernel_size", Ints{2, 2}}, {"stride", Ints{1, 1}}, {"dilation", Ints{2, 2}}}))
                         .out();
  expect_values(out, {10, 11, 14, 15});
  Tensor x = iota({1, 1, 2, 2});
  x.mutable_data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  const Tensor nan = run_op("aten.max_pool2d.default", {x}, make_attrs({{"kernel_size", Ints{2, 2}}})).out();
  EXPECT_TRUE(std::isnan(nan.data<float>()[0]));
}

TEST(MaxPool2d, RejectsBadAttributes) {
  const auto pool = [](Attrs attrs) {
    return infer_op("aten.max_pool2d.default", {meta({1, 1, 4, 4})}, std::move(attrs));
  };
  EXPECT_THROW(pool(make_attrs({{"kernel_size", Ints{2, 2}}, {"padding", Ints{2, 2}}})), Error);  // pad > kernel / 2
  EXPECT_THROW(pool(make_attrs({{"kernel_size", Ints{2, 2}}, {"stride", Ints{0, 1}}})), Error);
  EXPECT_THROW(pool(make_attrs({{"kernel_size", Ints{0, 2}}})), Error);
  EXPECT_THROW(pool(make_attrs({{"kernel_size", Ints{5, 5}}})), Error);  // output would be empty
  EXPECT_THROW(pool(make_attrs({{"kernel_size", Ints{2, 2, 2}}})), Error);
  EXPECT_THROW(pool(make_attrs({{"kernel_size", Ints{2, 2}}, {"dilation", Ints{0, 1}}})), Error);
  EXPECT_THROW(infer_op("aten.max_pool2d.default", {meta({4, 4})}, make_attrs({{"kernel_size", Ints{2}}})), Error);
  EXPECT_THROW(infer_op("aten.max_pool2d.default", {meta({1, 1, 0, 4})}, make_attrs({{"kernel_size", Ints{2}}})),
               Error);
  EXPECT_THROW(infer_op("aten.max_pool2d.default", {meta({1, 1, 4, 4})}), Error);  // kernel_size missing
}

// Shape inference and the backends read a pooling window the same way (ops::read_pool_window): what inference says
// about each bad attribute is the reason the backends' reading gives.
TEST(MaxPool2d, BadWindowsAreNamedAlike) {
  const std::vector<std::pair<Attrs, std::string>> cases = {
      {make_attrs({{"kernel_size", Ints{2, 2, 2}}}), "'kernel_size' needs 1 or 2 values, got 3"},
      {make_attrs({{"kernel_size", Ints{2}}, {"stride", Ints{1, 1, 1}}}), "'stride' needs 1 or 2 values, got 3"},
      {make_attrs({{"kernel_size", Ints{0, 2}}}), "kernel_size must be positive, got 0"},
      {make_attrs({{"kernel_size", Ints{2}}, {"stride", Ints{2, -1}}}), "stride must be positive, got -1"},
      {make_attrs({{"kernel_size", Ints{2}}, {"dilation", Ints{0}}}), "dilation must be positive, got 0"},
      {make_attrs({{"kernel_size", Ints{2}}, {"padding", Ints{-1, 0}}}), "padding must be non-negative, got -1"},
  };
  for (const auto& [attrs, reason] : cases) {
    const ops::PoolWindowReading reading = ops::read_pool_window(attrs, true);
    EXPECT_FALSE(reading.window) << reason;
    EXPECT_EQ(reading.reason, reason);
    test::expect_error(
        [&] {
          infer_op("aten.max_pool2d.default", {meta({1, 1, 4, 4})}, attrs);
        },
        {"max_pool2d: " + reason});
  }
  const ops::PoolWindowReading good =
      ops::read_pool_window(make_attrs({{"kernel_size", Ints{3, 2}}, {"padding", Ints{1}}}), true);
  ASSERT_TRUE(good.window);
  EXPECT_EQ(good.window->kernel, (std::array<int64_t, 2>{3, 2}));
  EXPECT_EQ(good.window->stride, (std::array<int64_t, 2>{3, 2}));  // the kernel's when absent
  EXPECT_EQ(good.window->pad, (std::array<int64_t, 2>{1, 1}));
  EXPECT_EQ(good.window->dilation, (std::array<int64_t, 2>{1, 1}));
  // avg_pool2d has no dilation: whatever the node says, it is 1.
  EXPECT_TRUE(ops::read_pool_window(make_attrs({{"kernel_size", Ints{2}}, {"dilation", Ints{0}}}), false).window);
}

TEST(AvgPool2d, PaddingDivisorsAndCeilMode) {
  const Tensor x = iota({1, 1, 4, 4});
  expect_values(run_op("aten.avg_pool2d.default", {x}, make_attrs({{"kernel_size", Ints{2, 2}}})).out(),
                {2.5, 4.5, 10.5, 12.5});
  const Attrs padded = make_attrs({{"kernel_size", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}});
  // Windows: rows/cols {-1..1} and {1..3}; sums 10, 24, 51, 90 over 4, 6, 6, 9 real elements.
  expect_values(run_op("aten.avg_pool2d.default", {x}, padded).out(), {10.0f / 9, 24.0f / 9, 51.0f / 9, 90.0f / 9});
  Attrs exclude = padded;
  exclude.set("count_include_pad", false);
  expect_values(run_op("aten.avg_pool2d.default", {x}, exclude).out(), {10.0f / 4, 24.0f / 6, 51.0f / 6, 90.0f / 9});
  Attrs divisor = padded;
  divisor.set("divisor_override", int64_t{2});
  expect_values(run_op("aten.avg_pool2d.default", {x}, divisor).out(), {5, 12, 25.5, 45});
  // ceil_mode: the last window of a 5-wide input covers one column; its divisor counts that column only.
  const Tensor ceil =
      run_op("aten.avg_pool2d.default", {iota({1, 5, 5})}, make_attrs({{"kernel_size", Ints{2}}, {"ceil_mode", true}}))
          .out();
  ASSERT_EQ(ceil.shape(), (Shape{1, 3, 3}));
  expect_values(ceil, {3, 5, 6.5, 13, 15, 16.5, 20.5, 22.5, 24});
  EXPECT_THROW(infer_op("aten.avg_pool2d.default", {meta({1, 1, 4, 4})},
                        make_attrs({{"kernel_size", Ints{2}}, {"divisor_override", int64_t{0}}})),
               Error);
  EXPECT_THROW(infer_op("aten.avg_pool2d.default", {meta({1, 1, 4, 4})},
                        make_attrs({{"kernel_size", Ints{3}}, {"padding", Ints{2}}})),
               Error);
}

TEST(AdaptiveAvgPool, OverlappingWindows) {
  const Tensor x = iota({1, 1, 5, 5});
  // Windows [0, 3) and [2, 5) in both dims.
  expect_values(run_op("aten.adaptive_avg_pool2d.default", {x}, make_attrs({{"output_size", Ints{2, 2}}})).out(),
                {6, 8, 16, 18});
  const Tensor global =
      run_op("aten.adaptive_avg_pool2d.default", {x}, make_attrs({{"output_size", Ints{1, 1}}})).out();
  ASSERT_EQ(global.shape(), (Shape{1, 1, 1, 1}));
  expect_values(global, {12});
  const Tensor larger =
      run_op("aten.adaptive_avg_pool2d.default", {iota({1, 2, 2})}, make_attrs({{"output_size", Ints{3}}})).out();
  ASSERT_EQ(larger.shape(), (Shape{1, 3, 3}));
  expect_values(larger, {0, 0.5, 1, 1, 1.5, 2, 2, 2.5, 3});
  // 1-D: windows [0, 2), [1, 4), [3, 5).
  const Tensor one_d =
      run_op("aten.adaptive_avg_pool1d.default", {iota({1, 2, 5})}, make_attrs({{"output_size", Ints{3}}})).out();
  ASSERT_EQ(one_d.shape(), (Shape{1, 2, 3}));
  expect_values(one_d, {0.5, 2, 3.5, 5.5, 7, 8.5});
  EXPECT_THROW(infer_op("aten.adaptive_avg_pool2d.default", {meta({5, 5})}, make_attrs({{"output_size", Ints{2, 2}}})),
               Error);
  EXPECT_THROW(
      infer_op("aten.adaptive_avg_pool2d.default", {meta({1, 5, 5})}, make_attrs({{"output_size", Ints{-1, 2}}})),
      Error);
}

// ====================================================================================================================
// Embedding

TEST(Embedding, GathersRowsForAnyIndexShape) {
  const Tensor weight = floats({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  const Tensor out = run_op("aten.embedding.default", {weight, ints({2, 2}, {0, 3, 2, 2})}).out();
  ASSERT_EQ(out.shape(), (Shape{2, 2, 2}));
  expect_values(out, {0, 1, 30, 31, 20, 21, 20, 21});
  const Tensor scalar =
      run_op("aten.embedding.default", {weight, ints({}, {1})}, make_attrs({{"padding_idx", int64_t{1}}})).out();
  ASSERT_EQ(scalar.shape(), Shape{2});
  expect_values(scalar, {10, 11});
  Tensor int32_indices(DType::Int32, {1});
  int32_indices.mutable_data<int32_t>()[0] = 2;
  expect_values(run_op("aten.embedding.default", {weight, int32_indices}).out(), {20, 21});
  const Tensor empty = run_op("aten.embedding.default", {weight, ints({0}, {})}).out();
  EXPECT_EQ(empty.shape(), (Shape{0, 2}));
}

TEST(Embedding, RejectsBadIndices) {
  const Tensor weight = floats({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  EXPECT_THROW(run_op("aten.embedding.default", {weight, ints({2}, {1, 4})}).out(), Error);
  EXPECT_THROW(run_op("aten.embedding.default", {weight, ints({1}, {-1})}).out(), Error);
  EXPECT_THROW(infer_op("aten.embedding.default", {meta({4, 2}), meta({3})}), Error);
  EXPECT_THROW(infer_op("aten.embedding.default", {meta({8}), {{3}, DType::Int64}}), Error);
}

// ====================================================================================================================
// Scaled dot-product attention against softmax(q k^T * scale + mask) v computed here.

struct AttentionCase {
  Tensor q, k, v;
  std::vector<float> additive_mask;  // [B*H, L, S] after broadcasting, empty for none
  bool causal = false;
  double scale = 0.0;  // 0: 1/sqrt(E)
  int64_t group = 1;   // query heads per key/value head
};

std::vector<float> naive_attention(const AttentionCase& c) {
  const Shape& qs = c.q.shape();
  const int64_t L = qs.end()[-2], E = qs.back(), S = c.k.shape().end()[-2], Ev = c.v.shape().back();
  const int64_t heads = c.q.numel() / (L * E);
  const double scale = c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(E));
  std::vector<float> out;
  for (int64_t h = 0; h < heads; ++h) {
    const float* q = c.q.data<float>() + h * L * E;
    const float* k = c.k.data<float>() + h / c.group * S * E;
    const float* v = c.v.data<float>() + h / c.group * S * Ev;
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> scores(static_cast<size_t>(S));
      double peak = -kInf;
      for (int64_t j = 0; j < S; ++j) {
        double s = 0.0;
        for (int64_t e = 0; e < E; ++e) s += static_cast<double>(q[i * E + e]) * k[j * E + e];
        s *= scale;
        if (!c.additive_mask.empty()) s += c.additive_mask[static_cast<size_t>((h * L + i) * S + j)];
        if (c.causal && j > i) s = -kInf;
        scores[static_cast<size_t>(j)] = s;
        peak = std::max(peak, s);
      }
      double sum = 0.0;
      for (double& s : scores) sum += (s = peak == -kInf ? 0.0 : std::exp(s - peak));
      for (int64_t e = 0; e < Ev; ++e) {
        double acc = 0.0;
        for (int64_t j = 0; j < S; ++j) acc += scores[static_cast<size_t>(j)] * v[j * Ev + e];
        out.push_back(sum == 0.0 ? 0.0f : static_cast<float>(acc / sum));
      }
    }
  }
  return out;
}

TEST(Attention, PlainAndScaled) {
  AttentionCase c{pattern({1, 2, 3, 4}), pattern({1, 2, 5, 4}, 1.0f), pattern({1, 2, 5, 3}, 2.0f)};
  const Tensor out = run_op("aten.scaled_dot_product_attention.default", {c.q, c.k, c.v}).out();
  ASSERT_EQ(out.shape(), (Shape{1, 2, 3, 3}));
  expect_values(out, naive_attention(c));
  c.scale = 2.5;
  expect_values(
      run_op("aten.scaled_dot_product_attention.default", {c.q, c.k, c.v}, make_attrs({{"scale", 2.5}})).out(),
      naive_attention(c));
}

TEST(Attention, MatricesWithoutBatchDims) {
  AttentionCase c{pattern({3, 4}), pattern({5, 4}, 1.0f), pattern({5, 2}, 2.0f)};
  const Tensor out = run_op("aten.scaled_dot_product_attention.default", {c.q, c.k, c.v}).out();
  ASSERT_EQ(out.shape(), (Shape{3, 2}));
  expect_values(out, naive_attention(c));
}

TEST(Attention, CausalAlignsToTheTopLeft) {
  AttentionCase square{pattern({2, 4, 8}), pattern({2, 4, 8}, 1.0f), pattern({2, 4, 8}, 2.0f)};
  square.causal = true;
  expect_values(run_op("aten.scaled_dot_product_attention.default", {square.q, square.k, square.v},
                       make_attrs({{"is_causal", true}}))
                    .out(),
                naive_attention(square));
  // L=3, S=5: row i attends to keys 0..i, like torch.ones(L, S).tril().
  AttentionCase wide{pattern({1, 3, 4}), pattern({1, 5, 4}, 1.0f), pattern({1, 5, 2}, 2.0f)};
  wide.causal = true;
  const Tensor out =
      run_op("aten.scaled_dot_product_attention.default", {wide.q, wide.k, wide.v}, make_attrs({{"is_causal", true}}))
          .out();
  expect_values(out, naive_attention(wide));
  // The first query sees only the first key: its output is v[0].
  EXPECT_NEAR(out.data<float>()[0], wide.v.data<float>()[0], 1e-6);
  EXPECT_NEAR(out.data<float>()[1], wide.v.data<float>()[1], 1e-6);
}

TEST(Attention, BoolAndFloatMasksBroadcast) {
  AttentionCase c{pattern({2, 2, 3, 4}), pattern({2, 2, 5, 4}, 1.0f), pattern({2, 2, 5, 3}, 2.0f)};
  // Bool [3, 5] (true = keep), broadcast over batch and heads; row 2 keeps nothing -> zeros.
  const std::vector<uint8_t> keep = {1, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
  for (int64_t bh = 0; bh < 4; ++bh)
    for (uint8_t k : keep) c.additive_mask.push_back(k ? 0.0f : -kInf);
  const Tensor out = run_op("aten.scaled_dot_product_attention.default", {c.q, c.k, c.v, bools({3, 5}, keep)}).out();
  expect_values(out, naive_attention(c));
  const std::vector<float> values = float_values(out);
  for (int64_t e = 0; e < 3; ++e) EXPECT_EQ(values[static_cast<size_t>(2 * 3 + e)], 0.0f);

  // Float [1, 2, 1, 5]: per-head additive bias, broadcast over batch and query rows.
  const Tensor bias = pattern({1, 2, 1, 5}, 3.0f);
  c.additive_mask.clear();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 5; ++j) c.additive_mask.push_back(bias.data<float>()[h * 5 + j]);
  expect_values(run_op("aten.scaled_dot_product_attention.default", {c.q, c.k, c.v, bias}).out(), naive_attention(c));
}

TEST(Attention, GroupedQueryHeads) {
  AttentionCase c{pattern({1, 4, 3, 8}), pattern({1, 2, 5, 8}, 1.0f), pattern({1, 2, 5, 6}, 2.0f)};
  c.group = 2;
  c.causal = true;
  const Tensor out = run_op("aten.scaled_dot_product_attention.default", {c.q, c.k, c.v},
                            make_attrs({{"enable_gqa", true}, {"is_causal", true}}))
                         .out();
  ASSERT_EQ(out.shape(), (Shape{1, 4, 3, 6}));
  expect_values(out, naive_attention(c));
  EXPECT_THROW(infer_op("aten.scaled_dot_product_attention.default",
                        {meta({1, 4, 3, 8}), meta({1, 2, 5, 8}), meta({1, 2, 5, 6})}),
               Error);
  EXPECT_THROW(
      infer_op("aten.scaled_dot_product_attention.default",
               {meta({1, 4, 3, 8}), meta({1, 3, 5, 8}), meta({1, 3, 5, 6})}, make_attrs({{"enable_gqa", true}})),
      Error);
}

TEST(Attention, RejectsBadShapes) {
  const auto sdpa = [](Attrs attrs, std::vector<TensorMeta> inputs) {
    return infer_op("aten.scaled_dot_product_attention.default", inputs, std::move(attrs));
  };
  EXPECT_THROW(sdpa(make_attrs(), {meta({1, 3, 4}), meta({1, 5, 3}), meta({1, 5, 2})}), Error);  // E differs
  EXPECT_THROW(sdpa(make_attrs(), {meta({1, 3, 4}), meta({1, 5, 4}), meta({1, 6, 2})}), Error);  // S differs
  EXPECT_THROW(sdpa(make_attrs(), {meta({1, 3, 4}), meta({1, 5, 4}), meta({1, 5, 2}), meta({4, 5})}), Error);
  EXPECT_THROW(
      sdpa(make_attrs({{"is_causal", true}}), {meta({1, 3, 4}), meta({1, 5, 4}), meta({1, 5, 2}), meta({3, 5})}),
      Error);
  EXPECT_THROW(sdpa(make_attrs(), {meta({1, 3, 4}), meta({1, 5, 4}), meta({1, 5, 2}), {{3, 5}, DType::Int64}}), Error);
  EXPECT_THROW(sdpa(make_attrs(), {meta({4}), meta({1, 5, 4}), meta({1, 5, 2})}), Error);
  EXPECT_EQ(sdpa(make_attrs(), {meta({2, 1, 3, 4}), meta({2, 5, 4}), meta({2, 5, 7})})[0].shape, (Shape{2, 2, 3, 7}));
}

TEST(NnRegistry, SpellingsAreRegistered) {
  for (const char* op :
       {"aten.conv2d.default", "aten.conv2d.padding", "aten.conv1d.default", "aten.conv1d.padding",
        "aten.convolution.default", "aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
        "aten.layer_norm.default", "aten.native_layer_norm.default", "aten.group_norm.default",
        "aten.native_group_norm.default", "aten.rms_norm.default", "aten.max_pool2d.default",
        "aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default", "aten.adaptive_avg_pool2d.default",
        "aten.adaptive_avg_pool1d.default", "aten.embedding.default", "aten.scaled_dot_product_attention.default"})
    EXPECT_NE(OpRegistry::instance().find_spelling(op).first, nullptr) << op;
}

}  // namespace
