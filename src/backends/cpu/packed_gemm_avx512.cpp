// The AVX-512 micro-kernels of the packed GEMM: one or two A panels (6 rows each) against one or two B panels (16
// columns each, one zmm register per panel row), so a call covers a 6x16, 6x32, 12x16 or 12x32 tile; with AVX-512
// BF16, the 6-row tiles over bf16 operands packed in depth pairs. Compiled for AVX-512 with function
// attributes only; packed_gemm.cpp calls them when the CPU reports avx512f.
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512 conversion intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backends/cpu/avx2_transpose.h"
#include "backends/cpu/packed_gemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace npusim::cpu::gemm_detail {

namespace {

constexpr int64_t MR = kGemmTileRows;
constexpr int64_t NR = kGemmTileCols;

#define NPUSIM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// A prepacked weight used as A streams from memory once per product, 24 bytes per depth step, faster than the
// hardware prefetchers bring it: the kernels ask for the lines 10 steps ahead into L1 and `Far` bytes ahead into L2
// (kReusedAFar or kStreamedAFar, see packed_gemm_kernels.h).
// Measured on Winograd's transform-point products (M=512, N=16, K=512 over 16.8 MB of weights): 2.4 ms per
// convolution without, 1.55 ms with 4 KiB ahead; ResNet-18 29.4 -> 26.6 ms. Eight steps of a panel are three whole
// lines, so the requests go once per line, every eight steps: asked at every step (five times per line), they took a
// quarter of a Zen 5 core's 12x16 tile (512 x 16 x 512 from memory: 120 against 184 GFLOP/s once per line).
constexpr int64_t kPrefetchSteps = 8;
static_assert(kPrefetchSteps * MR * sizeof(float) == 3 * 64);
template <int64_t Far>
NPUSIM_AVX512 inline void prefetch_a(const float* a) {
  const char* at = reinterpret_cast<const char*>(a);
  for (int line = 0; line < 3; ++line) {
    _mm_prefetch(at + 256 + 64 * line, _MM_HINT_T0);
    _mm_prefetch(at + Far + 64 * line, _MM_HINT_T1);
  }
}

// Sums of a tile (plus c's partial sums when accumulate) through out's epilogue into its live rows and columns. The
// epilogue's fields are read into locals once (a store to C may alias the one-byte activation field, which the
// compiler would otherwise read again after every store) and the rows are unrolled, so that the sums stay in their
// registers (256 x 3136 x 64 with a residual on Zen 5: 0.575 -> 0.558 ms, alternated in one process).
template <int Panels, int Rows>
NPUSIM_AVX512 inline void store_tile_through(const __m512 (&s)[Rows][Panels], const float* c, int64_t ldc,
                                             bool accumulate, const TileOutput& out) {
  float* const dst = out.c;
  const int64_t dst_ld = out.ldc, rows = out.rows, residual_ld = out.residual_ld;
  const float* const row_bias = out.row_bias;
  const float* const residual = out.residual;
  const bool lower = out.activation != GemmActivation::None, upper = out.activation == GemmActivation::Clamp;
  const __m512 low = _mm512_set1_ps(out.activation == GemmActivation::Relu ? 0.0f : out.low);
  const __m512 high = _mm512_set1_ps(out.high);
  __mmask16 masks[Panels];
  __m512 column_bias[Panels];
  for (int q = 0; q < Panels; ++q) {
    const int64_t live = std::clamp<int64_t>(out.cols - NR * q, 0, NR);
    masks[q] = static_cast<__mmask16>((1u << live) - 1);
    column_bias[q] = out.column_bias ? _mm512_maskz_loadu_ps(masks[q], out.column_bias + NR * q) : _mm512_setzero_ps();
  }
  const bool by_column = out.column_bias != nullptr;
#pragma GCC unroll 12
  for (int r = 0; r < Rows; ++r) {
    if (r >= rows) break;
    const __m512 bias = _mm512_set1_ps(row_bias ? row_bias[r] : 0.0f);
    for (int q = 0; q < Panels; ++q) {
      const __mmask16 mask = masks[q];
      if (!mask) continue;
      __m512 x = s[r][q];
      if (accumulate) x = _mm512_add_ps(x, _mm512_loadu_ps(c + r * ldc + NR * q));
      if (by_column) x = _mm512_add_ps(x, column_bias[q]);
      if (row_bias) x = _mm512_add_ps(x, bias);
      if (residual) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, residual + r * residual_ld + NR * q));
      if (lower) x = _mm512_max_ps(low, x);
      if (upper) x = _mm512_min_ps(high, x);
      _mm512_mask_storeu_ps(dst + r * dst_ld + NR * q, mask, x);
    }
  }
}

