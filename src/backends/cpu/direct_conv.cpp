#include "backends/cpu/direct_conv.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512 broadcast intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define NPUSIM_DIRECT_CONV_X86 1
#endif

#include <algorithm>

#include "core/cpu_features.h"
#include "npusim/error.h"

namespace npusim::cpu {

namespace {

constexpr int64_t kLanes = 8;  // one AVX2 vector of floats

int64_t round_up(int64_t value, int64_t step) { return (value + step - 1) / step * step; }

// As _mm256_max_ps(low, x) and _mm256_min_ps(high, x) take it: a NaN x stays NaN.
float clamp_keeping_nan(float x, float low, float high) {
  x = low > x ? low : x;
  return high < x ? high : x;
}

#ifdef NPUSIM_DIRECT_CONV_X86
// The mask of the first `lanes` (0 to 8) lanes.
__attribute__((target("avx2"))) __m256i first_lanes(int64_t lanes) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// dst[i] = src[i] for i < count, and zero up to the next multiple of 8 (a masked load reads nothing past src's end;
// whole stores are cheaper than masked ones here).
__attribute__((target("avx2"))) void copy_floats_avx2(const float* src, int64_t count, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
  if (i < count) _mm256_storeu_ps(dst + i, _mm256_maskload_ps(src + i, first_lanes(count - i)));
}

// Values [first, first + 8) of an input row `width` long, zero outside it.
__attribute__((target("avx2"))) __m256 load_inside(const float* row, int64_t first, int64_t width) {
  if (first >= 0 && first + kLanes <= width) return _mm256_loadu_ps(row + first);
  const __m256i column =
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i inside = _mm256_and_si256(_mm256_cmpgt_epi32(column, _mm256_set1_epi32(-1)),
                                          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width)), column));
  return _mm256_maskload_ps(row + first, inside);
}

// even[j] = padded[2 j], odd[j] = padded[2 j + 1] for j < count (a multiple of 8), the padded row being the input
// row `width` long with `pad` zeros before it and zeros after it. Read straight from the input: a row copied into a
// buffer just before, at another alignment, makes every load wait on two stores (3-10x slower).
__attribute__((target("avx2"))) void split_pairs_avx2(const float* row, int64_t width, int64_t pad, int64_t count,
                                                      float* even, float* odd) {
  for (int64_t j = 0; j < count; j += kLanes) {
    const int64_t first = 2 * j - pad;
    const __m256 a = load_inside(row, first, width), b = load_inside(row, first + kLanes, width);
    // Within each 128-bit half: the even (odd) values of a's half, then of b's; then the halves put in order.
    const __m256 evens = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    const __m256 odds = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    _mm256_storeu_ps(even + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(evens), 0xD8)));
    _mm256_storeu_ps(odd + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odds), 0xD8)));
  }
}
#else
void copy_floats_avx2(const float*, int64_t, float*) {}
void split_pairs_avx2(const float*, int64_t, int64_t, int64_t, float*, float*) {}
#endif

// dst[i] = src[i] for i < count; with avx2, zeros up to the next multiple of 8.
void copy_floats(const float* src, int64_t count, float* dst, bool avx2) {
  if (avx2) return copy_floats_avx2(src, count, dst);
  std::copy(src, src + count, dst);
}

}  // namespace

DirectConv::DirectConv(const DirectConvGeometry& g) : g_(g) {
  rows_ = (g.out[0] - 1) * g.stride[0] + (g.kernel[0] - 1) * g.dilation[0] + 1;
  row_floats_ = round_up((g.kernel[1] - 1) * g.dilation[1] / g.stride[1] + round_up(g.out[1], kLanes), kLanes);
  channel_floats_ = g.stride[1] * rows_ * row_floats_;
  for (int64_t ky = 0; ky < g.kernel[0]; ++ky)
    for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
      const int64_t column = kx * g.dilation[1];
      tap_offsets_.push_back(((column % g.stride[1]) * rows_ + ky * g.dilation[0]) * row_floats_ +
                             column / g.stride[1]);
    }
  for (int64_t c = 0; c < g.channels; ++c)
    for (const int64_t offset : tap_offsets_) step_offsets_.push_back(c * channel_floats_ + offset);
}

void DirectConv::clear(float* scratch) const { std::fill_n(scratch, scratch_floats(), 0.0f); }

