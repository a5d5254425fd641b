#pragma once
// One channel's plane of a depthwise convolution (every output channel reads one input channel), in fp32:
// out[oy, ox] = clamp(bias + sum over taps of w[ky, kx] * in[oy * sy - pad_h + ky * dy, ox * sx - pad_w + kx * dx]),
// zero outside the input. The plane is first copied zero-padded and split by the column stride (phase r holds padded
// columns r, r + sx, ...), so that every tap reads consecutive values for consecutive output pixels with no bounds
// checks: a row of outputs is a few vector multiply-adds per tap, for 7x7 planes and strided kernels alike.
#include <array>
#include <cstdint>
#include <vector>

namespace npusim::cpu {

struct DepthwiseGeometry {
  std::array<int64_t, 2> in{1, 1}, kernel{1, 1}, stride{1, 1}, dilation{1, 1}, pad{0, 0}, out{1, 1};
};

class DepthwisePlane {
 public:
  explicit DepthwisePlane(const DepthwiseGeometry& g);

  // Floats of scratch run() needs; clear() zeroes them before the first run on them (run() keeps the padding zero).
  void clear(float* scratch) const;
  int64_t scratch_floats() const {
    // The phases, a strided plane's padded row, and one vector of room for the zeros written after the last row.
    return g_.stride[1] * rows_ * row_floats_ + (g_.stride[1] > 1 ? g_.stride[1] * row_floats_ : 0) + 8;
  }

  // `in` [in_h, in_w], `weights` [kernel_h * kernel_w], `out` [out_h, out_w]; every output is clamped to [low, high]
  // (NaN stays NaN). `vectors` false takes the portable loops where the CPU has AVX2 and FMA (for tests).
  void run(const float* in, const float* weights, float bias, float low, float high, float* scratch, float* out,
           bool vectors = true) const;

 private:
  void fill_phases(const float* in, float* phases, bool avx2) const;
  void rows_portable(const float* phases, const float* weights, float bias, float low, float high, float* out) const;
  void rows_avx2(const float* phases, const float* weights, float bias, float low, float high, float* out) const;

  DepthwiseGeometry g_;
  int64_t rows_ = 0;                  // rows of the padded plane the taps read
  int64_t row_floats_ = 0;            // floats per row of one phase, whole vectors past the last output column included
  std::vector<int64_t> tap_offsets_;  // where each tap of output row 0 reads, from the start of the phases
};

}  // namespace npusim::cpu