template <Elem BE>
NPUSIM_AVX512 inline __m512 load_b_row(const std::byte* b) {
  if constexpr (BE == Elem::F32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(b));
  } else if constexpr (BE == Elem::BF16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  }
}

// c[Rows, Panels * NR] (row stride ldc) = (accumulate ? c : 0) + the sums.
template <int Panels, int Rows = MR>
NPUSIM_AVX512 inline void store_tile(const __m512 (&s)[Rows][Panels], float* c, int64_t ldc, bool accumulate) {
  for (int r = 0; r < Rows; ++r) {
    float* row = c + r * ldc;
    for (int q = 0; q < Panels; ++q) {
      __m512 sum = s[r][q];
      if (accumulate) sum = _mm512_add_ps(sum, _mm512_loadu_ps(row + NR * q));
      _mm512_storeu_ps(row + NR * q, sum);
    }
  }
}

// One depth step of `Rows` rows of A (six per panel) against one or two B panels.
template <Elem BE, int Panels, int Rows>
NPUSIM_AVX512 inline void tile_step(__m512 (&s)[Rows][Panels], const float* const (&a)[Rows / MR], const std::byte* b0,
                                    const std::byte* b1) {
  const __m512 x0 = load_b_row<BE>(b0);
  __m512 x1 = x0;
  if constexpr (Panels == 2) x1 = load_b_row<BE>(b1);
  for (int r = 0; r < Rows; ++r) {
    const __m512 ar = _mm512_set1_ps(a[r / MR][r % MR]);
    s[r][0] = _mm512_fmadd_ps(ar, x0, s[r][0]);
    if constexpr (Panels == 2) s[r][1] = _mm512_fmadd_ps(ar, x1, s[r][1]);
  }
}

// The sums of a tile over the whole depth: `Rows / MR` A panels (6 or 12 rows) against one or two B panels, A's
// prefetch once per eight steps.
template <Elem BE, int Panels, int Rows, int64_t Far>
NPUSIM_AVX512 inline void tile_sums(int64_t kc, const float* const (&a_panels)[Rows / MR], const std::byte* b0,
                                    const std::byte* b1, int64_t b_step, __m512 (&s)[Rows][Panels]) {
  constexpr int kPanelsA = Rows / MR;
  for (int r = 0; r < Rows; ++r)
    for (int q = 0; q < Panels; ++q) s[r][q] = _mm512_setzero_ps();
  const float* a[kPanelsA];
  for (int i = 0; i < kPanelsA; ++i) a[i] = a_panels[i];
  const auto advance = [&] {
    for (int i = 0; i < kPanelsA; ++i) a[i] += MR;
    b0 += b_step;
    b1 += b_step;
  };
  int64_t p = 0;
  for (; p + kPrefetchSteps <= kc; p += kPrefetchSteps) {
    for (int i = 0; i < kPanelsA; ++i) prefetch_a<Far>(a[i]);
#pragma GCC unroll 8
    for (int64_t q = 0; q < kPrefetchSteps; ++q) {
      tile_step<BE, Panels, Rows>(s, a, b0, b1);
      advance();
    }
  }
  for (; p < kc; ++p) {
    tile_step<BE, Panels, Rows>(s, a, b0, b1);
    advance();
  }
}

template <Elem BE, int Panels, int64_t Far>
NPUSIM_AVX512 void micro_avx512(int64_t kc, const float* a, const std::byte* b0, const std::byte* b1, int64_t b_step,
                                float* c, int64_t ldc, bool accumulate, const TileOutput* out) {
  __m512 s[MR][Panels];
  const float* const a_panels[1] = {a};
  tile_sums<BE, Panels, MR, Far>(kc, a_panels, b0, b1, b_step, s);
  if (out)
    store_tile_through<Panels, MR>(s, c, ldc, accumulate, *out);
  else
    store_tile<Panels>(s, c, ldc, accumulate);
}

// Two A panels (12 rows: a0's six, then a1's) against one or two B panels: 12 or 24 sums in flight, enough to cover
// the multiply-add latency with one B panel (the 6x16 tile keeps six chains for two pipes of four cycles each), and
// each B row loaded serves twice the rows. Measured on an Intel Xeon (Sapphire Rapids) core against the 6-row tiles,
// fp32 (m x n x k): 512 x 512 x 512 197 -> 209 GFLOP/s, 64 x 3136 x 256 155 -> 164, 512 x 49 x 2048 147 -> 166,
// 512 x 16 x 4608 150 -> 164; ResNet-50 51.1 -> 47.4 ms on one thread.
template <Elem BE, int Panels, int64_t Far>
NPUSIM_AVX512 void micro_avx512_rows12(int64_t kc, const float* a0, const float* a1, const std::byte* b0,
                                       const std::byte* b1, int64_t b_step, float* c, int64_t ldc, bool accumulate,
                                       const TileOutput* out) {
  __m512 s[2 * MR][Panels];
  const float* const a_panels[2] = {a0, a1};
  tile_sums<BE, Panels, 2 * MR, Far>(kc, a_panels, b0, b1, b_step, s);
  if (out)
    store_tile_through<Panels, 2 * MR>(s, c, ldc, accumulate, *out);
  else
    store_tile<Panels, 2 * MR>(s, c, ldc, accumulate);
}