void DirectConv::load_inputs(const float* in, float* scratch, bool vectors) const {
  const bool avx2 = vectors && cpu_features().avx2_fma_f16c();
  float* row = scratch + g_.channels * channel_floats_;
  for (int64_t c = 0; c < g_.channels; ++c)
    fill_phases(in + c * g_.in[0] * g_.in[1], scratch + c * channel_floats_, row, avx2);
}

// Phase r, row y, column j holds padded column j * sx + r of padded row y: input (y - pad_h, j * sx + r - pad_w), or
// zero outside the input. Only the input's places are written (and zeros right after them, which may reach into the
// next row or channel, written later, or into padding): the padding stays zero from clear(). A strided plane's row
// is padded whole first (`row`, sx * row_floats_ floats), then split into its phases; with AVX2, stride 2 splits
// straight from the input row.
void DirectConv::fill_phases(const float* in, float* phases, float* row, bool avx2) const {
  const int64_t sx = g_.stride[1], height = g_.in[0], width = g_.in[1], padded_width = sx * row_floats_;
  // Input rows [first_row, last_row) and columns [0, columns) land in the plane.
  const int64_t first_row = std::max<int64_t>(0, -g_.pad[0]), last_row = std::min(height, rows_ - g_.pad[0]);
  const int64_t columns = std::clamp<int64_t>(padded_width - g_.pad[1], 0, width);
  for (int64_t iy = first_row; iy < last_row; ++iy) {
    const int64_t y = iy + g_.pad[0];
    if (sx == 2 && avx2) {
      split_pairs_avx2(in + iy * width, width, g_.pad[1], row_floats_, phases + y * row_floats_,
                       phases + (rows_ + y) * row_floats_);
      continue;
    }
    copy_floats(in + iy * width, columns, (sx > 1 ? row : phases + y * row_floats_) + g_.pad[1], avx2);
    if (sx == 1) continue;
    for (int64_t r = 0; r < sx; ++r) {
      float* phase = phases + (r * rows_ + y) * row_floats_;
      for (int64_t c = 0; c < row_floats_; ++c) phase[c] = row[c * sx + r];
    }
  }
}

void DirectConv::rows_portable(const float* scratch, const float* weights, float bias, float low, float high,
                               float* out) const {
  const int64_t out_h = g_.out[0], out_w = g_.out[1], taps = static_cast<int64_t>(tap_offsets_.size());
  for (int64_t oy = 0; oy < out_h; ++oy) {
    float* row = out + oy * out_w;
    std::fill(row, row + out_w, bias);
    for (int64_t c = 0; c < g_.channels; ++c) {
      const float* base = scratch + c * channel_floats_ + oy * g_.stride[0] * row_floats_;
      for (int64_t t = 0; t < taps; ++t) {
        const float w = weights[c * taps + t];
        const float* src = base + tap_offsets_[static_cast<size_t>(t)];
        for (int64_t ox = 0; ox < out_w; ++ox) row[ox] += w * src[ox];
      }
    }
    for (int64_t ox = 0; ox < out_w; ++ox) row[ox] = clamp_keeping_nan(row[ox], low, high);
  }
}

