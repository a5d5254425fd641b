// Winograd convolution. Transforms work one channel at a time with the tiles as vector lanes: the channel is copied
// inside a zero border and its rows under the tiles are split by phase (column modulo the tile side), so that element
// k of every tile is one contiguous array and both 1-D passes become plain loops over the tiles (the vertical input
// pass and both output passes over all tiles of the channel at once). Transformed inputs V live as alpha^2 matrices
// [Cin, tiles], the GEMM products M as [Cout, tiles] (or [tiles, Cout] when there are few tiles), each matrix an odd
// number of cache lines after the previous.
#include "backends/cpu/conv_winograd.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backends/cpu/prefetch.h"
#include "core/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NPUSIM_WINOGRAD_X86 1
#define NPUSIM_WINOGRAD_AVX2 __attribute__((target("avx2")))
#endif

namespace npusim::cpu {

namespace {

// Weight transforms G (alpha x 3) for interpolation points 0, ±1, ±2 (F4) and 0, ±1 (F2).
constexpr double kG4[6][3] = {{1.0 / 4, 0, 0},
                              {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                              {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6},
                              {1.0 / 24, -1.0 / 12, 1.0 / 6},
                              {0, 0, 1}};
constexpr double kG2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};

// 1-D transforms over n lanes: out[i][l] = sum_k T[i][k] * in[k][l], with T = B^T (input) or A^T (output). The
// arrays never overlap; the lane loops take restrict pointers so that they vectorize.
[[gnu::always_inline]] inline void input_lanes_f4(const float* __restrict d0, const float* __restrict d1,
                                                  const float* __restrict d2, const float* __restrict d3,
                                                  const float* __restrict d4, const float* __restrict d5,
                                                  float* __restrict o0, float* __restrict o1, float* __restrict o2,
                                                  float* __restrict o3, float* __restrict o4, float* __restrict o5,
                                                  int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    const float a = d4[l] - 4.0f * d2[l], b = d3[l] - 4.0f * d1[l];
    const float c = d4[l] - d2[l], e = 2.0f * (d3[l] - d1[l]);
    o0[l] = 4.0f * d0[l] - 5.0f * d2[l] + d4[l];
    o1[l] = a + b;
    o2[l] = a - b;
    o3[l] = c + e;
    o4[l] = c - e;
    o5[l] = 4.0f * d1[l] - 5.0f * d3[l] + d5[l];
  }
}

[[gnu::always_inline]] inline void input_lanes_f2(const float* __restrict d0, const float* __restrict d1,
                                                  const float* __restrict d2, const float* __restrict d3,
                                                  float* __restrict o0, float* __restrict o1, float* __restrict o2,
                                                  float* __restrict o3, int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    o0[l] = d0[l] - d2[l];
    o1[l] = d1[l] + d2[l];
    o2[l] = d2[l] - d1[l];
    o3[l] = d1[l] - d3[l];
  }
}

[[gnu::always_inline]] inline void output_lanes_f4(const float* __restrict m0, const float* __restrict m1,
                                                   const float* __restrict m2, const float* __restrict m3,
                                                   const float* __restrict m4, const float* __restrict m5,
                                                   float* __restrict y0, float* __restrict y1, float* __restrict y2,
                                                   float* __restrict y3, int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    const float s12 = m1[l] + m2[l], d12 = m1[l] - m2[l], s34 = m3[l] + m4[l], d34 = m3[l] - m4[l];
    y0[l] = m0[l] + s12 + s34;
    y1[l] = d12 + 2.0f * d34;
    y2[l] = s12 + 4.0f * s34;
    y3[l] = d12 + 8.0f * d34 + m5[l];
  }
}

