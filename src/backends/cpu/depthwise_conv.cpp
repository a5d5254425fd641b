#include "backends/cpu/depthwise_conv.h"

#include <algorithm>

#include "core/cpu_features.h"
#include "npusim/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "backends/cpu/avx2_transpose.h"
#define NPUSIM_DEPTHWISE_X86 1
#endif

namespace npusim::cpu {

namespace {

constexpr int64_t kLanes = DepthwiseConv::kChannels;
// Interleaved input rows per band: about 64 KiB, in L2 next to the weights and outputs.
constexpr int64_t kBandFloats = 16 * 1024;

// Padded input rows that `out_rows` output rows read.
int64_t input_rows(const ConvWindow& g, int64_t out_rows) {
  return (out_rows - 1) * g.stride[0] + (g.kernel[0] - 1) * g.dilation[0] + 1;
}

#ifdef NPUSIM_DEPTHWISE_X86
// The mask of the first `lanes` (0 to 8) lanes.
__attribute__((target("avx2"))) __m256i first_lanes(int64_t lanes) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

struct Band {
  int64_t first_row = 0, rows = 0;
};

// Padded input rows [first, first + rows) of `count` channels as [rows][padded_cols][8]: lane c of column x of row r
// is channel c's input (first + r - pad_h, x - pad_w), zero outside the input and for channels past `count`.
__attribute__((target("avx2"))) void interleave_rows(const ConvWindow& g, int64_t padded_cols, const float* in,
                                                     int64_t count, Band rows, float* dst) {
  const int64_t height = g.in[0], width = g.in[1], plane = height * width, row_floats = padded_cols * kLanes;
  // Padded columns [x_begin, x_end) lie inside the input.
  const int64_t x_begin = std::clamp<int64_t>(g.pad[1], 0, padded_cols);
  const int64_t x_end = std::clamp<int64_t>(g.pad[1] + width, x_begin, padded_cols);
  for (int64_t r = 0; r < rows.rows; ++r, dst += row_floats) {
    const int64_t iy = rows.first_row + r - g.pad[0];
    if (iy < 0 || iy >= height) {
      std::fill(dst, dst + row_floats, 0.0f);
      continue;
    }
    std::fill(dst, dst + x_begin * kLanes, 0.0f);
    std::fill(dst + x_end * kLanes, dst + row_floats, 0.0f);
    const int64_t row_at = iy * width + (x_begin - g.pad[1]);  // in each plane
    for (int64_t x = x_begin; x < x_end; x += kLanes) {
      const int64_t columns = std::min(kLanes, x_end - x), at = row_at + x - x_begin;
      // Whole loads wherever eight values lie inside the plane (the lanes past the row are not stored).
      const bool whole = at + kLanes <= plane;
      const __m256i mask = first_lanes(columns);
      __m256 v[kLanes];
      for (int64_t c = 0; c < kLanes; ++c)
        v[c] = c >= count ? _mm256_setzero_ps()
               : whole    ? _mm256_loadu_ps(in + c * plane + at)
                          : _mm256_maskload_ps(in + c * plane + at, mask);
      transpose8(v);  // v[j]: column x + j of every channel
      for (int64_t j = 0; j < columns; ++j) _mm256_storeu_ps(dst + (x + j) * kLanes, v[j]);
    }
  }
}

// Eight output pixels at a time (consecutive in the band's rows, wrapping from one row to the next): per tap, one
// multiply-add of the eight channels' weights with each pixel's interleaved input; then the 8 x 8 sums are
// transposed into eight pixels per channel.
__attribute__((target("avx2,fma"))) void band_avx2(const ConvWindow& g, int64_t padded_cols, const int64_t* tap_offsets,
                                                   const float* interleaved, const float* weights, const float* bias,
                                                   int64_t count, Band band, float low, float high, float* out,
                                                   int64_t out_channel_stride) {
  const int64_t taps = g.kernel[0] * g.kernel[1], out_w = g.out[1], total = band.rows * out_w;
  const int64_t row_step = g.stride[0] * padded_cols * kLanes, column_step = g.stride[1] * kLanes;
  const __m256 low_v = _mm256_set1_ps(low), high_v = _mm256_set1_ps(high), bias_v = _mm256_loadu_ps(bias);
  int64_t oy = 0, ox = 0;  // of the next pixel, within the band
  for (int64_t q = 0; q < total; q += kLanes) {
    const int64_t pixels = std::min(kLanes, total - q);
    const float* bases[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      if (j >= pixels) {
        bases[j] = bases[pixels - 1];
        continue;
      }
      bases[j] = interleaved + oy * row_step + ox * column_step;
      if (++ox == out_w) {
        ox = 0;
        ++oy;
      }
    }
    __m256 sums[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) sums[j] = bias_v;
    for (int64_t t = 0; t < taps; ++t) {
      const __m256 w = _mm256_loadu_ps(weights + t * kLanes);
      const int64_t at = tap_offsets[t];
      for (int64_t j = 0; j < kLanes; ++j) sums[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(bases[j] + at), sums[j]);
    }
    for (int64_t j = 0; j < kLanes; ++j) sums[j] = _mm256_min_ps(high_v, _mm256_max_ps(low_v, sums[j]));
    transpose8(sums);  // sums[c]: channel c's eight pixels
    float* dst = out + q;
    for (int64_t c = 0; c < count; ++c) {
      if (pixels == kLanes)
        _mm256_storeu_ps(dst + c * out_channel_stride, sums[c]);
      else
        _mm256_maskstore_ps(dst + c * out_channel_stride, first_lanes(pixels), sums[c]);
    }
  }
}
#endif

}  // namespace

bool DepthwiseConv::suitable(const ConvWindow& g) {
#ifdef NPUSIM_DEPTHWISE_X86
  return cpu_features().avx2_fma_f16c() && g.out[1] < 4 * kLanes;
#else
  (void)g;
  return false;
#endif
}

DepthwiseConv::DepthwiseConv(const ConvWindow& g) : g_(g) {
  if (g.out[0] <= 0 || g.out[1] <= 0) return;
  padded_cols_ = (g.out[1] - 1) * g.stride[1] + (g.kernel[1] - 1) * g.dilation[1] + 1;
  const int64_t row_floats = padded_cols_ * kLanes;
  while (band_rows_ < g.out[0] && input_rows(g, band_rows_ + 1) * row_floats <= kBandFloats) ++band_rows_;
  for (int64_t ky = 0; ky < g.kernel[0]; ++ky)
    for (int64_t kx = 0; kx < g.kernel[1]; ++kx)
      tap_offsets_.push_back((ky * g.dilation[0] * padded_cols_ + kx * g.dilation[1]) * kLanes);
}

int64_t DepthwiseConv::scratch_floats() const {
  const int64_t taps = g_.kernel[0] * g_.kernel[1];
  return input_rows(g_, band_rows_) * padded_cols_ * kLanes + (taps + 1) * kLanes;
}

void DepthwiseConv::run_band(const float* in, const float* weights, const float* bias, int64_t count, int64_t band,
                             float low, float high, float* out, int64_t out_channel_stride, float* scratch) const {
  if (g_.out[0] <= 0 || g_.out[1] <= 0) return;
#ifdef NPUSIM_DEPTHWISE_X86
  const int64_t taps = g_.kernel[0] * g_.kernel[1];
  const int64_t first = band * band_rows_, rows = std::min(band_rows_, g_.out[0] - first);
  float* interleaved = scratch;
  float* lane_weights = scratch + input_rows(g_, band_rows_) * padded_cols_ * kLanes;  // [taps][8]
  float* lane_bias = lane_weights + taps * kLanes;
  for (int64_t c = 0; c < kLanes; ++c) {
    lane_bias[c] = c < count && bias ? bias[c] : 0.0f;
    for (int64_t t = 0; t < taps; ++t) lane_weights[t * kLanes + c] = c < count ? weights[c * taps + t] : 0.0f;
  }
  interleave_rows(g_, padded_cols_, in, count, {first * g_.stride[0], input_rows(g_, rows)}, interleaved);
  band_avx2(g_, padded_cols_, tap_offsets_.data(), interleaved, lane_weights, lane_bias, count, {first, rows}, low,
            high, out, out_channel_stride);
#else
  (void)in, (void)weights, (void)bias, (void)count, (void)band, (void)low, (void)high, (void)out;
  (void)out_channel_stride, (void)scratch;
  throw Error("DepthwiseConv needs AVX2 and FMA");
#endif
}

}  // namespace npusim::cpu