#ifdef NPUSIM_DIRECT_CONV_X86
// Up to four vectors of one output row at a time, summed in registers over the channels and taps; rows in order.
__attribute__((target("avx2,fma"))) void DirectConv::rows_avx2(const float* scratch, const float* weights, float bias,
                                                               float low, float high, float* out) const {
  constexpr int64_t kVectors = 4;
  const int64_t out_h = g_.out[0], out_w = g_.out[1], taps = static_cast<int64_t>(tap_offsets_.size());
  const int64_t channels = g_.channels;
  const int64_t* offsets = tap_offsets_.data();
  const __m256 low_v = _mm256_set1_ps(low), high_v = _mm256_set1_ps(high);
  const int64_t whole = out_w / (kVectors * kLanes) * (kVectors * kLanes);
  // Output rows in blocks of kRows. First the columns past the whole 32-column chunks (all of a narrow image's), all
  // the block's rows at once: their sums are independent chains of multiply-adds, where one row alone would wait on
  // each (7x7 depthwise over 14 columns: 0.36 -> 0.22 ms for 384 planes). Rows past the image repeat the block's last
  // row and are not stored. The last vector of a row is stored whole (a masked store is slow on some CPUs), running
  // into the next row's first columns, which are written afterwards: the block's vectors go right to left, and the
  // chunks after. Only the image's last store is masked.
  constexpr int64_t kRows = 4;
  for (int64_t oy0 = 0; oy0 < out_h; oy0 += kRows) {
    const float* bases[kRows];
    for (int64_t r = 0; r < kRows; ++r) bases[r] = scratch + std::min(oy0 + r, out_h - 1) * g_.stride[0] * row_floats_;
    for (int64_t x0 = whole + (out_w - whole - 1) / kLanes * kLanes; x0 >= whole && out_w > whole; x0 -= kLanes) {
      __m256 acc[kRows];
      for (int64_t r = 0; r < kRows; ++r) acc[r] = _mm256_set1_ps(bias);
      for (int64_t c = 0; c < channels; ++c) {
        const float* w = weights + c * taps;
        const int64_t at = c * channel_floats_ + x0;
        for (int64_t t = 0; t < taps; ++t) {
          const __m256 wt = _mm256_set1_ps(w[t]);
          for (int64_t r = 0; r < kRows; ++r)
            acc[r] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(bases[r] + at + offsets[t]), acc[r]);
        }
      }
      for (int64_t r = 0; r < kRows && oy0 + r < out_h; ++r) {
        const int64_t at = (oy0 + r) * out_w + x0;
        const __m256 value = _mm256_min_ps(high_v, _mm256_max_ps(low_v, acc[r]));
        if (at + kLanes <= out_h * out_w)
          _mm256_storeu_ps(out + at, value);
        else
          _mm256_maskstore_ps(out + at, first_lanes(out_w - x0), value);
      }
    }
    for (int64_t oy = oy0; oy < std::min(out_h, oy0 + kRows); ++oy) {
      float* row = out + oy * out_w;
      const float* base = scratch + oy * g_.stride[0] * row_floats_;
      for (int64_t x0 = 0; x0 < whole; x0 += kVectors * kLanes) {
        __m256 acc[kVectors];
        for (int64_t v = 0; v < kVectors; ++v) acc[v] = _mm256_set1_ps(bias);
        for (int64_t c = 0; c < channels; ++c) {
          const float* channel = base + c * channel_floats_ + x0;
          const float* w = weights + c * taps;
          for (int64_t t = 0; t < taps; ++t) {
            const __m256 wt = _mm256_set1_ps(w[t]);
            const float* src = channel + offsets[t];
            for (int64_t v = 0; v < kVectors; ++v)
              acc[v] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(src + v * kLanes), acc[v]);
          }
        }
        for (int64_t v = 0; v < kVectors; ++v)
          _mm256_storeu_ps(row + x0 + v * kLanes, _mm256_min_ps(high_v, _mm256_max_ps(low_v, acc[v])));
      }
    }
  }
}
#else
void DirectConv::rows_avx2(const float* scratch, const float* weights, float bias, float low, float high,
                           float* out) const {
  rows_portable(scratch, weights, bias, low, high, out);
}
#endif

#ifdef NPUSIM_DIRECT_CONV_X86
namespace {

constexpr int64_t kPanelRows = 6;  // a packed GEMM's A panel

// Six output planes x two vectors of output pixels: vector v at `base[v]` plus each step's offset, every step's six
// weights broadcast against both. The vectors are 16 pixels of one output row, or 8 pixels of two rows.
__attribute__((target("avx2,fma"))) void panel_tile(int64_t steps, const float* panel, const int64_t* offsets,
                                                    const float* const (&base)[2], __m256 (&sums)[kPanelRows][2]) {
  __m256 s[kPanelRows][2];
  for (int o = 0; o < kPanelRows; ++o) s[o][0] = sums[o][0], s[o][1] = sums[o][1];
  for (int64_t p = 0; p < steps; ++p, panel += kPanelRows) {
    const __m256 x0 = _mm256_loadu_ps(base[0] + offsets[p]), x1 = _mm256_loadu_ps(base[1] + offsets[p]);
    for (int o = 0; o < kPanelRows; ++o) {
      const __m256 w = _mm256_broadcast_ss(panel + o);
      s[o][0] = _mm256_fmadd_ps(w, x0, s[o][0]);
      s[o][1] = _mm256_fmadd_ps(w, x1, s[o][1]);
    }
  }
  for (int o = 0; o < kPanelRows; ++o) sums[o][0] = s[o][0], sums[o][1] = s[o][1];
}

// Vector v of a tile's six sums, clamped, into the first `outs` planes at row oy from column x0 (only the row's
// columns; nothing for a row past the plane).
struct PanelStore {
  float* out;
  int64_t out_stride, outs, out_h, out_w;
  __m256 low, high;