[[gnu::always_inline]] inline void output_lanes_f2(const float* __restrict m0, const float* __restrict m1,
                                                   const float* __restrict m2, const float* __restrict m3,
                                                   float* __restrict y0, float* __restrict y1, int64_t n) {
  for (int64_t l = 0; l < n; ++l) {
    y0[l] = m0[l] + m1[l] + m2[l];
    y1[l] = m1[l] - m2[l] - m3[l];
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// `count` lanes rounded up to whole eight-lane vectors when that at most doubles them (the rounded lanes of one row
// of tiles then end inside the next row), else `count`.
int64_t vector_lanes(int64_t count) {
  const int64_t rounded = ceil_div(count, 8) * 8;
  return rounded <= 2 * count ? rounded : count;
}

// Floats from one transform point's matrix to the next: `floats` rounded up to an odd number of 64-byte lines, so
// that the transforms' alpha^2 streams, one per point, fall into different cache sets.
int64_t point_stride(int64_t floats) {
  const int64_t lines = ceil_div(floats, 16);
  return (lines % 2 == 0 ? lines + 1 : lines) * 16;
}

// Where the input transform keeps a channel: the zero-bordered plane (rows of `padded_w`, with slack for the whole
// vectors read past the last row) and the phase arrays (`phase_stride` apart, with slack for the whole vectors of
// tiles written past the last row of tiles).
struct InputLayout {
  int64_t padded_w, padded_floats, phase_stride, deinterleaved_row, lanes;
};

InputLayout input_layout(int m, int64_t tiles_h, int64_t tiles_w) {
  const int64_t row = tiles_w + 1, deinterleaved_row = ceil_div(row, 8) * 8;
  const int64_t padded_w = row * m, padded_floats = (tiles_h * m + 2) * padded_w + (deinterleaved_row - row) * m;
  return {padded_w, padded_floats, tiles_h * row + deinterleaved_row - row, deinterleaved_row, tiles_h * row};
}

// The 1-D transforms over pointer arrays, compiled twice: for the baseline ISA and for AVX2 (the same operations,
// eight lanes at a time; no FMA, so both give the same bits).
using Transform1d = void (*)(const float* const* in, float* const* out, int64_t n);

#define NPUSIM_WINOGRAD_TRANSFORMS(suffix, attributes)                                                           \
  attributes void input_transform_f4##suffix(const float* const* in, float* const* out, int64_t n) {             \
    input_lanes_f4(in[0], in[1], in[2], in[3], in[4], in[5], out[0], out[1], out[2], out[3], out[4], out[5], n); \
  }                                                                                                              \
  attributes void input_transform_f2##suffix(const float* const* in, float* const* out, int64_t n) {             \
    input_lanes_f2(in[0], in[1], in[2], in[3], out[0], out[1], out[2], out[3], n);                               \
  }                                                                                                              \
  attributes void output_transform_f4##suffix(const float* const* in, float* const* out, int64_t n) {            \
    output_lanes_f4(in[0], in[1], in[2], in[3], in[4], in[5], out[0], out[1], out[2], out[3], n);                \
  }                                                                                                              \
  attributes void output_transform_f2##suffix(const float* const* in, float* const* out, int64_t n) {            \
    output_lanes_f2(in[0], in[1], in[2], in[3], out[0], out[1], n);                                              \
  }

NPUSIM_WINOGRAD_TRANSFORMS(, )
#ifdef NPUSIM_WINOGRAD_X86
NPUSIM_WINOGRAD_TRANSFORMS(_avx2, NPUSIM_WINOGRAD_AVX2)
#endif
#undef NPUSIM_WINOGRAD_TRANSFORMS

// The horizontal input pass of one channel: transform row i of the tiles in row ty (lanes `row` apart per row of
// tiles in `rows`) into V[i][k], all rows of tiles and transform rows in one call (these runs are only a few vectors
// long, so a call per run would cost about as much as the arithmetic).
struct HorizontalPass {
  const float* rows;
  int64_t lanes, row, tiles_h, tiles_w, padded_row;
  const int64_t* horizontal;  // where horizontal input k of tile 0 lies in a transform row
  float* v;                   // V[0][0] of this channel
  int64_t v_stride;
};

template <int M>
[[gnu::always_inline]] inline void input_horizontal(const HorizontalPass& p) {
  constexpr int alpha = M + 2;
  const int64_t* h = p.horizontal;
  for (int64_t ty = 0; ty < p.tiles_h; ++ty) {
    const int64_t count = ty + 1 < p.tiles_h ? p.padded_row : p.tiles_w;
    for (int i = 0; i < alpha; ++i) {
      const float* in = p.rows + i * M * p.lanes + ty * p.row;
      float* out = p.v + i * alpha * p.v_stride + ty * p.tiles_w;
      const int64_t s = p.v_stride;
      if constexpr (M == 4)
        input_lanes_f4(in + h[0], in + h[1], in + h[2], in + h[3], in + h[4], in + h[5], out, out + s, out + 2 * s,
                       out + 3 * s, out + 4 * s, out + 5 * s, count);
      else
        input_lanes_f2(in + h[0], in + h[1], in + h[2], in + h[3], out, out + s, out + 2 * s, out + 3 * s, count);
    }
  }
}