// bf16 pairs (AVX-512 BF16): a holds MR 32-bit words per depth pair (rows' values at depths 2p and 2p+1), b0/b1
// NR words per pair (columns' values at 2p and 2p+1); each vdpbf16ps multiplies both depths exactly and adds them
// in fp32.
template <int Panels>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void micro_bf16_pairs(int64_t pairs, const uint32_t* a,
                                                                                      const uint32_t* b0,
                                                                                      const uint32_t* b1, float* c,
                                                                                      int64_t ldc, bool accumulate) {
  __m512 s[MR][Panels];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < Panels; ++q) s[r][q] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p, a += MR, b0 += NR, b1 += NR) {
    const __m512bh x0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b0));
    __m512bh x1 = x0;
    if constexpr (Panels == 2) x1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b1));
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r])));
      s[r][0] = _mm512_dpbf16_ps(s[r][0], ar, x0);
      if constexpr (Panels == 2) s[r][1] = _mm512_dpbf16_ps(s[r][1], ar, x1);
    }
  }
  store_tile<Panels>(s, c, ldc, accumulate);
}

}  // namespace

// One panel of a convolution's patch matrix (columns [pixel0, pixel0 + width), width <= NR) with permutes instead of
// hardware gathers: the panel's pixels split into runs along output rows; per kernel tap, a run's values are every
// stride-th of at most 32 consecutive values of one input row, which two masked loads (zero in the padding, nothing
// read outside the row) and one two-source permute put into the run's lanes. Masks and indices are worked out once
// per tap and serve every channel. False, having written nothing, when the panel splits into more than kMaxRuns runs
// or the stride is wider than the permute can span (stride_w > 2).
NPUSIM_AVX512 bool pack_im2col_panel_permuted(const Im2colOperand& s, int64_t k, int64_t pixel0, int64_t width,
                                              float* panel) {
  constexpr int kMaxRuns = 4;
  if (s.stride_w > 2 || width < 1 || width > NR) return false;
  struct Run {
    int64_t lane, count, oy, ox;
  };
  Run runs[kMaxRuns];
  int count = 0;
  for (int64_t j = 0; j < width;) {
    if (count == kMaxRuns) return false;
    const int64_t pixel = pixel0 + j, oy = pixel / s.out_w, ox = pixel % s.out_w;
    const int64_t lanes = std::min(width - j, s.out_w - ox);
    runs[count++] = {j, lanes, oy, ox};
    j += lanes;
  }
  // Per tap and run: where in a channel's plane the first value it reads inside the row lies, which of the 32 values
  // from there lie inside the row, which lanes read inside it and which of those values each lane takes.
  struct RunTap {
    int64_t offset;
    __mmask16 low, high, lanes;
    __m512i index;
  };
  const int64_t taps = s.kernel_h * s.kernel_w, channels = k / taps, plane = s.height * s.width;
  for (int64_t ky = 0; ky < s.kernel_h; ++ky)
    for (int64_t kx = 0; kx < s.kernel_w; ++kx) {
      RunTap live[kMaxRuns];
      int used = 0;
      for (int r = 0; r < count; ++r) {
        const Run& run = runs[r];
        const int64_t iy = run.oy * s.stride_h - s.pad_h + ky * s.dilation_h;
        if (iy < 0 || iy >= s.height) continue;  // the run's lanes stay zero
        const int64_t ix = run.ox * s.stride_w - s.pad_w + kx * s.dilation_w;
        // The lanes whose value lies inside the row, and the window of 32 values from the first of those.
        uint32_t lanes = 0;
        int64_t first = -1;
        for (int64_t j = 0; j < run.count; ++j) {
          const int64_t at = ix + j * s.stride_w;
          if (at < 0 || at >= s.width) continue;
          lanes |= 1u << (run.lane + j);
          if (first < 0) first = at;
        }
        if (!lanes) continue;
        // Past the run's last value inside the row: at most (NR - 1) * 2 + 1 = 31 values from `first`.
        const int64_t last = std::min<int64_t>(s.width, ix + (run.count - 1) * s.stride_w + 1);
        const uint32_t inside = (1u << (last - first)) - 1;
        alignas(64) int32_t index[NR] = {};
        for (int64_t j = 0; j < run.count; ++j)
          index[run.lane + j] = static_cast<int32_t>(std::max<int64_t>(0, ix + j * s.stride_w - first));
        live[used++] = {iy * s.width + first, static_cast<__mmask16>(inside), static_cast<__mmask16>(inside >> 16),
                        static_cast<__mmask16>(lanes), _mm512_load_si512(index)};
      }
      float* out = panel + (ky * s.kernel_w + kx) * NR;
      const float* in = s.input;
      for (int64_t c = 0; c < channels; ++c, out += taps * NR, in += plane) {
        __m512 values = _mm512_setzero_ps();
        for (int r = 0; r < used; ++r) {
          const RunTap& t = live[r];
          const __m512 low = _mm512_maskz_loadu_ps(t.low, in + t.offset);
          const __m512 high = _mm512_maskz_loadu_ps(t.high, in + t.offset + NR);
          values = _mm512_mask_mov_ps(values, t.lanes, _mm512_permutex2var_ps(low, t.index, high));
        }
        _mm512_storeu_ps(out, values);
      }
    }
  return true;
}