  __attribute__((target("avx2"))) void operator()(const __m256 (&sums)[kPanelRows][2], int v, int64_t oy,
                                                  int64_t x0) const {
    const int64_t lanes = std::min(kLanes, out_w - x0);
    if (lanes <= 0 || oy >= out_h) return;
    for (int64_t o = 0; o < outs; ++o) {
      const __m256 value = _mm256_min_ps(high, _mm256_max_ps(low, sums[o][v]));
      float* dst = out + o * out_stride + oy * out_w + x0;
      if (lanes == kLanes)
        _mm256_storeu_ps(dst, value);
      else
        _mm256_maskstore_ps(dst, first_lanes(lanes), value);
    }
  }
};

// The same with AVX-512: six output planes x Vectors vectors of 16 pixels of one output row (two: three or four
// measured slower on ResNet's stem, their last tile of a 112-pixel row mostly idle or their sums spilled).
template <int Vectors>
__attribute__((target("avx512f,avx2,fma"))) void panel_tile_avx512(int64_t steps, const float* panel,
                                                                   const int64_t* offsets, const float* base,
                                                                   __m512 (&sums)[kPanelRows][Vectors]) {
  __m512 s[kPanelRows][Vectors];
  for (int o = 0; o < kPanelRows; ++o)
    for (int v = 0; v < Vectors; ++v) s[o][v] = sums[o][v];
  for (int64_t p = 0; p < steps; ++p, panel += kPanelRows) {
    __m512 x[Vectors];
    for (int v = 0; v < Vectors; ++v) x[v] = _mm512_loadu_ps(base + offsets[p] + 16 * v);
    for (int o = 0; o < kPanelRows; ++o) {
      const __m512 w = _mm512_set1_ps(panel[o]);
      for (int v = 0; v < Vectors; ++v) s[o][v] = _mm512_fmadd_ps(w, x[v], s[o][v]);
    }
  }
  for (int o = 0; o < kPanelRows; ++o)
    for (int v = 0; v < Vectors; ++v) sums[o][v] = s[o][v];
}

// AVX-512 where it doubles the work per instruction: cores with full-width 512-bit units (Zen 4 splits each 512-bit
// multiply-add in two, as the GEMM's tiles measured), rows wider than 16 pixels (narrower ones fill half a vector or
// less).
bool panel_rows_avx512_pay(int64_t out_w) {
  const CpuFeatures& cpu = cpu_features();
  return cpu.avx512() && !cpu.avx512_halved && out_w > 2 * kLanes;
}

// What the tiles of one panel's output rows share (see panel_rows_avx512).
struct PanelRowTiles {
  const float* scratch;
  const float* panel;
  const int64_t* offsets;
  int64_t steps, row_step;
  int64_t outs;
  const float* bias;
  float low, high;
  float* out;
  int64_t out_stride, out_w;
};

// The tile of `Vectors` vectors from pixel x0 of output row oy: sums over every step, clamped, stored for the row's
// pixels only.
template <int Vectors>
__attribute__((target("avx512f,avx2,fma"))) void panel_row_tile(const PanelRowTiles& t, int64_t oy, int64_t x0) {
  __m512 sums[kPanelRows][Vectors];
  for (int64_t o = 0; o < kPanelRows; ++o)
    for (int v = 0; v < Vectors; ++v) sums[o][v] = _mm512_set1_ps(t.bias && o < t.outs ? t.bias[o] : 0.0f);
  panel_tile_avx512<Vectors>(t.steps, t.panel, t.offsets, t.scratch + oy * t.row_step + x0, sums);
  const __m512 low = _mm512_set1_ps(t.low), high = _mm512_set1_ps(t.high);
  for (int v = 0; v < Vectors; ++v) {
    const int64_t lanes = std::min<int64_t>(16, t.out_w - x0 - 16 * v);
    if (lanes <= 0) break;
    const auto mask = static_cast<__mmask16>((1u << lanes) - 1u);
    for (int64_t o = 0; o < t.outs; ++o)
      _mm512_mask_storeu_ps(t.out + o * t.out_stride + oy * t.out_w + x0 + 16 * v, mask,
                            _mm512_min_ps(high, _mm512_max_ps(low, sums[o][v])));
  }
}

}  // namespace

bool DirectConv::panels_supported() { return cpu_features().avx2_fma_f16c(); }