void input_horizontal_f4(const HorizontalPass& p) { input_horizontal<4>(p); }
void input_horizontal_f2(const HorizontalPass& p) { input_horizontal<2>(p); }
#ifdef NPUSIM_WINOGRAD_X86
NPUSIM_WINOGRAD_AVX2 void input_horizontal_f4_avx2(const HorizontalPass& p) { input_horizontal<4>(p); }
NPUSIM_WINOGRAD_AVX2 void input_horizontal_f2_avx2(const HorizontalPass& p) { input_horizontal<2>(p); }
#endif

using HorizontalPassFn = void (*)(const HorizontalPass&);

HorizontalPassFn horizontal_pass(int m, bool avx2) {
#ifdef NPUSIM_WINOGRAD_X86
  if (avx2) return m == 4 ? input_horizontal_f4_avx2 : input_horizontal_f2_avx2;
#endif
  (void)avx2;
  return m == 4 ? input_horizontal_f4 : input_horizontal_f2;
}

// One 1-D transform: the AVX2 build for eight lanes and more, the baseline one (four lanes a step) below that.
struct Transform {
  Transform1d narrow = nullptr, wide = nullptr;
  void operator()(const float* const* in, float* const* out, int64_t n) const { (n >= 8 ? wide : narrow)(in, out, n); }
};

struct Transforms {
  Transform input, output;
};

Transforms transforms(int m, bool avx2) {
  Transforms t = m == 4
                     ? Transforms{{input_transform_f4, input_transform_f4}, {output_transform_f4, output_transform_f4}}
                     : Transforms{{input_transform_f2, input_transform_f2}, {output_transform_f2, output_transform_f2}};
#ifdef NPUSIM_WINOGRAD_X86
  if (avx2) {
    t.input.wide = m == 4 ? input_transform_f4_avx2 : input_transform_f2_avx2;
    t.output.wide = m == 4 ? output_transform_f4_avx2 : output_transform_f2_avx2;
  }
#endif
  (void)avx2;
  return t;
}

#ifdef NPUSIM_WINOGRAD_X86
// Eight lanes of the four phases: q[ph][l] = src[4 l + ph], l < 8 (a 4 x 8 transpose).
NPUSIM_WINOGRAD_AVX2 inline void deinterleave8x4(const float* src, float* const* q, int64_t l) {
  const __m256 a = _mm256_loadu_ps(src), b = _mm256_loadu_ps(src + 8);
  const __m256 c = _mm256_loadu_ps(src + 16), d = _mm256_loadu_ps(src + 24);
  const __m256 t0 = _mm256_unpacklo_ps(a, b), t1 = _mm256_unpackhi_ps(a, b);  // lanes 0 2 | 1 3, phases 0 1 / 2 3
  const __m256 t2 = _mm256_unpacklo_ps(c, d), t3 = _mm256_unpackhi_ps(c, d);  // lanes 4 6 | 5 7
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);            // lanes 0 2 4 6 | 1 3 5 7 -> 0..7
  const __m256 p[4] = {
      _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
      _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2))};
  for (int ph = 0; ph < 4; ++ph) _mm256_storeu_ps(q[ph] + l, _mm256_permutevar8x32_ps(p[ph], order));
}

// Eight lanes of the two phases: q[ph][l] = src[2 l + ph], l < 8.
NPUSIM_WINOGRAD_AVX2 inline void deinterleave8x2(const float* src, float* const* q, int64_t l) {
  const __m256 a = _mm256_loadu_ps(src), b = _mm256_loadu_ps(src + 8);
  const __m256 even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
               odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  _mm256_storeu_ps(q[0] + l, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0))));
  _mm256_storeu_ps(q[1] + l, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), _MM_SHUFFLE(3, 1, 2, 0))));
}

NPUSIM_WINOGRAD_AVX2 inline int64_t deinterleave_avx2(const float* src, int m, float* const* q, int64_t count) {
  int64_t l = 0;
  if (m == 4)
    for (; l + 8 <= count; l += 8) deinterleave8x4(src + 4 * l, q, l);
  else if (m == 2)
    for (; l + 8 <= count; l += 8) deinterleave8x2(src + 2 * l, q, l);
  return l;
}

