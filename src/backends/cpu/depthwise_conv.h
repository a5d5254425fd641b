#pragma once
// Depthwise convolutions (each output channel reads its own input channel only) eight channels at a time, AVX2:
// the eight channels' input rows are interleaved into [rows][padded columns][8], so that one vector holds one
// input pixel of all eight channels, every output pixel is one vector multiply-add per kernel tap, and the sums of
// eight pixels are transposed back into the channels' planes. Every lane does work whatever the plane's width (a
// 7x7 plane leaves one lane in eight idle with vectors along its rows), and there is no set-up per plane.
// Output rows go in bands whose interleaved inputs stay in the near caches.
#include <cstdint>
#include <vector>

#include "backends/cpu/direct_conv.h"

namespace npusim::cpu {

class DepthwiseConv {
 public:
  static constexpr int64_t kChannels = 8;  // channels per vector

  // Whether this CPU runs it (AVX2 and FMA) and it beats the plane-by-plane DirectConv on `g`: output rows
  // narrower than four vectors (on Zen 4, MobileNetV2's 28-column planes 0.10 -> 0.09 ms, 7-column ones 0.10 ->
  // 0.044 ms; rows of 56 and 112 columns ran 7-20% slower than plane by plane, which leaves no lane idle there).
  static bool suitable(const ConvWindow& g);

  explicit DepthwiseConv(const ConvWindow& g);

  // Output rows per band, and bands per plane.
  int64_t band_rows() const { return band_rows_; }
  int64_t bands() const { return (g_.out[0] + band_rows_ - 1) / band_rows_; }
  // Floats of scratch one band needs (the interleaved input rows and the weights).
  int64_t scratch_floats() const;

  // Output rows of band `band` for channels [0, count) (1 to kChannels): `in` holds their input planes
  // ([count][in_h][in_w]), `weights` their taps ([count][kernel_h * kernel_w]), `bias` one value each or null.
  // Channel c's band (its rows one after the other) goes to out + c * out_channel_stride, each sum clamped to
  // [low, high] (a NaN stays NaN); nothing else is written. Fails on CPUs without AVX2 and FMA.
  void run_band(const float* in, const float* weights, const float* bias, int64_t count, int64_t band, float low,
                float high, float* out, int64_t out_channel_stride, float* scratch) const;

 private:
  ConvWindow g_;
  int64_t band_rows_ = 1;
  int64_t padded_cols_ = 0;           // columns of padded input the taps read
  std::vector<int64_t> tap_offsets_;  // per tap, floats from an output pixel's first interleaved input
};

}  // namespace npusim::cpu