// The kernel for B panels of `b_elem`, covering two panels (6x32) when `pair`, else one (6x16; b1 unused); A's
// panels prefetched for being read once (`streamed_a`) or again for later columns.
template <int64_t Far>
PairKernel avx512_kernel_far(Elem b_elem, bool pair) {
  switch (b_elem) {
    case Elem::BF16:
      return pair ? micro_avx512<Elem::BF16, 2, Far> : micro_avx512<Elem::BF16, 1, Far>;
    case Elem::F16:
      return pair ? micro_avx512<Elem::F16, 2, Far> : micro_avx512<Elem::F16, 1, Far>;
    default:
      return pair ? micro_avx512<Elem::F32, 2, Far> : micro_avx512<Elem::F32, 1, Far>;
  }
}

PairKernel avx512_kernel(Elem b_elem, bool pair, bool streamed_a) {
  return streamed_a ? avx512_kernel_far<kStreamedAFar>(b_elem, pair) : avx512_kernel_far<kReusedAFar>(b_elem, pair);
}

// The same over two A panels (12 rows).
template <int64_t Far>
RowsKernel avx512_rows12_kernel_far(Elem b_elem, bool pair) {
  switch (b_elem) {
    case Elem::BF16:
      return pair ? micro_avx512_rows12<Elem::BF16, 2, Far> : micro_avx512_rows12<Elem::BF16, 1, Far>;
    case Elem::F16:
      return pair ? micro_avx512_rows12<Elem::F16, 2, Far> : micro_avx512_rows12<Elem::F16, 1, Far>;
    default:
      return pair ? micro_avx512_rows12<Elem::F32, 2, Far> : micro_avx512_rows12<Elem::F32, 1, Far>;
  }
}

RowsKernel avx512_rows12_kernel(Elem b_elem, bool pair, bool streamed_a) {
  return streamed_a ? avx512_rows12_kernel_far<kStreamedAFar>(b_elem, pair)
                    : avx512_rows12_kernel_far<kReusedAFar>(b_elem, pair);
}

Bf16PairKernel avx512_bf16_pair_kernel(bool pair) { return pair ? micro_bf16_pairs<2> : micro_bf16_pairs<1>; }

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2"))) int64_t pack_int8_pairs_avx512(
    const Int8WeightOperand& b, int64_t k, int64_t line0, int64_t panels, uint32_t* dst) {
  constexpr int64_t kValues = 16;  // depth values per block: eight pairs
  const int64_t whole = k / kValues * kValues, k_pairs = (k + 1) / 2, groups = (k + b.group - 1) / b.group;
  for (int64_t panel = 0; panel < panels; ++panel)
    for (int64_t half = 0; half < NR; half += 8) {
      const int8_t* lines[8];
      const float* scales[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t line = line0 + panel * NR + half + i;
        lines[i] = b.values + line * k;
        scales[i] = b.scales + line * groups;
      }
      uint32_t* out = dst + panel * k_pairs * NR + half;
      for (int64_t p = 0; p < whole; p += kValues) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) {
          // The scales of the block's two runs of eight (one group, or two: groups are whole runs of eight).
          const __m512 scale = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(scales[i][p / b.group]),
                                                    _mm512_set1_ps(scales[i][(p + 8) / b.group]));
          const __m512 wide =
              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lines[i] + p))));
          const __m256bh narrow = _mm512_cvtneps_pbh(_mm512_mul_ps(wide, scale));
          r[i] = reinterpret_cast<const __m256&>(narrow);
        }
        transpose8(r);
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(reinterpret_cast<float*>(out + (p / 2 + q) * NR), r[q]);
      }
    }
  return whole / 2;
}

}  // namespace npusim::cpu::gemm_detail

#endif
