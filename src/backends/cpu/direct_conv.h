#pragma once
// Convolutions whose groups read few input channels, computed directly instead of through the packed GEMM:
// depthwise (one input channel per group) and grouped convolutions of narrow groups (ResNeXt's first stage). For
// one group, out[o][oy, ox] = clamp(bias[o] + sum over the group's channels c and taps of
// w[o][c][ky, kx] * in[c][oy * sy - pad_h + ky * dy, ox * sx - pad_w + kx * dx]), zero outside the input.
// The group's input planes are first copied zero-padded and split by the column stride (phase r holds padded columns
// r, r + sx, ...), so that every tap reads consecutive values for consecutive output pixels with no bounds checks;
// each output row is then a few vector multiply-adds per channel and tap, summed in registers. Groups of more
// channels (and stems) take six output planes at a time from a packed weight panel (compute_panel), so that each
// input vector loaded serves six multiply-adds.
#include <array>
#include <cstdint>
#include <vector>

namespace npusim::cpu {

// One group's sliding window over a plane: [height, width] of the input, the kernel, strides, dilations, padding
// before each dimension and the output plane.
struct ConvWindow {
  std::array<int64_t, 2> in{1, 1}, kernel{1, 1}, stride{1, 1}, dilation{1, 1}, pad{0, 0}, out{1, 1};
};

struct DirectConvGeometry : ConvWindow {
  int64_t channels = 1;  // input channels of one group
};

class DirectConv {
 public:
  explicit DirectConv(const DirectConvGeometry& g);

  // Floats of scratch load_inputs() fills; clear() zeroes them before the first load on them (loads keep the
  // padding zero).
  int64_t scratch_floats() const { return g_.channels * channel_floats_ + g_.stride[1] * row_floats_ + 64; }
  void clear(float* scratch) const;

  // Copies the group's `channels` input planes ([channels][in_h][in_w], contiguous) into `scratch`. `vectors` false
  // takes the portable loops where the CPU has AVX2 and FMA (for tests).
  void load_inputs(const float* in, float* scratch, bool vectors = true) const;
  // One output plane [out_h, out_w] from the loaded inputs: `weights` [channels][kernel_h * kernel_w]; every output
  // is clamped to [low, high] (NaN stays NaN).
  void compute(const float* scratch, const float* weights, float bias, float low, float high, float* out,
               bool vectors = true) const;
  // Up to six output planes at once (groups of more input channels), each input vector serving all of them:
  // `panel` holds their weights as a packed GEMM's A panel (six values per (channel, tap) step, channel-major, rows
  // past `outs` zero), `bias` one value per plane or null; plane o goes to out + o * out_stride. Only output rows
  // [row0, row1) are computed and stored (row1 -1: to the last), so that workers can share a group's planes. AVX2
  // and FMA only.
  void compute_panel(const float* scratch, const float* panel, int64_t outs, const float* bias, float low, float high,
                     float* out, int64_t out_stride, int64_t row0 = 0, int64_t row1 = -1) const;
  // Whether compute_panel runs on this CPU.
  static bool panels_supported();

 private:
  void fill_phases(const float* in, float* phases, float* row, bool avx2) const;
  void rows_portable(const float* scratch, const float* weights, float bias, float low, float high, float* out) const;
  void rows_avx2(const float* scratch, const float* weights, float bias, float low, float high, float* out) const;
  void panel_rows_avx512(const float* scratch, const float* panel, int64_t outs, const float* bias, float low,
                         float high, float* out, int64_t out_stride, int64_t row0, int64_t row1) const;

  DirectConvGeometry g_;
  int64_t rows_ = 0;                  // rows of a padded plane the taps read
  int64_t row_floats_ = 0;            // floats per row of one phase, whole vectors past the last output column included
  int64_t channel_floats_ = 0;        // one channel's phases
  std::vector<int64_t> tap_offsets_;  // where each tap of output row 0 reads, from the start of a channel's phases
  std::vector<int64_t> step_offsets_;  // the same per (channel, tap) step, from the start of the first channel's
};

}  // namespace npusim::cpu