// Tiles of two vectors (32 pixels) of one row, and of three for the first tile of a row of an odd number of vectors,
// so that no tile works on a whole vector past the row (a last partial vector reads into the row's slack, or the
// next row, and stores only the row's pixels). ResNet's 7x7 stem on a Sapphire Rapids core: 1.89 -> 1.44 ms; its
// 112-pixel rows as 3 + 2 + 2 vectors instead of 2 + 2 + 2 + 2 on Zen 5: 1.29 -> 1.11 ms.
__attribute__((target("avx512f,avx2,fma"))) void DirectConv::panel_rows_avx512(const float* scratch, const float* panel,
                                                                               int64_t outs, const float* bias,
                                                                               float low, float high, float* out,
                                                                               int64_t out_stride, int64_t row0,
                                                                               int64_t row1) const {
  const int64_t out_w = g_.out[1];
  const PanelRowTiles tiles{.scratch = scratch,
                            .panel = panel,
                            .offsets = step_offsets_.data(),
                            .steps = static_cast<int64_t>(step_offsets_.size()),
                            .row_step = g_.stride[0] * row_floats_,
                            .outs = outs,
                            .bias = bias,
                            .low = low,
                            .high = high,
                            .out = out,
                            .out_stride = out_stride,
                            .out_w = out_w};
  const bool odd = (out_w + 15) / 16 % 2 == 1;
  for (int64_t oy = row0; oy < row1; ++oy) {
    int64_t x0 = 0;
    if (odd) {
      panel_row_tile<3>(tiles, oy, 0);
      x0 = 48;
    }
    for (; x0 < out_w; x0 += 32) panel_row_tile<2>(tiles, oy, x0);
  }
}

// Rows wider than one vector: 16 pixels of one row per tile (the last tile of a row reads into the row's slack and
// stores only the row's pixels). Rows of at most 8 pixels: two rows per tile, so that twelve sums stay in flight.
__attribute__((target("avx2,fma"))) void DirectConv::compute_panel(const float* scratch, const float* panel,
                                                                   int64_t outs, const float* bias, float low,
                                                                   float high, float* out, int64_t out_stride,
                                                                   int64_t row0, int64_t row1) const {
  const int64_t rows_end = row1 < 0 ? g_.out[0] : std::min(row1, g_.out[0]);
  if (panel_rows_avx512_pay(g_.out[1]))
    return panel_rows_avx512(scratch, panel, outs, bias, low, high, out, out_stride, row0, rows_end);
  const int64_t out_w = g_.out[1], steps = static_cast<int64_t>(step_offsets_.size());
  const int64_t row_step = g_.stride[0] * row_floats_;
  const bool two_rows = out_w <= kLanes;
  const __m256 low_v = _mm256_set1_ps(low), high_v = _mm256_set1_ps(high);
  const PanelStore store{out, out_stride, outs, rows_end, out_w, low_v, high_v};  // stores no row from rows_end on
  for (int64_t oy = row0; oy < rows_end; oy += two_rows ? 2 : 1)
    for (int64_t x0 = 0; x0 < out_w; x0 += two_rows ? kLanes : 2 * kLanes) {
      __m256 sums[kPanelRows][2];
      for (int64_t o = 0; o < kPanelRows; ++o)
        sums[o][0] = sums[o][1] = _mm256_set1_ps(bias && o < outs ? bias[o] : 0.0f);
      const float* first = scratch + oy * row_step + x0;
      // A second row past the band (or the plane) reads the first one again and is not stored.
      const float* const base[2] = {first, two_rows ? (oy + 1 < rows_end ? first + row_step : first) : first + kLanes};
      panel_tile(steps, panel, step_offsets_.data(), base, sums);
      store(sums, 0, oy, x0);
      if (two_rows)
        store(sums, 1, oy + 1, x0);
      else
        store(sums, 1, oy, x0 + kLanes);
    }
}
#else
bool DirectConv::panels_supported() { return false; }

void DirectConv::compute_panel(const float*, const float*, int64_t, const float*, float, float, float*, int64_t,
                               int64_t, int64_t) const {
  throw Error("DirectConv::compute_panel needs AVX2 and FMA");
}
#endif

void DirectConv::compute(const float* scratch, const float* weights, float bias, float low, float high, float* out,
                         bool vectors) const {
  if (g_.out[0] <= 0 || g_.out[1] <= 0) return;
  if (vectors && cpu_features().avx2_fma_f16c())
    rows_avx2(scratch, weights, bias, low, high, out);
  else
    rows_portable(scratch, weights, bias, low, high, out);
}

}  // namespace npusim::cpu