// line[m l + r] = y[r][l] for eight lanes (the inverse of the above).
NPUSIM_WINOGRAD_AVX2 inline int64_t interleave_avx2(const float* const* y, int m, float* line, int64_t count) {
  int64_t l = 0;
  if (m == 4) {
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // lanes 0..7 -> 0 2 4 6 | 1 3 5 7
    for (; l + 8 <= count; l += 8) {
      __m256 p[4];
      for (int r = 0; r < 4; ++r) p[r] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(y[r] + l), order);
      const __m256 t0 = _mm256_unpacklo_ps(p[0], p[1]), t1 = _mm256_unpacklo_ps(p[2], p[3]);  // lanes 0 2 | 1 3
      const __m256 t2 = _mm256_unpackhi_ps(p[0], p[1]), t3 = _mm256_unpackhi_ps(p[2], p[3]);  // lanes 4 6 | 5 7
      float* out = line + 4 * l;
      _mm256_storeu_ps(out, _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)));
      _mm256_storeu_ps(out + 8, _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
      _mm256_storeu_ps(out + 16, _mm256_shuffle_ps(t2, t3, _MM_SHUFFLE(1, 0, 1, 0)));
      _mm256_storeu_ps(out + 24, _mm256_shuffle_ps(t2, t3, _MM_SHUFFLE(3, 2, 3, 2)));
    }
  } else if (m == 2) {
    for (; l + 8 <= count; l += 8) {
      const __m256 y0 = _mm256_loadu_ps(y[0] + l), y1 = _mm256_loadu_ps(y[1] + l);
      const __m256 lo = _mm256_unpacklo_ps(y0, y1), hi = _mm256_unpackhi_ps(y0, y1);  // lanes 0 1 | 4 5, 2 3 | 6 7
      _mm256_storeu_ps(line + 2 * l, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(line + 2 * l + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
  }
  return l;
}
#endif

// The phase split of one bordered channel: for every row of tiles ty and window row k, phase ph of row ty m + k
// goes to phases[(k m + ph) phase_stride + ty row + l] = padded[(ty m + k) padded_w + m l + ph], `count` lanes a
// row (whole vectors of tiles, the lanes past the row of tiles landing in the next row's place, written after, or
// in the slack of the last). One call per channel: its rows are only a few vectors long.
struct PhaseSplit {
  const float* padded;
  int64_t padded_w;
  float* phases;
  int64_t phase_stride, row, tiles_h, count;
  int m;
};

template <bool Avx2>
[[gnu::always_inline]] inline void split_phases(const PhaseSplit& s) {
  for (int64_t ty = 0; ty < s.tiles_h; ++ty)
    for (int k = 0; k < s.m + 2; ++k) {
      float* q[4];
      for (int ph = 0; ph < s.m; ++ph) q[ph] = s.phases + (k * s.m + ph) * s.phase_stride + ty * s.row;
      const float* src = s.padded + (ty * s.m + k) * s.padded_w;
      int64_t l = 0;
#ifdef NPUSIM_WINOGRAD_X86
      if constexpr (Avx2) l = deinterleave_avx2(src, s.m, q, s.count);
#endif
      for (; l < s.count; ++l)
        for (int ph = 0; ph < s.m; ++ph) q[ph][l] = src[l * s.m + ph];
    }
}

// The interleave of one output channel: row oy = ty m + q of the plane gets plane[oy out_w + m l + r] =
// done[(q m + r) tiles + ty tiles_w + l]. `count` lanes a row but for the last row of tiles: count * m >= out_w, the
// overhang overwritten by the next rows (count <= 2 tiles_w, so it ends in the next row of tiles) or lying in the
// slack after the plane.
struct RowMerge {
  const float* done;
  int64_t tiles, tiles_h, tiles_w, count, out_h, out_w;
  float* plane;
  int m;
};

template <bool Avx2>
[[gnu::always_inline]] inline void merge_rows(const RowMerge& r) {
  for (int64_t ty = 0; ty < r.tiles_h; ++ty) {
    const int64_t count = ty + 1 < r.tiles_h ? r.count : r.tiles_w;
    for (int q = 0; q < r.m; ++q) {
      const int64_t oy = ty * r.m + q;
      if (oy >= r.out_h) break;
      const float* y[4];
      for (int i = 0; i < r.m; ++i) y[i] = r.done + (q * r.m + i) * r.tiles + ty * r.tiles_w;
      float* line = r.plane + oy * r.out_w;
      int64_t l = 0;
#ifdef NPUSIM_WINOGRAD_X86
      if constexpr (Avx2) l = interleave_avx2(y, r.m, line, count);
#endif
      for (; l < count; ++l)
        for (int i = 0; i < r.m; ++i) line[l * r.m + i] = y[i][l];
    }
  }
}

void split_phases_plain(const PhaseSplit& s) { split_phases<false>(s); }
void merge_rows_plain(const RowMerge& r) { merge_rows<false>(r); }
#ifdef NPUSIM_WINOGRAD_X86
NPUSIM_WINOGRAD_AVX2 void split_phases_avx2(const PhaseSplit& s) { split_phases<true>(s); }
NPUSIM_WINOGRAD_AVX2 void merge_rows_avx2(const RowMerge& r) { merge_rows<true>(r); }
#endif

void split_phases(const PhaseSplit& s, bool avx2) {
#ifdef NPUSIM_WINOGRAD_X86
  if (avx2) return split_phases_avx2(s);
#endif
  (void)avx2;
  split_phases_plain(s);
}

void merge_rows(const RowMerge& r, bool avx2) {
#ifdef NPUSIM_WINOGRAD_X86
  if (avx2) return merge_rows_avx2(r);
#endif
  (void)avx2;
  merge_rows_plain(r);
}

}  // namespace

namespace {

// out[l] = g0 * a[l] + g1 * b[l] + g2 * c[l] over n lanes, added left to right without fused multiply-adds, so that
// every path rounds alike; a float `out` takes the sum rounded once.
template <typename Out>
void combine3_plain(const double* a, const double* b, const double* c, double g0, double g1, double g2, Out* out,
                    int64_t n) {
  for (int64_t l = 0; l < n; ++l) out[l] = static_cast<Out>(g0 * a[l] + g1 * b[l] + g2 * c[l]);
}

#ifdef NPUSIM_WINOGRAD_X86
template <typename Out>
NPUSIM_WINOGRAD_AVX2 void combine3_avx2(const double* a, const double* b, const double* c, double g0, double g1,
                                        double g2, Out* out, int64_t n) {
  const __m256d v0 = _mm256_set1_pd(g0), v1 = _mm256_set1_pd(g1), v2 = _mm256_set1_pd(g2);
  int64_t l = 0;
  for (; l + 4 <= n; l += 4) {
    const __m256d sum = _mm256_add_pd(
        _mm256_add_pd(_mm256_mul_pd(v0, _mm256_loadu_pd(a + l)), _mm256_mul_pd(v1, _mm256_loadu_pd(b + l))),
        _mm256_mul_pd(v2, _mm256_loadu_pd(c + l)));
    if constexpr (std::is_same_v<Out, float>)
      _mm_storeu_ps(out + l, _mm256_cvtpd_ps(sum));
    else
      _mm256_storeu_pd(out + l, sum);
  }
  combine3_plain(a + l, b + l, c + l, g0, g1, g2, out + l, n - l);
}
#endif

template <typename Out>
void combine3(const double* a, const double* b, const double* c, double g0, double g1, double g2, Out* out, int64_t n,
              bool avx2) {
#ifdef NPUSIM_WINOGRAD_X86
  if (avx2) return combine3_avx2(a, b, c, g0, g1, g2, out, n);
#endif
  (void)avx2;
  combine3_plain(a, b, c, g0, g1, g2, out, n);
}

// F4 for larger images, F2 (fewer wasted tile rows and columns, smaller transformed weights) for small ones.
int tile_side(const WinogradConv::Geometry& g) { return g.out_h * g.out_w >= 144 ? 4 : 2; }

}  // namespace

bool WinogradConv::suitable(const Geometry& g) {
  // The transformed inputs and products of a whole sample live in the workspace: keep it bounded.
  constexpr int64_t kMaxWorkspaceBytes = int64_t{64} << 20;
  const int64_t m = tile_side(g), tiles = ceil_div(g.out_h, m) * ceil_div(g.out_w, m);
  const int64_t workspace = (m + 2) * (m + 2) * tiles * (g.in_channels + g.out_channels) * 4;
  return g.in_channels >= 16 && g.out_channels >= 16 && g.out_h * g.out_w >= 16 && g.pad_h <= 2 && g.pad_w <= 2 &&
         workspace <= kMaxWorkspaceBytes;
}

WinogradConv::WinogradConv(const Geometry& g, const std::byte* weight, Elem weight_elem, ScratchSpace& scratch,
                           ThreadPool* pool, const double* channel_scales)
    : g_(g) {
  tile_ = tile_side(g);
  const int alpha = tile_ + 2;
  tiles_h_ = ceil_div(g.out_h, tile_);
  tiles_w_ = ceil_div(g.out_w, tile_);
  const int64_t tiles = tiles_h_ * tiles_w_, cin = g.in_channels, cout = g.out_channels;
  const double waste_as_columns = static_cast<double>(ceil_div(tiles, kGemmTileCols) * kGemmTileCols) / tiles;
  const double waste_as_rows = static_cast<double>(ceil_div(tiles, kGemmTileRows) * kGemmTileRows) / tiles;
  // Few tiles: rows of the GEMM waste less padding than its wider columns. Many tiles: the output transform reads
  // the products far faster as [Cout, tiles].
  tiles_as_rows_ = tiles < kGemmTileCols && waste_as_rows + 0.05 < waste_as_columns;

  // U[xi][o][c] = (G w G^T)[i][j], computed in double and written straight into its place in the packed operand
  // of transform point xi: A [Cout, Cin], or B [Cin, Cout] when the tiles are the rows.
  for (int xi = 0; xi < alpha * alpha; ++xi)
    weights_.push_back(tiles_as_rows_ ? PackedMatrix::zeroed(GemmSide::B, Elem::F32, cin, cout)
                                      : PackedMatrix::zeroed(GemmSide::A, Elem::F32, cout, cin));
  if (!std::all_of(weights_.begin(), weights_.end(), [](const PackedMatrix& m) { return m.prewritten(); })) {
    std::vector<PackedMatrix*> matrices;
    for (PackedMatrix& m : weights_) matrices.push_back(&m);
    prefault_storage(matrices, pool);
    transform_weights(weight, weight_elem, pool, channel_scales);
  }
  gemm_ = tiles_as_rows_
              ? PackedGemm({.m = tiles, .n = cout, .k = cin, .b_prepacked = true, .max_threads = 1}, scratch)
              : PackedGemm({.m = cout, .n = tiles, .k = cin, .a_prepacked = true, .max_threads = 1}, scratch);
  const InputLayout layout = input_layout(tile_, tiles_h_, tiles_w_);
  const int64_t input_floats = layout.padded_floats + alpha * tile_ * (layout.phase_stride + layout.lanes);
  const int64_t output_floats =
      (alpha * alpha + alpha * tile_ + tile_ * tile_) * tiles + g.out_h * g.out_w + tiles_w_ * tile_ + 16;
  scratch.reserve_per_worker(static_cast<size_t>(std::max(input_floats, output_floats)) * sizeof(float));
}

void WinogradConv::transform_weights(const std::byte* weight, Elem weight_elem, ThreadPool* pool,
                                     const double* channel_scales) {
  const int alpha = tile_ + 2;
  const int64_t cin = g_.in_channels, cout = g_.out_channels;
  const double(*gm)[3] = tile_ == 4 ? kG4 : kG2;
  // A packed line (the values of one depth step, here one input channel) holds `width` output channels: 6 as rows
  // of A, 16 as columns of B. One panel's values, in order, are [input channel][output channel within the line], so
  // the transform runs over a panel's output channels at once and writes each transform point's panel contiguously.
  const int64_t width = tiles_as_rows_ ? kGemmTileCols : kGemmTileRows;
  const int64_t panels = ceil_div(cout, width);
  // Input channels per block: the taps and G w of a block (27 + 3 alpha values per lane) stay in L2.
  const int64_t block = std::max<int64_t>(1, 1024 / width);
  const size_t w_es = elem_size(weight_elem);
  const bool avx2 = cpu_features().avx2_fma_f16c();
  const auto transform_panels = [&](int64_t begin, int64_t end) {
    std::vector<float> kernel(static_cast<size_t>(9 * block * width));  // half-precision taps widened to fp32
    std::vector<double> taps(static_cast<size_t>(9 * block * width));
    std::vector<double> gw(static_cast<size_t>(alpha * 3 * block * width));
    for (int64_t panel = begin; panel < end; ++panel) {
      const int64_t o0 = panel * width, live = std::min(width, cout - o0);
      for (int64_t c0 = 0; c0 < cin; c0 += block) {
        const int64_t channels = std::min(block, cin - c0), lanes = channels * width;
        // taps[t][c][o] = w[o0 + o][c0 + c][t]; output channels past cout are zero.
        if (live < width) std::fill(taps.begin(), taps.end(), 0.0);
        // Each output channel's taps over the block, as fp32 (fp32 weights are read in place) and scaled.
        const float* rows[kGemmTileCols];
        double scales[kGemmTileCols];
        for (int64_t o = 0; o < live; ++o) {
          const std::byte* first = weight + static_cast<size_t>(((o0 + o) * cin + c0) * 9) * w_es;
          rows[o] = reinterpret_cast<const float*>(first);
          if (weight_elem != Elem::F32) {
            float* converted = kernel.data() + o * channels * 9;
            to_float(first, weight_elem, converted, channels * 9);
            rows[o] = converted;
          }
          scales[o] = channel_scales ? channel_scales[o0 + o] : 1.0;
        }
        for (int64_t c = 0; c < channels; ++c)
          for (int t = 0; t < 9; ++t) {
            double* line = taps.data() + t * lanes + c * width;
            for (int64_t o = 0; o < live; ++o) {
              const float tap = rows[o][c * 9 + t];
              line[o] = channel_scales ? static_cast<float>(static_cast<double>(tap) * scales[o]) : tap;
            }
          }
        // gw[i][k] = G[i] . (column k of the 3x3 kernel).
        for (int i = 0; i < alpha; ++i)
          for (int k = 0; k < 3; ++k) {
            double* out = gw.data() + (i * 3 + k) * lanes;
            const double* w0 = taps.data() + k * lanes;
            combine3(w0, w0 + 3 * lanes, w0 + 6 * lanes, gm[i][0], gm[i][1], gm[i][2], out, lanes, avx2);
          }
        for (int i = 0; i < alpha; ++i)
          for (int j = 0; j < alpha; ++j) {
            float* out = reinterpret_cast<float*>(weights_[static_cast<size_t>(i * alpha + j)].mutable_panel(panel)) +
                         c0 * width;
            const double* r0 = gw.data() + (i * 3) * lanes;
            combine3(r0, r0 + lanes, r0 + 2 * lanes, gm[j][0], gm[j][1], gm[j][2], out, lanes, avx2);
          }
      }
    }
  };
  if (pool)
    pool->parallel_for(panels, 1, [&](int64_t begin, int64_t end, int) { transform_panels(begin, end); });
  else
    transform_panels(0, panels);
}

int64_t WinogradConv::workspace_floats() const {
  const int64_t points = (tile_ + 2) * (tile_ + 2), tiles = tiles_h_ * tiles_w_;
  return points * (point_stride(g_.in_channels * tiles) + point_stride(g_.out_channels * tiles));
}

void WinogradConv::run(const float* input, float* workspace, const GemmOutput& out, const GemmEpilogue& epilogue,
                       ThreadPool& pool, const ScratchSpace& scratch) const {
  const int m = tile_, alpha = tile_ + 2, points = alpha * alpha;
  const int64_t cin = g_.in_channels, cout = g_.out_channels, tw = tiles_w_, tiles = tiles_h_ * tiles_w_;
  const int64_t height = g_.height, width = g_.width, row = tw + 1;
  const int64_t v_stride = point_stride(cin * tiles), products_stride = point_stride(cout * tiles);
  float* v = workspace;                     // [points][cin][tiles], v_stride apart
  float* products = v + points * v_stride;  // [points][cout][tiles] or [points][tiles][cout]
  const bool avx2 = cpu_features().avx2_fma_f16c();
  const Transforms transform = transforms(m, avx2);
  const Transform& input_1d = transform.input;
  const Transform& output_1d = transform.output;
  const HorizontalPassFn horizontal_1d = horizontal_pass(m, avx2);

  // Input tiles, one channel per step: the vertical pass runs over every row of tiles at once.
  const int64_t lanes = tiles_h_ * row;
  // Whole vectors per row of tiles in the horizontal pass and the output interleave, but for the last row: the
  // lanes past the row read the next row's inputs and write what the next row then overwrites.
  const int64_t padded_row = vector_lanes(tw);
  // The input plane is copied inside a zero border [tiles_h * m + 2][row * m] (every tile's window lies inside),
  // and the phase split takes whole rows of it.
  const InputLayout layout = input_layout(m, tiles_h_, tw);
  const int64_t padded_w = layout.padded_w, padded_floats = layout.padded_floats, phase_stride = layout.phase_stride,
                deinterleaved_row = layout.deinterleaved_row;
  // Horizontal input k of tile l is column m l + k: phase k % m, tile l + k / m.
  int64_t horizontal[6];
  for (int k = 0; k < alpha; ++k) horizontal[k] = (k % m) * lanes + k / m;
  // Channels, points and output channels are claimed one at a time (each thread its own share first): a thread
  // that runs slower on a busy host does fewer of them.
  struct Bordered {
    bool zeroed = false;  // the worker's padded plane has its zero border
  };
  pool.parallel_claim_units<Bordered>(cin, [&](Bordered& state, int64_t c, int worker) {
    float* padded = scratch.worker_as<float>(worker);  // the channel inside its zero border, then slack
    float* phases = padded + padded_floats;            // [alpha rows][m phases][tiles_h][row], phase_stride apart
    float* rows = phases + alpha * m * phase_stride;   // [alpha rows][m phases][tiles_h][row] after the vertical pass
    // The border stays zero: every channel writes the same inside positions.
    if (!state.zeroed) std::fill(padded, phases, 0.0f);
    state.zeroed = true;
    // The next channel's rows of the transform points' matrices, asked into L2 while this one is transformed
    // (36 rows far apart: ResNet-50's layer-1 convolution 0.82 -> 0.72 ms in a crowded spell of the host).
    if (c + 1 < cin)
      for (int xi = 0; xi < points; ++xi)
        prefetch_to_l2(v + xi * v_stride + (c + 1) * tiles, static_cast<size_t>(tiles) * sizeof(float));
    const float* plane = input + c * height * width;
    for (int64_t iy = 0; iy < height; ++iy)
      std::memcpy(padded + (iy + g_.pad_h) * padded_w + g_.pad_w, plane + iy * width,
                  static_cast<size_t>(width) * sizeof(float));
    split_phases({padded, padded_w, phases, phase_stride, row, tiles_h_, deinterleaved_row, m}, avx2);
    const float* in[6];
    float* outs[6];
    for (int ph = 0; ph < m; ++ph) {
      for (int k = 0; k < alpha; ++k) {
        in[k] = phases + (k * m + ph) * phase_stride;
        outs[k] = rows + (k * m + ph) * lanes;
      }
      input_1d(in, outs, lanes);
    }
    horizontal_1d({rows, lanes, row, tiles_h_, tw, padded_row, horizontal, v + c * tiles, v_stride});
  });

  // One independent product per transform point.
  struct NoState {};
  pool.parallel_claim_units<NoState>(points, [&](NoState&, int64_t xi, int worker) {
    const auto* vx = reinterpret_cast<const std::byte*>(v + xi * v_stride);
    auto* px = reinterpret_cast<std::byte*>(products + xi * products_stride);
    if (tiles_as_rows_)
      gemm_.run_on_worker(StridedOperand{vx, Elem::F32, tiles, true}, &weights_[static_cast<size_t>(xi)],
                          {px, Elem::F32, cout}, {}, worker, scratch);
    else
      gemm_.run_on_worker(&weights_[static_cast<size_t>(xi)], StridedOperand{vx, Elem::F32, tiles},
                          {px, Elem::F32, tiles}, {}, worker, scratch);
  });

  // Output tiles, one channel per step, both passes over all tiles at once.
  pool.parallel_claim_units<NoState>(cout, [&](NoState&, int64_t o, int worker) {
    float* gathered = scratch.worker_as<float>(worker);              // [points][tiles], products as [tiles, Cout]
    float* half = gathered + (tiles_as_rows_ ? points * tiles : 0);  // [alpha][m][tiles]
    float* done = half + alpha * m * tiles;                          // [m][m][tiles]
    float* plane = done + m * m * tiles;                             // the channel's output [out_h, out_w]
    const size_t out_es = elem_size(out.elem), residual_es = elem_size(epilogue.residual_elem);
    const int64_t pixels = g_.out_h * g_.out_w;
    // The next channel's output plane and residual, likewise.
    if (o + 1 < cout) {
      prefetch_to_l2(out.data + static_cast<size_t>((o + 1) * out.ld) * out_es, static_cast<size_t>(pixels) * out_es);
      if (epilogue.residual)
        prefetch_to_l2(epilogue.residual + static_cast<size_t>((o + 1) * epilogue.residual_ld) * residual_es,
                       static_cast<size_t>(pixels) * residual_es);
    }
    const float* mt[36];
    for (int xi = 0; xi < points; ++xi) {
      if (!tiles_as_rows_) {
        mt[xi] = products + xi * products_stride + o * tiles;
        continue;
      }
      float* dst = gathered + xi * tiles;
      const float* src = products + xi * products_stride + o;
      for (int64_t t = 0; t < tiles; ++t) dst[t] = src[t * cout];
      mt[xi] = dst;
    }
    const float* in[6];
    float* outs[6];
    for (int i = 0; i < alpha; ++i) {
      for (int j = 0; j < alpha; ++j) in[j] = mt[i * alpha + j];
      for (int r = 0; r < m; ++r) outs[r] = half + (i * m + r) * tiles;
      output_1d(in, outs, tiles);
    }
    for (int r = 0; r < m; ++r) {
      for (int i = 0; i < alpha; ++i) in[i] = half + (i * m + r) * tiles;
      for (int q = 0; q < m; ++q) outs[q] = done + (q * m + r) * tiles;
      output_1d(in, outs, tiles);
    }
    merge_rows({done, tiles, tiles_h_, tw, padded_row, g_.out_h, g_.out_w, plane, m}, avx2);
    store_through_epilogue(plane, 0, 1, g_.out_h * g_.out_w, o, 0, out, epilogue);
  });
}

}  // namespace npusim::cpu
