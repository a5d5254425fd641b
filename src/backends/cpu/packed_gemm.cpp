// The packed GEMM: BLIS-style loops over column blocks (jc, nc wide), row blocks (ic, mc high) and depth blocks (pc,
// kc deep), then B panels (jr) and A panels (ir) of one 6x16 micro-tile each. Sums of a row block accumulate in a
// per-worker fp32 buffer [mc, nc] (L2-resident) and go through the epilogue into C once the whole depth is done,
// so C may be fp16/bf16 and the residual may be C itself (the AVX-512 tiles store an fp32 C through the epilogue
// themselves, from their last depth block). A B operand that is not prepacked is packed for the full
// depth of one column block at a time (nc shrinks as k grows), an A operand one [mc, kc] block at a time, or whole
// once per worker when the product spans several column blocks and A is small (kWholeABytes).
#include "backends/cpu/packed_gemm.h"

#include "backends/cpu/avx2_transpose.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/packed_gemm_kernels.h"
#include "backends/cpu/prefetch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NPUSIM_GEMM_X86 1
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#include "core/cpu_features.h"
#include "npusim/dtype.h"
#include "npusim/error.h"

namespace npusim::cpu {

namespace {

constexpr int64_t MR = kGemmTileRows;
constexpr int64_t NR = kGemmTileCols;
constexpr int64_t kMaxDepthBlock = 256;  // kc: a B micro-panel of 256 x 16 floats fills half of L1
// With few columns, A streams from memory once: longer runs of each A panel suit the hardware prefetcher better.
constexpr int64_t kMaxDepthBlockFewColumns = 512;
// A product whose depth is at most kRowBandDepth goes a band of A panels across all the columns of a block at a time
// when the block has at least kRowBandColumns (see run_region).
constexpr int64_t kRowBandDepth = 128;
constexpr int64_t kRowBandColumns = 8 * kGemmTileCols;
constexpr int64_t kMaxRowBlock = 96;             // mc: an A block of 96 x 256 floats (96 KiB) stays in L2
constexpr int64_t kMaxColBlock = 512;            // nc
constexpr int64_t kPackedBBlockBytes = 3 << 19;  // an on-the-fly B block [k, nc] stays within 1.5 MiB
// ... unless k is so deep that this leaves fewer columns: A is packed again for every column block.
constexpr int64_t kMinPackedBColumns = 128;
constexpr int64_t kMinMacsPerThread = int64_t{1} << 19;  // below this, waking a worker costs more than it saves
// B packed once for all workers (in worker 0's scratch) when the whole of it fits this, so that workers splitting the
// rows do not each pack all of it.
constexpr int64_t kSharedPackedBBytes = 3 << 19;
// A strided A is packed once per depth block of every column block; when the product spans several column blocks
// and A packed whole takes at most this, each worker packs its rows of A whole once instead (a prefill's linear
// layers: 128 rows against 8960-value weight rows pack A 12 times otherwise).
constexpr int64_t kWholeABytes = int64_t{8} << 20;
// What the extra pass over the pool (packing, then the product) costs, in multiply-adds of one worker.
constexpr double kPassCost = 2e5;
// Whether Best picks the AVX-512 kernels where the CPU has them (on Zen 4, which splits each 512-bit FMA in two,
// they only save instructions).
constexpr bool kPreferAvx512 = true;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

void require(bool condition, const char* what) {
  if (!condition) fail(std::string("packed GEMM: ") + what);
}

}  // namespace

namespace {

// ---- micro-kernels: c[6, 16] (row stride ldc) = (accumulate ? c : 0) + a-panel · b-panel over kc steps ----

using MicroKernel = void (*)(int64_t kc, const float* a, const std::byte* b, float* c, int64_t ldc, bool accumulate);

template <Elem BE>
void load_b_row(const std::byte* b, float* out) {
  if constexpr (BE == Elem::F32) {
    std::memcpy(out, b, NR * sizeof(float));
  } else {
    to_float(b, BE, out, NR);
  }
}

// Where column c of an interleaved bf16 panel step lands (see PackedMatrix::interleaved), in values from the
// step's start.
constexpr int64_t interleaved_slot(int64_t c) { return c % (NR / 2) * 2 + c / (NR / 2); }

template <Elem BE, bool Interleaved = false>
void micro_portable(int64_t kc, const float* a, const std::byte* b, float* c, int64_t ldc, bool accumulate) {
  constexpr size_t kBytes = BE == Elem::F32 ? 4 : 2;
  float sums[MR][NR] = {};
  alignas(64) float row[NR];
  for (int64_t p = 0; p < kc; ++p) {
    const std::byte* step = b + static_cast<size_t>(p) * NR * kBytes;
    if constexpr (Interleaved) {
      for (int64_t j = 0; j < NR; ++j) row[j] = load_float(step, Elem::BF16, interleaved_slot(j));
    } else {
      load_b_row<BE>(step, row);
    }
    for (int64_t r = 0; r < MR; ++r) {
      const float ar = a[p * MR + r];
      for (int64_t j = 0; j < NR; ++j) sums[r][j] += ar * row[j];
    }
  }
  for (int64_t r = 0; r < MR; ++r)
    for (int64_t j = 0; j < NR; ++j) c[r * ldc + j] = (accumulate ? c[r * ldc + j] : 0.0f) + sums[r][j];
}

#ifdef NPUSIM_GEMM_X86
// With Interleaved, a bf16 panel step holds columns 0 8 1 9 ... 7 15 (see pack_b_interleaved): 32-bit lane i has
// column i in its low half and column i + 8 in its high half.
template <Elem BE, bool Interleaved = false>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void load_b_avx2(const std::byte* b, __m256& lo,
                                                                                __m256& hi) {
  if constexpr (Interleaved) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else if constexpr (BE == Elem::F32) {
    lo = _mm256_loadu_ps(reinterpret_cast<const float*>(b));
    hi = _mm256_loadu_ps(reinterpret_cast<const float*>(b) + 8);
  } else if constexpr (BE == Elem::BF16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16));
    hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16));
  } else {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b) + 1));
  }
}

// Vectors is 2 for the full 6x16 tile, 1 for a 6x8 tile (a last B panel at most half full); Rows (2, 4 or 6) of
// the A panel's six count (a last A panel with fewer live rows skips the multiply-adds of the padding); Interleaved
// for bf16 panels in pack_b_interleaved's order.
template <Elem BE, int Vectors, int Rows = MR, bool Interleaved = false>
__attribute__((target("avx2,fma,f16c"))) void micro_avx2(int64_t kc, const float* a, const std::byte* b, float* c,
                                                         int64_t ldc, bool accumulate) {
  constexpr size_t kStep = NR * (BE == Elem::F32 ? 4 : 2);
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t p = 0; p < kc; ++p, a += MR, b += kStep) {
    // A prepacked weight as A streams from memory: see prefetch_a in packed_gemm_avx512.cpp.
    _mm_prefetch(reinterpret_cast<const char*>(a) + 256, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a) + gemm_detail::kReusedAFar, _MM_HINT_T1);
    __m256 b0, b1;
    load_b_avx2<BE, Interleaved>(b, b0, b1);
    __m256 ar = _mm256_broadcast_ss(a + 0);
    c00 = _mm256_fmadd_ps(ar, b0, c00);
    if constexpr (Vectors == 2) c01 = _mm256_fmadd_ps(ar, b1, c01);
    ar = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(ar, b0, c10);
    if constexpr (Vectors == 2) c11 = _mm256_fmadd_ps(ar, b1, c11);
    if constexpr (Rows > 2) {
      ar = _mm256_broadcast_ss(a + 2);
      c20 = _mm256_fmadd_ps(ar, b0, c20);
      if constexpr (Vectors == 2) c21 = _mm256_fmadd_ps(ar, b1, c21);
    }
    if constexpr (Rows > 3) {
      ar = _mm256_broadcast_ss(a + 3);
      c30 = _mm256_fmadd_ps(ar, b0, c30);
      if constexpr (Vectors == 2) c31 = _mm256_fmadd_ps(ar, b1, c31);
    }
    if constexpr (Rows > 4) {
      ar = _mm256_broadcast_ss(a + 4);
      c40 = _mm256_fmadd_ps(ar, b0, c40);
      if constexpr (Vectors == 2) c41 = _mm256_fmadd_ps(ar, b1, c41);
    }
    if constexpr (Rows > 5) {
      ar = _mm256_broadcast_ss(a + 5);
      c50 = _mm256_fmadd_ps(ar, b0, c50);
      if constexpr (Vectors == 2) c51 = _mm256_fmadd_ps(ar, b1, c51);
    }
  }
  const __m256 sums[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int64_t r = 0; r < Rows; ++r) {
    float* row = c + r * ldc;
    for (int v = 0; v < Vectors; ++v) {
      __m256 sum = sums[r][v];
      if (accumulate) sum = _mm256_add_ps(sum, _mm256_loadu_ps(row + 8 * v));
      _mm256_storeu_ps(row + 8 * v, sum);
    }
  }
}

// c[6, 1] (row stride ldc) = (accumulate ? c : 0) + a-panel · column over kc steps, `column` holding the single live
// column of a B panel contiguously. Steps go in groups of four: their 24 A values fill three vectors, and a permute
// spreads each step's B value over that step's six lanes (two groups per iteration, summed apart). A product with 49
// columns (7x7 pixels) has one such column after three whole panels: this takes it at about a quarter of the cost of
// the 6x8 tile.
__attribute__((target("avx2,fma"))) void micro_column_avx2(int64_t kc, const float* a, const float* column, float* c,
                                                           int64_t ldc, bool accumulate) {
  const __m256i spread0 = _mm256_setr_epi32(0, 0, 0, 0, 0, 0, 1, 1);
  const __m256i spread1 = _mm256_setr_epi32(1, 1, 1, 1, 2, 2, 2, 2);
  const __m256i spread2 = _mm256_setr_epi32(2, 2, 3, 3, 3, 3, 3, 3);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, t0 = s0, t1 = s0, t2 = s0;
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8, a += 8 * MR) {
    const __m256 b = _mm256_castps128_ps256(_mm_loadu_ps(column + p));
    const __m256 d = _mm256_castps128_ps256(_mm_loadu_ps(column + p + 4));
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a), _mm256_permutevar8x32_ps(b, spread0), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8), _mm256_permutevar8x32_ps(b, spread1), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + 16), _mm256_permutevar8x32_ps(b, spread2), s2);
    t0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + 24), _mm256_permutevar8x32_ps(d, spread0), t0);
    t1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + 32), _mm256_permutevar8x32_ps(d, spread1), t1);
    t2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + 40), _mm256_permutevar8x32_ps(d, spread2), t2);
  }
  alignas(32) float v[3][8];
  _mm256_store_ps(v[0], _mm256_add_ps(s0, t0));
  _mm256_store_ps(v[1], _mm256_add_ps(s1, t1));
  _mm256_store_ps(v[2], _mm256_add_ps(s2, t2));
  // Lane l of the 24 holds row l % 6 of step l / 6.
  float sums[MR];
  for (int r = 0; r < MR; ++r) {
    const int l0 = r, l1 = 6 + r, l2 = 12 + r, l3 = 18 + r;
    sums[r] = (v[l0 / 8][l0 % 8] + v[l1 / 8][l1 % 8]) + (v[l2 / 8][l2 % 8] + v[l3 / 8][l3 % 8]);
  }
  for (; p < kc; ++p, a += MR)
    for (int r = 0; r < MR; ++r) sums[r] += a[r] * column[p];
  for (int r = 0; r < MR; ++r) c[r * ldc] = (accumulate ? c[r * ldc] : 0.0f) + sums[r];
}

#endif  // NPUSIM_GEMM_X86

#ifdef NPUSIM_GEMM_X86
bool cpu_has_avx2() { return cpu_features().avx2_fma_f16c(); }
bool cpu_has_avx512() { return cpu_features().avx512(); }
bool cpu_has_avx512_bf16() { return cpu_features().avx512() && cpu_features().avx512bf16; }
bool cpu_has_amx() { return cpu_has_avx512_bf16() && cpu_features().amx; }
#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx512() { return false; }
bool cpu_has_amx() { return false; }
#endif

std::atomic<GemmKernelChoice> g_choice{GemmKernelChoice::Best};

// The micro-kernel family products use now.
GemmKernelChoice active_kernel() {
  const GemmKernelChoice choice = g_choice.load(std::memory_order_relaxed);
  if (choice == GemmKernelChoice::Best) {
    if (kPreferAvx512 && cpu_has_amx()) return GemmKernelChoice::Amx;
    if (kPreferAvx512 && cpu_has_avx512()) return GemmKernelChoice::Avx512;
    return cpu_has_avx2() ? GemmKernelChoice::Avx2 : GemmKernelChoice::Portable;
  }
  return gemm_kernel_supported(choice) ? choice : GemmKernelChoice::Portable;
}

bool use_avx2() { return active_kernel() != GemmKernelChoice::Portable; }

// Whether Best multiplies fp32 panels with the AVX2 tile although the CPU has AVX-512. AMD's Zen 4 executes each
// 512-bit FMA on its 256-bit units in two halves: there the 6x16 AVX2 tile measured as fast or faster than the
// 6x32 AVX-512 one on every ResNet product (the 7x7 stem's 64 x 12544 x 147: 82 against 72 GFLOP/s; N=49: 95
// against 88), and ResNet-50 ran 3% faster. Half-precision panels keep the AVX-512 tiles (their conversions gain),
// and so do products whose B the AVX-512 tiles read in place, without packing it (1x1 convolutions over images whose
// pixel count is a multiple of 16: 64 x 3136 x 256 1.01 -> 0.96 ms on one thread, 0.64 -> 0.51 on two).
bool fp32_prefers_avx2() {
  return cpu_features().avx512_halved && g_choice.load(std::memory_order_relaxed) == GemmKernelChoice::Best;
}

#ifdef NPUSIM_GEMM_X86
template <Elem BE, bool Interleaved = false>
MicroKernel micro_avx2_for(bool narrow, int64_t rows) {
  if (rows <= 2) return narrow ? micro_avx2<BE, 1, 2, Interleaved> : micro_avx2<BE, 2, 2, Interleaved>;
  if (rows <= 4) return narrow ? micro_avx2<BE, 1, 4, Interleaved> : micro_avx2<BE, 2, 4, Interleaved>;
  return narrow ? micro_avx2<BE, 1, MR, Interleaved> : micro_avx2<BE, 2, MR, Interleaved>;
}
#endif

// The micro-kernel for B panels of `b_elem`; `narrow` when only the first half of the panel's columns count, `rows`
// the live rows of the A panel (the vector tiles skip whole pairs of padding rows); `interleaved` for bf16 panels
// packed by pack_b_interleaved (AVX2 tiles only).
MicroKernel micro_kernel(Elem b_elem, bool avx2, bool narrow, int64_t rows = MR, bool interleaved = false) {
#ifdef NPUSIM_GEMM_X86
  if (avx2 && interleaved) return micro_avx2_for<Elem::BF16, true>(narrow, rows);
  if (avx2) {
    switch (b_elem) {
      case Elem::BF16:
        return micro_avx2_for<Elem::BF16>(narrow, rows);
      case Elem::F16:
        return micro_avx2_for<Elem::F16>(narrow, rows);
      default:
        return micro_avx2_for<Elem::F32>(narrow, rows);
    }
  }
#endif
  (void)avx2;
  (void)narrow;
  (void)rows;
  if (interleaved) return micro_portable<Elem::BF16, true>;
  switch (b_elem) {
    case Elem::BF16:
      return micro_portable<Elem::BF16>;
    case Elem::F16:
      return micro_portable<Elem::F16>;
    default:
      return micro_portable<Elem::F32>;
  }
}

// ---- packing ----

#ifdef NPUSIM_GEMM_X86
// out[j] = src[2 * j] for j < count; src[2 * j + 1] may be read for j < pairs (pairs <= count).
__attribute__((target("avx2"))) void gather_stride2_avx2(const float* src, float* out, int64_t count, int64_t pairs) {
  int64_t j = 0;
  for (; j + 8 <= pairs; j += 8) {
    const __m256 lo = _mm256_loadu_ps(src + 2 * j), hi = _mm256_loadu_ps(src + 2 * j + 8);
    const __m256 even = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));  // a0 a2 b0 b2 | a4 a6 b4 b6
    _mm256_storeu_ps(out + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0))));
  }
  for (; j < count; ++j) out[j] = src[2 * j];
}
#endif

#ifdef NPUSIM_GEMM_X86
#define NPUSIM_PACK_AVX2 __attribute__((target("avx2,fma,f16c")))

// Eight consecutive values at `src` (elem E) as fp32.
template <Elem E>
NPUSIM_PACK_AVX2 inline __m256 load8_as_float(const std::byte* src) {
  const __m128i* raw = reinterpret_cast<const __m128i*>(src);
  if constexpr (E == Elem::F32)
    return _mm256_loadu_ps(reinterpret_cast<const float*>(src));
  else if constexpr (E == Elem::BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(raw)), 16));
  else
    return _mm256_cvtph_ps(_mm_loadu_si128(raw));
}

// The first `lanes` of v at out.
NPUSIM_PACK_AVX2 inline void store_lanes(float* out, __m256 v, int lanes) {
  if (lanes == 8) {
    _mm256_storeu_ps(out, v);
  } else if (lanes == 6) {  // an A panel (MR rows)
    _mm_storeu_ps(out, _mm256_castps256_ps128(v));
    _mm_storel_pi(reinterpret_cast<__m64*>(out + 4), _mm256_extractf128_ps(v, 1));
  } else {
    alignas(32) float values[8];
    _mm256_store_ps(values, v);
    for (int i = 0; i < lanes; ++i) out[i] = values[i];
  }
}

// Whole 8-step blocks of `panels` whole panels of `width` lines each, lines from `first` (line stride
// `line_bytes`): word (step, line) of a panel at panel[step * width + line], panels `panel_words` apart. Blocks of 8
// lines x 8 steps are transposed in registers (a short group repeats its last line; those lanes are not stored).
// Returns the steps packed: the caller packs the rest.
template <class Steps>
NPUSIM_PACK_AVX2 int64_t pack_lines_avx2(const std::byte* first, size_t line_bytes, int64_t panels, int64_t width,
                                         int64_t steps, typename Steps::Word* dst, int64_t panel_words) {
  const int64_t whole = steps / 8 * 8;
  for (int64_t panel = 0; panel < panels; ++panel)
    for (int64_t group = 0; group < width; group += 8) {
      const int lanes = static_cast<int>(std::min<int64_t>(8, width - group));
      const std::byte* lines[8];
      for (int i = 0; i < 8; ++i)
        lines[i] = first + static_cast<size_t>(panel * width + group + std::min(i, lanes - 1)) * line_bytes;
      auto* out = reinterpret_cast<float*>(dst + panel * panel_words + group);
      for (int64_t p = 0; p < whole; p += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = Steps::load8(lines[i] + static_cast<size_t>(p) * Steps::kBytesPerStep);
        transpose8(r);
        for (int q = 0; q < 8; ++q) store_lanes(out + (p + q) * width, r[q], lanes);
      }
    }
  return whole;
}
#endif

// Reading a line (a source row, contiguous along depth): as fp32 widened from elem E, one value per step, or as bf16
// pairs, one 32-bit word per step of two depths (the last one half zero when the depth is odd).
template <Elem E>
struct WidenedSteps {
  using Word = float;
  static constexpr size_t kBytesPerStep = E == Elem::F32 ? 4 : 2;
  static int64_t steps(int64_t depth) { return depth; }
  static int64_t whole_steps(int64_t depth) { return depth; }  // steps with every value inside the line
#ifdef NPUSIM_GEMM_X86
  static NPUSIM_PACK_AVX2 __m256 load8(const std::byte* step) { return load8_as_float<E>(step); }
#endif
  // Steps [from, to) of a line.
  static void read(const std::byte* line, int64_t from, int64_t to, int64_t, float* out) {
    to_float(line + static_cast<size_t>(from) * kBytesPerStep, E, out, to - from);
  }
};

struct PairSteps {
  using Word = uint32_t;
  static constexpr size_t kBytesPerStep = 4;
  static int64_t steps(int64_t depth) { return (depth + 1) / 2; }
  static int64_t whole_steps(int64_t depth) { return depth / 2; }
#ifdef NPUSIM_GEMM_X86
  static NPUSIM_PACK_AVX2 __m256 load8(const std::byte* step) {
    return _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(step)));
  }
#endif
  static void read(const std::byte* line, int64_t from, int64_t to, int64_t depth, uint32_t* out) {
    const auto* values = reinterpret_cast<const uint16_t*>(line);
    for (int64_t p = from; p < to; ++p) {
      const uint32_t low = values[2 * p], high = 2 * p + 1 < depth ? values[2 * p + 1] : 0;
      out[p - from] = low | high << 16;
    }
  }
};

// Lines [0, lines) from `first` (line stride line_bytes), each `depth` values, into panels of `width` lines (the
// panel padding zero): vector blocks where they fit, then the remaining steps and the last, partial panel.
template <class Steps>
void pack_lines(const std::byte* first, size_t line_bytes, int64_t lines, int64_t width, int64_t depth,
                typename Steps::Word* dst, [[maybe_unused]] bool avx2) {
  using Word = typename Steps::Word;
  const int64_t steps = Steps::steps(depth), whole_panels = lines / width;
  int64_t done = 0;  // steps of the whole panels packed already
#ifdef NPUSIM_GEMM_X86
  if (avx2)
    done =
        pack_lines_avx2<Steps>(first, line_bytes, whole_panels, width, Steps::whole_steps(depth), dst, steps * width);
#endif
  constexpr int64_t kChunk = 256;
  Word values[kChunk];
  for (int64_t panel = 0; panel * width < lines; ++panel) {
    Word* out = dst + panel * steps * width;
    const int64_t live = std::min(width, lines - panel * width);
    for (int64_t i = 0; i < width; ++i) {
      const std::byte* line = first + static_cast<size_t>(panel * width + i) * line_bytes;
      for (int64_t from = panel < whole_panels ? done : 0; from < steps; from += kChunk) {
        const int64_t to = std::min(steps, from + kChunk);
        if (i < live)
          Steps::read(line, from, to, depth, values);
        else
          std::fill(values, values + (to - from), Word{0});
        for (int64_t p = from; p < to; ++p) out[p * width + i] = values[p - from];
      }
    }
  }
}

// Rows of a row-major A, or columns of a transposed B (a linear weight [n, k]: column j of B is row j of the
// weight), as fp32 panels: lines [0, lines) from `first` over `depth` values, elem fp32, fp16 or bf16.
void pack_widened_lines(const std::byte* first, size_t line_bytes, Elem elem, int64_t lines, int64_t width,
                        int64_t depth, float* dst, bool avx2) {
  switch (elem) {
    case Elem::F32:
      return pack_lines<WidenedSteps<Elem::F32>>(first, line_bytes, lines, width, depth, dst, avx2);
    case Elem::BF16:
      return pack_lines<WidenedSteps<Elem::BF16>>(first, line_bytes, lines, width, depth, dst, avx2);
    default:
      return pack_lines<WidenedSteps<Elem::F16>>(first, line_bytes, lines, width, depth, dst, avx2);
  }
}

// Lines [0, lines) into fp32 panels of `width` lines over `steps` steps where the lines' values of one step are
// contiguous (step p of line i at first + p * step_bytes + i * elem size): one copy or conversion per panel row.
// Steps go in groups of kPackStepGroup, each group panel by panel: the reads run along kPackStepGroup source rows at
// once (a panel at a time down all the steps jumps a whole source row per step, which the prefetchers do not follow
// when rows are long) and each panel's writes stay contiguous.
void pack_steps(const std::byte* first, size_t step_bytes, Elem elem, int64_t lines, int64_t width, int64_t steps,
                float* dst) {
  constexpr int64_t kPackStepGroup = 8;
  const size_t es = elem_size(elem);
  for (int64_t group = 0; group < steps; group += kPackStepGroup) {
    const int64_t group_end = std::min(steps, group + kPackStepGroup);
    for (int64_t line0 = 0; line0 < lines; line0 += width) {
      float* panel = dst + line0 / width * steps * width;
      const int64_t live = std::min(width, lines - line0);
      for (int64_t p = group; p < group_end; ++p) {
        const std::byte* src = first + static_cast<size_t>(p) * step_bytes + static_cast<size_t>(line0) * es;
        float* out = panel + p * width;
        if (elem == Elem::F32 && live == NR && width == NR)  // the common case, as a fixed-size copy
          std::memcpy(out, src, NR * sizeof(float));
        else if (elem == Elem::F32)
          std::memcpy(out, src, static_cast<size_t>(live) * sizeof(float));
        else
          to_float(src, elem, out, live);
        std::fill(out + live, out + width, 0.0f);
      }
    }
  }
}

// A block's rows go MR to an A panel, except that where the last panel would hold one or two rows, the last two
// panels share their MR + 1 or MR + 2 rows (4 + 3, 4 + 4) when `balanced`: a tile of two rows costs about two thirds
// of a six-row one (its few chains of multiply-adds wait on each other), so two tiles of four take less than tiles of
// six and two. Rows [first, first + count) of the block go to its panel `panel`.
struct PanelRows {
  int64_t first = 0, count = 0;
};

PanelRows panel_rows(int64_t rows, int64_t panel, bool balanced) {
  const int64_t rest = rows % MR, panels = ceil_div(rows, MR);
  if (!balanced || rows < MR || (rest != 1 && rest != 2) || panel < panels - 2)
    return {panel * MR, std::min(MR, rows - panel * MR)};
  const int64_t first = (panels - 2) * MR, second_last = (MR + rest + 1) / 2;
  return panel == panels - 2 ? PanelRows{first, second_last} : PanelRows{first + second_last, MR + rest - second_last};
}

// Rows [row0, row0 + rows) x depth [p0, p0 + kc) of a strided A into panels of MR rows (kc * MR floats each), the
// last two shared as panel_rows says when `balanced`.
void pack_a_strided(const StridedOperand& a, int64_t row0, int64_t rows, int64_t p0, int64_t kc, float* dst, bool avx2,
                    bool balanced = false) {
  const PanelRows last = panel_rows(rows, ceil_div(rows, MR) - 1, balanced);
  if (last.first % MR != 0) {  // the last two panels share their rows: packed one at a time, each zero-padded
    const int64_t whole = last.first / MR * MR;  // rows in whole panels before the shared two
    pack_a_strided(a, row0, whole, p0, kc, dst, avx2);
    pack_a_strided(a, row0 + whole, last.first - whole, p0, kc, dst + whole * kc, avx2);
    pack_a_strided(a, row0 + last.first, last.count, p0, kc, dst + (whole + MR) * kc, avx2);
    return;
  }
  const size_t es = elem_size(a.elem);
  if (!a.transposed)  // element (i, p) at data[i * ld + p]: each row is a line along the depth
    return pack_widened_lines(a.data + static_cast<size_t>(row0 * a.ld + p0) * es, static_cast<size_t>(a.ld) * es,
                              a.elem, rows, MR, kc, dst, avx2);
  // Element (i, p) at data[p * ld + i]: the rows' values of one depth step are contiguous.
  pack_steps(a.data + static_cast<size_t>(p0 * a.ld + row0) * es, static_cast<size_t>(a.ld) * es, a.elem, rows, MR, kc,
             dst);
}

// The same block of a prepacked half-precision A, converted to fp32 panels.
void pack_a_converted(const PackedMatrix& a, int64_t row0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  const size_t es = elem_size(a.elem());
  for (int64_t ir = 0; ir < rows; ir += MR)
    to_float(a.panel((row0 + ir) / MR) + static_cast<size_t>(p0 * MR) * es, a.elem(), dst + ir / MR * kc * MR, kc * MR);
}

// Columns [col0, col0 + cols) of a strided B over its whole depth k into panels of NR columns (k * NR floats each).
void pack_b_strided(const StridedOperand& b, int64_t k, int64_t col0, int64_t cols, float* dst, bool avx2) {
  const size_t es = elem_size(b.elem);
  if (b.transposed)  // element (p, j) at data[j * ld + p]: each column is a line along the depth
    return pack_widened_lines(b.data + static_cast<size_t>(col0 * b.ld) * es, static_cast<size_t>(b.ld) * es, b.elem,
                              cols, NR, k, dst, avx2);
  // Element (p, j) at data[p * ld + j]: the columns' values of one depth step are contiguous.
  pack_steps(b.data + static_cast<size_t>(col0) * es, static_cast<size_t>(b.ld) * es, b.elem, cols, NR, k, dst);
}

// A bf16 B packed during the product for the AVX2 tile stays bf16, each panel step ordered columns 0 8 1 9 ... 7 15
// (interleaved_slot): the tile widens a step with one shift and one mask (no shuffle), and the panels take half the
// bytes of fp32 ones to write and to keep in cache.

#ifdef NPUSIM_GEMM_X86
// Whole panels of a transposed bf16 B (columns are lines along the depth), 8 steps at a time: per pair of columns
// (i, i + 8) one unpack gives their 32-bit words of 8 steps, and an 8x8 transpose of the words gives the steps.
// Returns the steps packed: the caller packs the rest.
NPUSIM_PACK_AVX2 int64_t pack_interleaved_avx2(const uint16_t* first, int64_t ld, int64_t panels, int64_t k,
                                               uint16_t* dst) {
  const int64_t whole = k / 8 * 8;
  for (int64_t panel = 0; panel < panels; ++panel) {
    const uint16_t* lines = first + panel * NR * ld;
    uint16_t* out = dst + panel * k * NR;
    for (int64_t p = 0; p < whole; p += 8) {
      __m256 r[8];
      for (int i = 0; i < NR / 2; ++i) {
        const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lines + i * ld + p));
        const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lines + (i + NR / 2) * ld + p));
        r[i] = _mm256_castsi256_ps(_mm256_set_m128i(_mm_unpackhi_epi16(low, high), _mm_unpacklo_epi16(low, high)));
      }
      transpose8(r);
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(reinterpret_cast<float*>(out + (p + q) * NR), r[q]);
    }
  }
  return whole;
}
#endif

// Columns [col0, col0 + cols) of a strided bf16 B over its whole depth k into interleaved panels of NR columns (k * NR
// values each, zero past the last column).
void pack_b_interleaved(const StridedOperand& b, int64_t k, int64_t col0, int64_t cols, uint16_t* dst,
                        [[maybe_unused]] bool avx2) {
  const auto* values = reinterpret_cast<const uint16_t*>(b.data);
  const int64_t whole_panels = cols / NR;
  int64_t done = 0;  // steps of the whole panels packed already
#ifdef NPUSIM_GEMM_X86
  if (avx2 && b.transposed) done = pack_interleaved_avx2(values + col0 * b.ld, b.ld, whole_panels, k, dst);
#endif
  for (int64_t panel = 0; panel * NR < cols; ++panel) {
    uint16_t* out = dst + panel * k * NR;
    for (int64_t p = panel < whole_panels ? done : 0; p < k; ++p)
      for (int64_t c = 0; c < NR; ++c) {
        const int64_t j = col0 + panel * NR + c;
        const bool live = panel * NR + c < cols;
        out[p * NR + interleaved_slot(c)] = !live ? 0 : b.transposed ? values[j * b.ld + p] : values[p * b.ld + j];
      }
  }
}

// Line j of an int8 weight operand (column j of B, row j of the weight), and its scales.
const int8_t* int8_line(const Int8WeightOperand& b, int64_t k, int64_t j) { return b.values + j * k; }
const float* int8_line_scales(const Int8WeightOperand& b, int64_t k, int64_t j) {
  return b.scales + j * ceil_div(k, b.group);
}

// Whether every run of eight depth values from a multiple of eight shares one scale.
bool int8_runs_share_scales(const Int8WeightOperand& b, int64_t k) { return b.group >= k || b.group % 8 == 0; }

#ifdef NPUSIM_GEMM_X86
// Whole panels of an int8 weight's lines from `line0`, 8 steps at a time: 8 lines' values widened and scaled, then
// transposed in registers as pack_lines_avx2 does. Returns the steps packed: the caller packs the rest.
NPUSIM_PACK_AVX2 int64_t pack_int8_avx2(const Int8WeightOperand& b, int64_t k, int64_t line0, int64_t panels,
                                        float* dst) {
  if (!int8_runs_share_scales(b, k)) return 0;
  const int64_t whole = k / 8 * 8;
  for (int64_t panel = 0; panel < panels; ++panel)
    for (int64_t group = 0; group < NR; group += 8) {
      const int8_t* lines[8];
      const float* scales[8];
      for (int i = 0; i < 8; ++i) {
        lines[i] = int8_line(b, k, line0 + panel * NR + group + i);
        scales[i] = int8_line_scales(b, k, line0 + panel * NR + group + i);
      }
      float* out = dst + panel * k * NR + group;
      for (int64_t p = 0; p < whole; p += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) {
          const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(lines[i] + p));
          r[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)),
                               _mm256_broadcast_ss(scales[i] + p / b.group));
        }
        transpose8(r);
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + (p + q) * NR, r[q]);
      }
    }
  return whole;
}
#endif

// Columns [col0, col0 + cols) of an int8 weight operand over its whole depth k into fp32 panels of NR columns (k * NR
// floats each, zero past the last column).
void pack_b_int8(const Int8WeightOperand& b, int64_t k, int64_t col0, int64_t cols, float* dst,
                 [[maybe_unused]] bool avx2) {
  const int64_t whole_panels = cols / NR;
  int64_t done = 0;  // steps of the whole panels packed already
#ifdef NPUSIM_GEMM_X86
  if (avx2) done = pack_int8_avx2(b, k, col0, whole_panels, dst);
#endif
  for (int64_t panel = 0; panel * NR < cols; ++panel) {
    float* out = dst + panel * k * NR;
    for (int64_t c = 0; c < NR; ++c) {
      const int64_t j = col0 + panel * NR + c;
      const bool live = panel * NR + c < cols;
      const int8_t* line = live ? int8_line(b, k, j) : nullptr;
      const float* scales = live ? int8_line_scales(b, k, j) : nullptr;
      for (int64_t p = panel < whole_panels ? done : 0; p < k; ++p)
        out[p * NR + c] = live ? static_cast<float>(line[p]) * scales[p / b.group] : 0.0f;
    }
  }
}

#ifdef NPUSIM_GEMM_X86
// One panel (columns [pixel0, pixel0 + width), width <= NR) of a convolution's patch matrix with hardware gathers:
// each lane's offset into a channel plane and whether it reads inside the input are worked out once per kernel tap
// and serve every channel; lanes in the padding, and those past `width`, read nothing and pack zero.
NPUSIM_PACK_AVX2 void pack_im2col_panel_gathered(const Im2colOperand& s, int64_t k, int64_t pixel0, int64_t width,
                                                 float* panel) {
  alignas(32) int32_t top[NR], left[NR], live[NR];
  for (int64_t j = 0; j < NR; ++j) {
    const int64_t pixel = pixel0 + std::min(j, width - 1);
    top[j] = static_cast<int32_t>(pixel / s.out_w * s.stride_h - s.pad_h);
    left[j] = static_cast<int32_t>(pixel % s.out_w * s.stride_w - s.pad_w);
    live[j] = j < width ? -1 : 0;
  }
  const __m256i height = _mm256_set1_epi32(static_cast<int32_t>(s.height));
  const __m256i row_length = _mm256_set1_epi32(static_cast<int32_t>(s.width));
  const __m256i minus_one = _mm256_set1_epi32(-1);
  const int64_t taps = s.kernel_h * s.kernel_w, channels = k / taps, plane = s.height * s.width;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t ky = 0; ky < s.kernel_h; ++ky)
    for (int64_t kx = 0; kx < s.kernel_w; ++kx) {
      __m256i offset[2];
      __m256 inside[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i iy = _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(top + 8 * h)),
                                            _mm256_set1_epi32(static_cast<int32_t>(ky * s.dilation_h)));
        const __m256i ix = _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(left + 8 * h)),
                                            _mm256_set1_epi32(static_cast<int32_t>(kx * s.dilation_w)));
        __m256i ok = _mm256_load_si256(reinterpret_cast<const __m256i*>(live + 8 * h));
        ok = _mm256_and_si256(ok, _mm256_cmpgt_epi32(iy, minus_one));
        ok = _mm256_and_si256(ok, _mm256_cmpgt_epi32(height, iy));
        ok = _mm256_and_si256(ok, _mm256_cmpgt_epi32(ix, minus_one));
        ok = _mm256_and_si256(ok, _mm256_cmpgt_epi32(row_length, ix));
        inside[h] = _mm256_castsi256_ps(ok);
        offset[h] = _mm256_add_epi32(_mm256_mullo_epi32(iy, row_length), ix);
      }
      float* out = panel + (ky * s.kernel_w + kx) * NR;
      const float* in = s.input;
      for (int64_t c = 0; c < channels; ++c, out += taps * NR, in += plane) {
        _mm256_storeu_ps(out, _mm256_mask_i32gather_ps(zero, in, offset[0], inside[0], 4));
        _mm256_storeu_ps(out + 8, _mm256_mask_i32gather_ps(zero, in, offset[1], inside[1], 4));
      }
    }
}
#endif

// Whether a patch matrix packs faster with hardware gathers than with runs of copies along input rows: when output
// rows are short, a panel's columns split into several runs, each set up again for every tap (on Zen 4, stride 2
// and 1 alike up to 28 pixels a row, even counting a phase split first; rows of 112 gained nothing).
bool gathered_im2col(const Im2colOperand& s) { return s.height * s.width < (int64_t{1} << 31) && s.out_w < 4 * NR; }

// The shape of split_im2col_phases' output: per channel, stride_h * stride_w phases of rows x cols floats.
struct PhaseLayout {
  int64_t rows = 0, cols = 0;
  int64_t plane() const { return rows * cols; }
};

PhaseLayout phase_layout(const Im2colOperand& s) {
  return {ceil_div(s.height + 2 * s.pad_h, s.stride_h), ceil_div(s.width + 2 * s.pad_w, s.stride_w)};
}

// Whether some tap of a kernel `taps` wide (dilation `dilation`, stride `stride`) reads phase `r`.
bool phase_read(int64_t r, int64_t taps, int64_t dilation, int64_t stride) {
  for (int64_t t = 0; t < taps; ++t)
    if (t * dilation % stride == r) return true;
  return false;
}

}  // namespace

bool im2col_phases_pay(const Im2colOperand& s) { return (s.stride_h > 1 || s.stride_w > 1) && s.out_w >= 4 * NR; }

int64_t im2col_phase_floats(const Im2colOperand& s) {
  return s.channels * s.stride_h * s.stride_w * phase_layout(s).plane();
}

void split_im2col_phases(const Im2colOperand& s, float* phases, ThreadPool* pool) {
  const PhaseLayout l = phase_layout(s);
  const int64_t sy = s.stride_h, sx = s.stride_w;
  const bool avx2 = use_avx2();
  // Row qy of phase (ry, rx) of channel c: input row qy * sy + ry - pad_h, every sx-th value from column rx - pad_w.
  const auto split_row = [&](int64_t c, int64_t ry, int64_t rx, int64_t qy) {
    float* out = phases + ((c * sy + ry) * sx + rx) * l.plane() + qy * l.cols;
    const int64_t iy = qy * sy + ry - s.pad_h;
    if (iy < 0 || iy >= s.height) return std::fill(out, out + l.cols, 0.0f);
    // Columns qx in [first, last) read inside the row: 0 <= qx * sx + rx - pad_w < width.
    const int64_t first = std::min(l.cols, ceil_div(std::max<int64_t>(0, s.pad_w - rx), sx));
    const int64_t last = std::clamp(ceil_div(s.width + s.pad_w - rx, sx), first, l.cols);
    std::fill(out, out + first, 0.0f);
    std::fill(out + last, out + l.cols, 0.0f);
    const int64_t ix = first * sx + rx - s.pad_w;
    const float* src = s.input + (c * s.height + iy) * s.width + ix;
#ifdef NPUSIM_GEMM_X86
    if (sx == 2 && avx2) {
      const int64_t pairs = std::clamp<int64_t>((s.width - ix) / 2, 0, last - first);
      return gather_stride2_avx2(src, out + first, last - first, pairs);
    }
#endif
    for (int64_t q = first; q < last; ++q) out[q] = src[(q - first) * sx];
  };
  const auto split_channels = [&](int64_t begin, int64_t end, int) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t ry = 0; ry < sy; ++ry) {
        if (!phase_read(ry, s.kernel_h, s.dilation_h, sy)) continue;
        for (int64_t rx = 0; rx < sx; ++rx) {
          if (!phase_read(rx, s.kernel_w, s.dilation_w, sx)) continue;
          for (int64_t qy = 0; qy < l.rows; ++qy) split_row(c, ry, rx, qy);
        }
      }
  };
  if (pool)
    pool->parallel_for(s.channels, 1, split_channels);
  else
    split_channels(0, s.channels, 0);
}

namespace {

// Columns [col0, col0 + cols) of the patch matrix from the phases of the input: per tap, each run of a panel's
// pixels in one output row copies consecutive values of one phase row, for every channel. A pointwise kernel whose
// phase rows are as long as the output rows reads one phase as the [channels, pixels] matrix it is.
void pack_b_im2col_phases(const Im2colOperand& s, int64_t k, int64_t col0, int64_t cols, float* dst) {
  const PhaseLayout l = phase_layout(s);
  const int64_t sy = s.stride_h, sx = s.stride_w, taps = s.kernel_h * s.kernel_w, channels = k / taps;
  const int64_t channel_floats = sy * sx * l.plane();
  const bool one_run = taps == 1 && l.cols == s.out_w && s.pad_h == 0 && s.pad_w == 0;
  struct Run {
    int64_t lane, count, oy, ox;
  };
  for (int64_t jr = 0; jr < cols; jr += NR) {
    float* panel = dst + jr / NR * k * NR;
    const int64_t width = std::min(NR, cols - jr);
    Run runs[NR];
    int count = 0;
    for (int64_t j = 0; j < width;) {
      const int64_t pixel = col0 + jr + j, oy = pixel / s.out_w, ox = pixel % s.out_w;
      const int64_t lanes = one_run ? width : std::min(width - j, s.out_w - ox);
      runs[count++] = {j, lanes, oy, ox};
      j += lanes;
    }
    for (int64_t ky = 0; ky < s.kernel_h; ++ky)
      for (int64_t kx = 0; kx < s.kernel_w; ++kx) {
        int64_t offsets[NR];  // per run, from the channel's first phase
        for (int r = 0; r < count; ++r) {
          const int64_t py = runs[r].oy * sy + ky * s.dilation_h, px = runs[r].ox * sx + kx * s.dilation_w;
          offsets[r] = (py % sy * sx + px % sx) * l.plane() + py / sy * l.cols + px / sx;
        }
        float* out = panel + (ky * s.kernel_w + kx) * NR;
        const float* phases = s.phases;
        for (int64_t c = 0; c < channels; ++c, out += taps * NR, phases += channel_floats) {
          if (count == 1 && runs[0].count == NR)  // a whole panel in one run: a copy of fixed size
            std::memcpy(out, phases + offsets[0], NR * sizeof(float));
          else
            for (int r = 0; r < count; ++r)
              std::memcpy(out + runs[r].lane, phases + offsets[r], static_cast<size_t>(runs[r].count) * sizeof(float));
          for (int64_t j = width; j < NR; ++j) out[j] = 0.0f;
        }
      }
  }
}

// Columns [col0, col0 + cols) of a convolution's patch matrix over its whole depth into panels of NR columns. A
// panel's columns split into runs that lie in one output row; per kernel tap, each run reads one input row with a
// fixed stride, zero where the tap falls into the padding. Which lanes of a run read inside their row depends only
// on the kernel column, so it is worked out once per panel and kernel column (kernels up to kMaxSpanTaps wide),
// not once per tap: the 7x7 stem packs 147 rows of taps per panel.
void pack_b_im2col(const Im2colOperand& s, int64_t k, int64_t col0, int64_t cols, float* dst, bool avx2, bool avx512) {
  struct Run {
    int64_t lane, count, iy, ix;  // first lane, lanes, input coordinates of the first lane's top-left tap
  };
  // Lanes [first, last) of a run read inside the input row; lanes below `pairs` also have their right neighbour
  // (ix + 2 j + 1) inside, so a stride-2 gather may read them in pairs.
  struct Span {
    int64_t first = 0, last = 0, pairs = 0;
  };
  constexpr int64_t kMaxSpanTaps = 16;
  const int64_t plane = s.height * s.width, sx = s.stride_w;
  const auto span_of = [&](const Run& run, int64_t ix) {
    // Divisions only at the borders: they are slow.
    Span span{0, run.count, 0};
    if (ix < 0) span.first = std::min(run.count, ceil_div(-ix, sx));
    if (ix + (run.count - 1) * sx >= s.width)
      span.last = std::clamp<int64_t>(ix < s.width ? (s.width - 1 - ix) / sx + 1 : 0, span.first, run.count);
    span.pairs = sx == 2 ? std::clamp<int64_t>((s.width - ix) / 2, span.first, span.last) : span.first;
    return span;
  };
  if (s.phases) return pack_b_im2col_phases(s, k, col0, cols, dst);
#ifdef NPUSIM_GEMM_X86
  if (avx2 && gathered_im2col(s)) {
    for (int64_t jr = 0; jr < cols; jr += NR) {
      const int64_t width = std::min(NR, cols - jr);
      float* panel = dst + jr / NR * k * NR;
      if (!avx512 || !gemm_detail::pack_im2col_panel_permuted(s, k, col0 + jr, width, panel))
        pack_im2col_panel_gathered(s, k, col0 + jr, width, panel);
    }
    return;
  }
#endif
  (void)avx2;  // only x86 has vector gathers and permutes
  (void)avx512;
  const bool cached_spans = s.kernel_w <= kMaxSpanTaps;
  for (int64_t jr = 0; jr < cols; jr += NR) {
    float* panel = dst + jr / NR * k * NR;
    const int64_t width = std::min(NR, cols - jr);
    Run runs[NR];
    int count = 0;
    for (int64_t j = 0; j < width;) {
      const int64_t pixel = col0 + jr + j, oy = pixel / s.out_w, ox = pixel % s.out_w;
      const int64_t lanes = std::min(width - j, s.out_w - ox);
      runs[count++] = {j, lanes, oy * s.stride_h - s.pad_h, ox * sx - s.pad_w};
      j += lanes;
    }
    Span spans[kMaxSpanTaps][NR];
    if (cached_spans)
      for (int64_t kx = 0; kx < s.kernel_w; ++kx)
        for (int r = 0; r < count; ++r) spans[kx][r] = span_of(runs[r], runs[r].ix + kx * s.dilation_w);
    float* out = panel;  // row p = (channel, ky, kx) of the panel
    for (int64_t channel = 0; channel * s.kernel_h * s.kernel_w < k; ++channel) {
      const float* in = s.input + channel * plane;
      for (int64_t ky = 0; ky < s.kernel_h; ++ky) {
        const int64_t dy = ky * s.dilation_h;
        for (int64_t kx = 0; kx < s.kernel_w; ++kx, out += NR) {
          const int64_t dx = kx * s.dilation_w;
          for (int r = 0; r < count; ++r) {
            const Run& run = runs[r];
            float* o = out + run.lane;
            const int64_t iy = run.iy + dy, ix = run.ix + dx;
            if (iy < 0 || iy >= s.height) {
              std::fill(o, o + run.count, 0.0f);
              continue;
            }
            const Span span = cached_spans ? spans[kx][r] : span_of(run, ix);
            const float* src = in + iy * s.width + ix;
            for (int64_t j = 0; j < span.first; ++j) o[j] = 0.0f;
            if (sx == 1) {
              std::memcpy(o + span.first, src + span.first,
                          static_cast<size_t>(span.last - span.first) * sizeof(float));
#ifdef NPUSIM_GEMM_X86
            } else if (sx == 2 && avx2) {
              gather_stride2_avx2(src + 2 * span.first, o + span.first, span.last - span.first,
                                  span.pairs - span.first);
#endif
            } else {
              for (int64_t j = span.first; j < span.last; ++j) o[j] = src[j * sx];
            }
            for (int64_t j = span.last; j < run.count; ++j) o[j] = 0.0f;
          }
          for (int64_t j = width; j < NR; ++j) out[j] = 0.0f;
        }
      }
    }
  }
}

// Columns [col0, col0 + cols) of a B packed during the product into fp32 panels, whichever kind of operand it is.
void pack_b_widened(const GemmOperand& b, int64_t k, int64_t col0, int64_t cols, float* dst, bool avx2, bool avx512) {
  if (const auto* strided = std::get_if<StridedOperand>(&b)) return pack_b_strided(*strided, k, col0, cols, dst, avx2);
  if (const auto* int8 = std::get_if<Int8WeightOperand>(&b)) return pack_b_int8(*int8, k, col0, cols, dst, avx2);
  pack_b_im2col(std::get<Im2colOperand>(b), k, col0, cols, dst, avx2, avx512);
}

// ---- epilogue ----

#ifdef NPUSIM_GEMM_X86
// One row of fp32 sums through the epilogue into an fp32 output in a single pass: + bias (one per row, or one per
// column), + an fp32 residual, activation. The same operations in the same order as the portable loops; the
// activation takes the bound as the first operand of max/min, so that a NaN sum stays NaN as it does there.
NPUSIM_PACK_AVX2 void finish_row_avx2(const float* v, int64_t cols, const float* row_bias, const float* column_bias,
                                      const float* residual, const GemmEpilogue& e, float* out) {
  const __m256 bias = _mm256_set1_ps(row_bias ? *row_bias : 0.0f);
  const __m256 low = _mm256_set1_ps(e.activation == GemmActivation::Relu ? 0.0f : e.low);
  const __m256 high = _mm256_set1_ps(e.high);
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    __m256 x = _mm256_loadu_ps(v + j);
    if (column_bias) x = _mm256_add_ps(x, _mm256_loadu_ps(column_bias + j));
    if (row_bias) x = _mm256_add_ps(x, bias);
    if (residual) x = _mm256_add_ps(x, _mm256_loadu_ps(residual + j));
    if (e.activation != GemmActivation::None) x = _mm256_max_ps(low, x);
    if (e.activation == GemmActivation::Clamp) x = _mm256_min_ps(high, x);
    _mm256_storeu_ps(out + j, x);
  }
  for (; j < cols; ++j) {
    float x = v[j];
    if (column_bias) x += column_bias[j];
    if (row_bias) x += *row_bias;
    if (residual) x += residual[j];
    if (e.activation == GemmActivation::Relu) x = x < 0.0f ? 0.0f : x;
    if (e.activation == GemmActivation::Clamp) x = x < e.low ? e.low : (x > e.high ? e.high : x);
    out[j] = x;
  }
}
#endif

// Sums [rows, cols] (row stride ld_sums, changed in place) through the epilogue into C at (row0, col0).
void store_rows(float* sums, int64_t ld_sums, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                const GemmOutput& c, const GemmEpilogue& e, [[maybe_unused]] bool avx2) {
  const size_t out_es = elem_size(c.elem);
#ifdef NPUSIM_GEMM_X86
  if (avx2 && c.elem == Elem::F32 && (!e.residual || e.residual_elem == Elem::F32)) {
    // Rows that follow one another in C take the unary step in one call (a product of one column calls it per
    // value otherwise).
    const bool contiguous = c.ld == cols;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t row = row0 + i;
      const float* residual =
          e.residual ? reinterpret_cast<const float*>(e.residual) + row * e.residual_ld + col0 : nullptr;
      float* out = reinterpret_cast<float*>(c.data) + row * c.ld + col0;
      finish_row_avx2(sums + i * ld_sums, cols, e.bias && !e.bias_per_column ? e.bias + row : nullptr,
                      e.bias && e.bias_per_column ? e.bias + col0 : nullptr, residual, e, out);
      if (e.unary && !contiguous) apply_unary(*e.unary, out, out, cols);
    }
    float* first = reinterpret_cast<float*>(c.data) + row0 * c.ld + col0;
    if (e.unary && contiguous) apply_unary(*e.unary, first, first, rows * cols);
    return;
  }
#endif
  alignas(64) float residual_row[kMaxColBlock];
  for (int64_t i = 0; i < rows; ++i) {
    float* v = sums + i * ld_sums;
    const int64_t row = row0 + i;
    if (e.bias && e.bias_per_column) {
      const float* bias = e.bias + col0;
      for (int64_t j = 0; j < cols; ++j) v[j] += bias[j];
    } else if (e.bias) {
      const float bias = e.bias[row];
      for (int64_t j = 0; j < cols; ++j) v[j] += bias;
    }
    if (e.residual) {
      const std::byte* src = e.residual + static_cast<size_t>(row * e.residual_ld + col0) * elem_size(e.residual_elem);
      const float* add = reinterpret_cast<const float*>(src);
      if (e.residual_elem != Elem::F32) {
        to_float(src, e.residual_elem, residual_row, cols);
        add = residual_row;
      }
      for (int64_t j = 0; j < cols; ++j) v[j] += add[j];
    }
    if (e.activation == GemmActivation::Relu) {
      for (int64_t j = 0; j < cols; ++j) v[j] = v[j] < 0.0f ? 0.0f : v[j];
    } else if (e.activation == GemmActivation::Clamp) {
      const float low = e.low, high = e.high;
      for (int64_t j = 0; j < cols; ++j) v[j] = v[j] < low ? low : (v[j] > high ? high : v[j]);
    }
    if (e.unary) apply_unary(*e.unary, v, v, cols);
    std::byte* out = c.data + static_cast<size_t>(row * c.ld + col0) * out_es;
    if (c.elem == Elem::F32)
      std::memcpy(out, v, static_cast<size_t>(cols) * sizeof(float));
    else
      from_float(v, out, c.elem, cols);
  }
}

// ---- the product over one worker's region ----

struct Region {
  int64_t row0 = 0, row1 = 0, col0 = 0, col1 = 0;
};

struct Operands {
  const GemmOperand& a;
  const GemmOperand& b;
  const GemmOutput& c;
  const GemmEpilogue& epilogue;
};

struct WorkerBuffers {
  float* sums;     // [mc, nc]
  float* a_block;  // [mc, kc]
  float* b_block;  // [k, nc]
  float* whole_a;  // [m, k] when A may be packed whole (PackedGemm::whole_a_floats_), else null
};

// A worker's buffers, in this order in its scratch; `b_floats` 0 when B comes prepacked.
WorkerBuffers worker_buffers(float* base, int64_t mc, int64_t nc, int64_t kc, int64_t b_floats,
                             int64_t whole_a_floats) {
  float* b_block = base + mc * nc + mc * kc;
  return {base, base + mc * nc, b_block, whole_a_floats > 0 ? b_block + b_floats : nullptr};
}

}  // namespace

namespace {

// See PackingArenaScope: the arena, the owner named last, and how many blocks that owner has asked for.
thread_local std::shared_ptr<ZeroedArena> g_packing_arena;
thread_local std::string g_packing_owner;
thread_local uint64_t g_owner_blocks = 0;

// FNV-1a over the owner's name, then its block count and the operand's shape; never 0 (no tag).
uint64_t block_tag(GemmSide side, Elem elem, int64_t rows, int64_t cols) {
  uint64_t hash = 0xcbf29ce484222325ull;
  const auto mix = [&hash](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) hash = (hash ^ ((value >> (8 * byte)) & 0xff)) * 0x100000001b3ull;
  };
  for (const char c : g_packing_owner) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  mix(g_owner_blocks);
  mix(static_cast<uint64_t>(side));
  mix(static_cast<uint64_t>(elem));
  mix(static_cast<uint64_t>(rows));
  mix(static_cast<uint64_t>(cols));
  return hash == 0 ? 1 : hash;
}

}  // namespace

PackedMatrix PackedMatrix::shaped(GemmSide side, Elem elem, int64_t rows, int64_t cols) {
  require(is_float_elem(elem), "a packed operand must be fp32, fp16 or bf16");
  require(rows >= 0 && cols >= 0, "negative operand size");
  PackedMatrix m;
  m.side_ = side;
  m.elem_ = elem;
  m.rows_ = rows;
  m.cols_ = cols;
  const int64_t width = side == GemmSide::A ? MR : NR;       // values per depth step
  const int64_t depth = side == GemmSide::A ? cols : rows;   // k
  const int64_t extent = side == GemmSide::A ? rows : cols;  // m or n
  const auto es = static_cast<int64_t>(elem_size(elem));
  m.panel_bytes_ = static_cast<size_t>(round_up(std::max<int64_t>(1, depth * width) * es, 64));
  m.bytes_ = m.panel_bytes_ * static_cast<size_t>(ceil_div(extent, width));
  return m;
}

PackedMatrix PackedMatrix::zeroed(GemmSide side, Elem elem, int64_t rows, int64_t cols) {
  PackedMatrix m = shaped(side, elem, rows, cols);
  m.take_storage(Pages::Small);
  return m;
}

void PackedMatrix::take_storage(Pages pages) {
  if (const std::shared_ptr<ZeroedArena>& arena = g_packing_arena) {
    const ZeroedArena::Allocation block =
        arena->allocate(bytes_, "packed weights", block_tag(side_, elem_, rows_, cols_));
    ++g_owner_blocks;
    data_ = block.data;
    prewritten_ = block.written;
    owner_ = arena;
  } else {
    auto buffer = std::make_shared<AlignedBuffer>(bytes_, pages);
    data_ = buffer->data();
    owner_ = std::move(buffer);
  }
}

PackingArenaScope::PackingArenaScope(std::shared_ptr<ZeroedArena> arena)
    : previous_(std::move(g_packing_arena)), previous_owner_(g_packing_owner), previous_count_(g_owner_blocks) {
  g_packing_arena = std::move(arena);
}

void PackingArenaScope::set_owner(const std::string& owner) {
  g_packing_owner = owner;
  g_owner_blocks = 0;
}

PackingArenaScope::~PackingArenaScope() {
  g_packing_arena = std::move(previous_);
  g_packing_owner = std::move(previous_owner_);
  g_owner_blocks = previous_count_;
}

namespace {

// Lines [first, first + live) of an fp32 panel (`depth` steps of `width` values) multiplied by their scales in place.
[[gnu::always_inline]] inline void scale_panel_body(float* panel, int64_t width, int64_t live, int64_t depth,
                                                    const double* scales) {
  for (int64_t p = 0; p < depth; ++p) {
    float* step = panel + p * width;
    for (int64_t i = 0; i < live; ++i) step[i] = static_cast<float>(static_cast<double>(step[i]) * scales[i]);
  }
}

void scale_panel_plain(float* panel, int64_t width, int64_t live, int64_t depth, const double* scales) {
  scale_panel_body(panel, width, live, depth, scales);
}

#ifdef NPUSIM_GEMM_X86
// A panel of 6 or 16 lines: the scales of a whole number of steps fill whole vectors (24 or 16 values).
__attribute__((target("avx2"))) void scale_panel_avx2(float* panel, int64_t width, int64_t live, int64_t depth,
                                                      const double* scales) {
  if (live != width || (width != kGemmTileRows && width != kGemmTileCols))
    return scale_panel_body(panel, width, live, depth, scales);
  const int64_t steps_per_block = width == kGemmTileRows ? 4 : 1, block = steps_per_block * width;
  alignas(32) double pattern[24];
  for (int64_t j = 0; j < block; ++j) pattern[j] = scales[j % width];
  int64_t p = 0;
  for (; p + steps_per_block <= depth; p += steps_per_block) {
    float* values = panel + p * width;
    for (int64_t j = 0; j < block; j += 4) {
      const __m256d wide = _mm256_cvtps_pd(_mm_loadu_ps(values + j));
      _mm_storeu_ps(values + j, _mm256_cvtpd_ps(_mm256_mul_pd(wide, _mm256_load_pd(pattern + j))));
    }
  }
  scale_panel_body(panel + p * width, width, live, depth - p, scales);
}
#endif

void scale_panel(float* panel, int64_t width, int64_t live, int64_t depth, const double* scales, bool avx2) {
#ifdef NPUSIM_GEMM_X86
  if (avx2) return scale_panel_avx2(panel, width, live, depth, scales);
#endif
  (void)avx2;
  scale_panel_plain(panel, width, live, depth, scales);
}

}  // namespace

void prefault_storage(const std::vector<PackedMatrix*>& matrices, ThreadPool* pool) {
  constexpr size_t kPiece = size_t{512} << 10;
  std::vector<std::pair<std::byte*, size_t>> pieces;
  for (PackedMatrix* m : matrices)
    for (size_t at = 0; at < m->bytes(); at += kPiece)
      pieces.emplace_back(m->mutable_panel(0) + at, std::min(kPiece, m->bytes() - at));
  const auto fault_in = [&pieces](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i)
      prefault(pieces[static_cast<size_t>(i)].first, pieces[static_cast<size_t>(i)].second);
  };
  if (pool)
    pool->parallel_for(static_cast<int64_t>(pieces.size()), 1, fault_in);
  else
    fault_in(0, static_cast<int64_t>(pieces.size()), 0);
}

namespace {

// pack_panels(begin, end) over panels [0, panels) of `panel_bytes` of source each, split over the pool (when given)
// in pieces of at least 64 KiB of source: smaller ones cost more to hand out than they save.
template <typename PackPanels>
void over_panel_pieces(ThreadPool* pool, int64_t panels, int64_t panel_bytes, const PackPanels& pack_panels) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(1, panel_bytes));
  if (pool && panels > grain)
    pool->parallel_for(panels, grain, [&](int64_t begin, int64_t end, int) { pack_panels(begin, end); });
  else
    pack_panels(0, panels);
}

}  // namespace

PackedMatrix PackedMatrix::pack(GemmSide side, const std::byte* data, Elem elem, int64_t rows, int64_t cols, int64_t ld,
                                bool transposed, ThreadPool* pool, const double* line_scales) {
  require(!line_scales || elem == Elem::F32, "scaled lines are packed from fp32 only");
  PackedMatrix m = zeroed(side, elem, rows, cols);  // the padding stays zero
  if (ld == 0) ld = transposed ? rows : cols;
  require(ld >= (transposed ? rows : cols), "the row stride is smaller than a row");
  if (m.prewritten()) return m;
  prefault_storage({&m}, pool);
  const int64_t width = side == GemmSide::A ? MR : NR;
  const int64_t depth = side == GemmSide::A ? cols : rows;
  const int64_t extent = side == GemmSide::A ? rows : cols;
  const int64_t panels = ceil_div(extent, width);
  const size_t es = elem_size(elem);
  // Each source row is one panel line (rows of A, or columns of a transposed B).
  const bool rows_are_lines = (side == GemmSide::A) != transposed;
  const bool avx2 = use_avx2();
  const auto over_panels = [&](const auto& pack_panels) {
    over_panel_pieces(pool, panels, depth * width * static_cast<int64_t>(es), pack_panels);
  };
  // The panel just written, while it is still in the cache.
  const auto scale_lines = [&](int64_t panel) {
    if (line_scales)
      scale_panel(reinterpret_cast<float*>(m.mutable_panel(panel)), width, std::min(width, extent - panel * width),
                  depth, line_scales + panel * width, avx2);
  };
  if (rows_are_lines && elem == Elem::F32) {  // 8x8 register transposes
    over_panels([&](int64_t begin, int64_t end) {
      for (int64_t panel = begin; panel < end; ++panel) {
        pack_widened_lines(data + static_cast<size_t>(panel * width * ld) * es, static_cast<size_t>(ld) * es, elem,
                           std::min(width, extent - panel * width), width, depth,
                           reinterpret_cast<float*>(m.mutable_panel(panel)), avx2);
        scale_lines(panel);
      }
    });
    return m;
  }
  // Element i of panel row p (depth p) comes from logical element (first + i, p) for A, (p, first + i) for B.
  const auto pack_as = [&]<typename Bits>(int64_t begin, int64_t end) {
    const auto at = [&](int64_t r, int64_t c) { return static_cast<size_t>(transposed ? c * ld + r : r * ld + c); };
    for (int64_t panel = begin; panel < end; ++panel) {
      auto* dst = reinterpret_cast<Bits*>(m.mutable_panel(panel));
      const int64_t first = panel * width, count = std::min(width, extent - first);
      const auto copy = [&](int64_t p, int64_t i) {
        const size_t index = side == GemmSide::A ? at(first + i, p) : at(p, first + i);
        std::memcpy(dst + p * width + i, data + index * sizeof(Bits), sizeof(Bits));  // the source may be unaligned
      };
      // Walk the source along its rows.
      if (rows_are_lines) {
        for (int64_t i = 0; i < count; ++i)
          for (int64_t p = 0; p < depth; ++p) copy(p, i);
      } else {
        for (int64_t p = 0; p < depth; ++p)
          for (int64_t i = 0; i < count; ++i) copy(p, i);
      }
    }
  };
  over_panels([&](int64_t begin, int64_t end) {
    if (es == 4)
      pack_as.template operator()<uint32_t>(begin, end);
    else
      pack_as.template operator()<uint16_t>(begin, end);
    for (int64_t panel = begin; panel < end; ++panel) scale_lines(panel);
  });
  return m;
}

PackedMatrix PackedMatrix::pack_interleaved_bf16(const uint16_t* weight, int64_t n, int64_t k, int64_t ld,
                                                 ThreadPool* pool) {
  require(ld >= k, "the row stride is smaller than a row");
  PackedMatrix m = shaped(GemmSide::B, Elem::BF16, k, n);
  m.interleaved_ = true;
  // Each product streams these panels from memory, which huge pages suit (a packing arena offers its chunks to
  // them once written).
  m.take_storage(Pages::Huge);
  if (m.prewritten()) return m;
  prefault_storage({&m}, pool);
  const StridedOperand source{reinterpret_cast<const std::byte*>(weight), Elem::BF16, ld, true};
  const int64_t panels = ceil_div(n, NR);
  const bool avx2 = use_avx2();
  const auto pack_panels = [&](int64_t begin, int64_t end) {
    for (int64_t panel = begin; panel < end; ++panel)
      pack_b_interleaved(source, k, panel * NR, std::min(NR, n - panel * NR),
                         reinterpret_cast<uint16_t*>(m.mutable_panel(panel)), avx2);
  };
  over_panel_pieces(pool, panels, k * NR * static_cast<int64_t>(sizeof(uint16_t)), pack_panels);
  return m;
}

PackedGemm::PackedGemm(const GemmSpec& spec, ScratchSpace& scratch) : spec_(spec) {
  require(spec.m >= 0 && spec.n >= 0 && spec.k >= 0, "negative product size");
  const int64_t max_depth = spec.n <= 4 * NR ? kMaxDepthBlockFewColumns : kMaxDepthBlock;
  const int64_t depth_blocks = std::max<int64_t>(1, ceil_div(spec.k, max_depth));
  kc_ = std::max<int64_t>(1, ceil_div(spec.k, depth_blocks));
  // Every depth block starts at a multiple of 32: an even depth for bf16 pairs, a whole tile for AMX.
  if (kc_ < spec.k) kc_ = round_up(kc_, 32);
  mc_ = std::min(kMaxRowBlock, round_up(std::max<int64_t>(spec.m, 1), MR));
  nc_ = std::min(kMaxColBlock, round_up(std::max<int64_t>(spec.n, 1), NR));
  if (!spec.b_prepacked) {
    const int64_t fits = kPackedBBlockBytes / (std::max<int64_t>(spec.k, 1) * 4) / NR * NR;
    nc_ = std::min(nc_, std::max(kMinPackedBColumns, fits));
  }
  int64_t floats = mc_ * nc_ + mc_ * kc_;
  if (!spec.b_prepacked) floats += spec.k * nc_;
  const int64_t whole_a = round_up(std::max<int64_t>(spec.m, 1), MR) * spec.k;
  if (!spec.a_prepacked && spec.n > nc_ && whole_a * static_cast<int64_t>(sizeof(float)) <= kWholeABytes)
    whole_a_floats_ = whole_a;
  floats += whole_a_floats_;
  const int64_t whole_b = spec.k * round_up(std::max<int64_t>(spec.n, 1), NR);
  if (spec.a_prepacked && !spec.b_prepacked && whole_b * static_cast<int64_t>(sizeof(float)) <= kSharedPackedBBytes)
    shared_b_floats_ = whole_b;
  scratch.reserve_per_worker(static_cast<size_t>(floats + shared_b_floats_) * sizeof(float));
}

namespace {

// Splits `panels` into `parts` nearly equal runs; the start of run `index`.
int64_t split(int64_t panels, int64_t parts, int64_t index) { return panels * index / parts; }

struct Grid {
  int64_t rows = 1, cols = 1;
  bool shared_b = false;  // B packed once into worker 0's scratch for every piece, in a pass of its own
};

// The multiply-adds of the busiest of `parts` runs of `panels` panels `width` lines wide, in lines, a last partial
// panel of `rest` live lines counted at `tail` lines (what its narrower tile costs).
int64_t busiest_part(int64_t panels, int64_t parts, int64_t width, int64_t rest, int64_t tail) {
  int64_t most = 0;
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t first = split(panels, parts, part), last = split(panels, parts, part + 1);
    int64_t lines = (last - first) * width;
    if (last == panels && rest > 0) lines -= width - tail;
    most = std::max(most, lines);
  }
  return most;
}

// How `threads` workers divide the tiles: the split with the least work for the busiest worker, counting what the
// narrower tiles of a last partial panel save (a single last column costs a quarter of a panel, as the 7x7 images'
// 49 columns leave), the packing each worker repeats for its own columns and, when an operand is too large for the
// caches, its reads of it (A once per column block, a prepacked B once per row block), which memory bandwidth makes
// far dearer than multiply-adds. With `can_share_b`, B may instead be packed once by all workers together in a pass
// before the product (kPassCost more), so that workers splitting the rows do not each pack the whole of it.
Grid choose_grid(int64_t threads, const GemmSpec& s, int64_t mc, int64_t nc, bool streams_a, bool streams_b,
                 bool can_share_b) {
  const int64_t m = s.m, n = s.n, k = s.k;
  const int64_t row_panels = ceil_div(m, MR), col_panels = ceil_div(n, NR);
  const int64_t row_rest = m % MR, col_rest = n % NR;
  const int64_t row_tail = row_rest <= 2 ? 2 : row_rest <= 4 ? 4 : MR;
  const int64_t col_tail = col_rest == 1 ? NR / 4 : col_rest <= NR / 2 ? NR / 2 : NR;
  Grid best;
  double best_cost = -1.0;
  for (int64_t rows = 1; rows <= std::min(threads, row_panels); ++rows) {
    const int64_t cols = std::min(threads / rows, col_panels);
    const int64_t height = ceil_div(row_panels, rows) * MR, width = ceil_div(col_panels, cols) * NR;
    double cost = static_cast<double>(busiest_part(row_panels, rows, MR, row_rest, row_tail)) *
                  static_cast<double>(busiest_part(col_panels, cols, NR, col_rest, col_tail)) * static_cast<double>(k);
    if (streams_a) cost += 16.0 * static_cast<double>(height * k * ceil_div(width, nc));
    if (streams_b) cost += 16.0 * static_cast<double>(width * k * ceil_div(height, mc));
    const double own_packing = s.b_prepacked ? 0.0 : 8.0 * static_cast<double>(width * k);
    if (best_cost < 0 || cost + own_packing < best_cost) {
      best_cost = cost + own_packing;
      best = {rows, cols, false};
    }
    const double shared_packing =
        8.0 * static_cast<double>(col_panels * NR * k) / static_cast<double>(threads) + kPassCost;
    if (can_share_b && rows * cols > 1 && cost + shared_packing < best_cost) {
      best_cost = cost + shared_packing;
      best = {rows, cols, true};
    }
  }
  return best;
}

// The split of a product over a pool of `pool_threads`: as many workers as its size justifies, then choose_grid.
Grid plan_grid(const GemmSpec& s, int64_t pool_threads, int64_t mc, int64_t nc, bool can_share_b) {
  const int64_t work = s.m * s.n * std::max<int64_t>(s.k, 1);
  int64_t threads =
      std::min<int64_t>({pool_threads, ThreadPool::kMaxClaimRuns, std::max<int64_t>(1, work / kMinMacsPerThread)});
  if (s.max_threads > 0) threads = std::min<int64_t>(threads, s.max_threads);
  constexpr int64_t kCachedBytes = int64_t{2} << 20;  // operands larger than this come from memory
  const int64_t a_bytes = s.m * s.k * static_cast<int64_t>(sizeof(float));
  const int64_t b_bytes = s.k * s.n * static_cast<int64_t>(sizeof(float));
  return choose_grid(threads, s, mc, nc, !s.a_prepacked || a_bytes > kCachedBytes,
                     s.b_prepacked && b_bytes > kCachedBytes, can_share_b);
}

void check_operand(const GemmOperand& operand, GemmSide side, bool prepacked, int64_t rows, int64_t cols) {
  const char* name = side == GemmSide::A ? "A" : "B";
  if (prepacked) {
    const PackedMatrix* const* packed = std::get_if<const PackedMatrix*>(&operand);
    require(packed && *packed, side == GemmSide::A ? "A was planned prepacked" : "B was planned prepacked");
    require((*packed)->side() == side && (*packed)->rows() == rows && (*packed)->cols() == cols,
            "a prepacked operand does not match the planned product");
    return;
  }
  if (const StridedOperand* s = std::get_if<StridedOperand>(&operand)) {
    require(is_float_elem(s->elem), "a strided operand must be fp32, fp16 or bf16");
    require(rows * cols == 0 || s->data, "a strided operand has no data");
    require(s->ld >= (s->transposed ? rows : cols) && s->ld >= 0, "a strided operand's row stride is too small");
    return;
  }
  if (const Int8WeightOperand* s = std::get_if<Int8WeightOperand>(&operand)) {
    require(side == GemmSide::B, "only B can be an int8 weight operand");
    require(s->group > 0, "an int8 weight operand needs a positive scale group");
    require(rows * cols == 0 || (s->values && s->scales), "an int8 weight operand has no values or no scales");
    return;
  }
  if (const Im2colOperand* s = std::get_if<Im2colOperand>(&operand)) {
    require(side == GemmSide::B, "only B can be an im2col operand");
    require(s->channels * s->kernel_h * s->kernel_w == rows && s->out_h * s->out_w == cols,
            "the im2col operand does not match the planned product");
    require(rows * cols == 0 || s->input, "the im2col operand has no input");
    return;
  }
  fail(std::string("packed GEMM: operand ") + name + " was planned to be packed during the product");
}

// ---- bf16 depth pairs (AVX-512 BF16 products of two bf16 operands) ----

#ifdef NPUSIM_GEMM_X86
// The same from an int8 weight, each value times its scale rounded to bf16 as dequantize_row rounds it.
void pack_b_int8_pairs(const Int8WeightOperand& b, int64_t k, int64_t col0, int64_t cols, uint32_t* dst) {
  const int64_t k_pairs = (k + 1) / 2, whole_panels = cols / NR;
  const int64_t done =
      int8_runs_share_scales(b, k) ? gemm_detail::pack_int8_pairs_avx512(b, k, col0, whole_panels, dst) : 0;
  for (int64_t panel = 0; panel * NR < cols; ++panel) {
    uint32_t* out = dst + panel * k_pairs * NR;
    for (int64_t c = 0; c < NR; ++c) {
      const bool live = panel * NR + c < cols;
      const int8_t* line = live ? int8_line(b, k, col0 + panel * NR + c) : nullptr;
      const float* scales = live ? int8_line_scales(b, k, col0 + panel * NR + c) : nullptr;
      const auto value = [&](int64_t p) -> uint32_t {
        return live && p < k ? float_to_bf16(static_cast<float>(line[p]) * scales[p / b.group]) : 0u;
      };
      for (int64_t q = panel < whole_panels ? done : 0; q < k_pairs; ++q)
        out[q * NR + c] = value(2 * q) | value(2 * q + 1) << 16;
    }
  }
}
#endif

// Columns [col0, col0 + cols) of a transposed bf16 B (a linear weight [n, k]) or an int8 weight over its whole depth
// into panels of NR columns of depth pairs: word (p, j) holds column j's values at depths 2p and 2p + 1.
void pack_b_pairs(const GemmOperand& b, int64_t k, int64_t col0, int64_t cols, uint32_t* dst) {
#ifdef NPUSIM_GEMM_X86
  if (const auto* int8 = std::get_if<Int8WeightOperand>(&b)) return pack_b_int8_pairs(*int8, k, col0, cols, dst);
#endif
  const auto& s = std::get<StridedOperand>(b);
  pack_lines<PairSteps>(s.data + static_cast<size_t>(col0 * s.ld) * 2, static_cast<size_t>(s.ld) * 2, cols, NR, k, dst,
                        true);
}

// Rows [row0, row0 + rows) x depth [p0, p0 + kc) of a row-major bf16 A into panels of MR rows of depth pairs.
void pack_a_pairs(const StridedOperand& a, int64_t row0, int64_t rows, int64_t p0, int64_t kc, uint32_t* dst) {
  pack_lines<PairSteps>(a.data + static_cast<size_t>(row0 * a.ld + p0) * 2, static_cast<size_t>(a.ld) * 2, rows, MR, kc,
                        dst, true);
}

// Whether a product can run on bf16 pairs: both operands bf16 (every product exact in fp32, so only the order of
// the additions differs from widening both), A row-major and B a transposed weight, both packed during the product;
// or a bf16 A against an int8 weight, whose values widen to bf16 (as the GEMV's do on these CPUs).
bool bf16_pair_operands(const Operands& ops) {
  const auto* a = std::get_if<StridedOperand>(&ops.a);
  const auto* b = std::get_if<StridedOperand>(&ops.b);
  const bool bf16_b = (b && b->elem == Elem::BF16 && b->transposed) || std::holds_alternative<Int8WeightOperand>(ops.b);
  return a && a->elem == Elem::BF16 && !a->transposed && bf16_b;
}

#ifdef NPUSIM_GEMM_X86
// ---- AMX tiles (bf16 pairs on 16 x 16 tiles) ----

constexpr int64_t kAmxRows = 16;   // rows of A and of the sums per tile
constexpr int64_t kAmxDepth = 32;  // depth values of A per tile: 16 pairs of B

// Whether the worker buffers hold the AMX layouts: B panels padded to whole tiles of depth pairs within [k, nc],
// an A block padded to whole tiles within [mc, kc] (depth blocks start on whole tiles, see PackedGemm).
bool amx_fits(int64_t k, int64_t kc, int64_t mc) {
  const int64_t depth = std::min(kc, k);
  return k >= kAmxDepth && round_up(mc, kAmxRows) * round_up(depth, kAmxDepth) / 2 <= mc * kc;
}

// The pairs product of run_region on AMX tiles: B packed per panel over the whole depth, zero past it, so that
// every B tile is 16 whole pairs; each A block copied as bf16 rows, zero-padded to whole tiles (the zero depth
// values meet B's zero pairs, the zero rows give sums nobody stores).
void run_region_amx(const Region& region, const Operands& ops, int64_t k, int64_t kc, int64_t mc, int64_t nc,
                    const WorkerBuffers& buffers) {
  const auto& a = std::get<StridedOperand>(ops.a);
  const int64_t k_pairs = (k + 1) / 2, panel_pairs = round_up(k_pairs, kAmxRows);
  auto* a_values = reinterpret_cast<uint16_t*>(buffers.a_block);
  auto* b_words = reinterpret_cast<uint32_t*>(buffers.b_block);
  gemm_detail::amx_configure();
  for (int64_t jc = region.col0; jc < region.col1; jc += nc) {
    const int64_t cols = std::min(nc, region.col1 - jc);
    for (int64_t jr = 0; jr < cols; jr += NR) {
      uint32_t* panel = b_words + jr / NR * panel_pairs * NR;
      pack_b_pairs(ops.b, k, jc + jr, std::min(NR, cols - jr), panel);
      std::fill(panel + k_pairs * NR, panel + panel_pairs * NR, 0u);
    }
    for (int64_t ic = region.row0; ic < region.row1; ic += mc) {
      const int64_t rows = std::min(mc, region.row1 - ic), padded_rows = round_up(rows, kAmxRows);
      for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t depth = std::min(kc, k - pc), a_ld = round_up(depth, kAmxDepth);
        for (int64_t i = 0; i < padded_rows; ++i) {
          uint16_t* row = a_values + i * a_ld;
          const int64_t live = i < rows ? depth : 0;
          if (live > 0)
            std::memcpy(row, a.data + static_cast<size_t>((ic + i) * a.ld + pc) * 2, static_cast<size_t>(live) * 2);
          std::fill(row + live, row + a_ld, uint16_t{0});
        }
        const uint32_t* b_depth = b_words + pc / 2 * NR;
        for (int64_t jr = 0; jr < cols; jr += 2 * NR) {
          const int col_tiles = cols - jr > NR ? 2 : 1;
          const uint32_t* b0 = b_depth + jr / NR * panel_pairs * NR;
          for (int64_t ir = 0; ir < padded_rows; ir += 2 * kAmxRows) {
            const int row_tiles = padded_rows - ir > kAmxRows ? 2 : 1;
            const uint16_t* a_rows = a_values + ir * a_ld;
            float* c = buffers.sums + ir * nc + jr;
            if (ir + row_tiles * kAmxRows <= mc) {
              gemm_detail::amx_bf16_tiles(row_tiles, col_tiles, a_ld / kAmxDepth, a_rows, a_ld, b0,
                                          b0 + panel_pairs * NR, c, nc, pc > 0);
              continue;
            }
            // Tile rows past the sums buffer: through a buffer of whole tiles, only the live rows kept.
            alignas(64) float tile_sums[2 * kAmxRows * 2 * NR];
            const int64_t live_rows = rows - ir;
            for (int64_t i = 0; i < live_rows && pc > 0; ++i)
              std::memcpy(tile_sums + i * 2 * NR, c + i * nc, static_cast<size_t>(col_tiles * NR) * sizeof(float));
            gemm_detail::amx_bf16_tiles(row_tiles, col_tiles, a_ld / kAmxDepth, a_rows, a_ld, b0, b0 + panel_pairs * NR,
                                        tile_sums, 2 * NR, pc > 0);
            for (int64_t i = 0; i < live_rows; ++i)
              std::memcpy(c + i * nc, tile_sums + i * 2 * NR, static_cast<size_t>(col_tiles * NR) * sizeof(float));
          }
        }
      }
      store_rows(buffers.sums, nc, rows, cols, ic, jc, ops.c, ops.epilogue, true);
    }
  }
  gemm_detail::amx_release();
}
#endif

// Where the AVX-512 tile whose first sum is C's (row, col), with `rows` rows and `cols` columns of C left from there,
// stores its sums through the epilogue (an fp32 C and residual).
gemm_detail::TileOutput tile_output(const Operands& ops, int64_t row, int64_t col, int64_t rows, int64_t cols) {
  const GemmEpilogue& e = ops.epilogue;
  gemm_detail::TileOutput out;
  out.c = reinterpret_cast<float*>(ops.c.data) + row * ops.c.ld + col;
  out.ldc = ops.c.ld;
  out.rows = rows;
  out.cols = cols;
  if (e.bias && e.bias_per_column) out.column_bias = e.bias + col;
  if (e.bias && !e.bias_per_column) out.row_bias = e.bias + row;
  if (e.residual) {
    out.residual = reinterpret_cast<const float*>(e.residual) + row * e.residual_ld + col;
    out.residual_ld = e.residual_ld;
  }
  out.activation = e.activation;
  out.low = e.low;
  out.high = e.high;
  return out;
}

#ifdef NPUSIM_GEMM_X86
// Asks for the two lines of C and of the residual at column `col` of rows [row0, row1) into L2.
void prefetch_tile_rows(const Operands& ops, int64_t row0, int64_t row1, int64_t col) {
  const auto* c = reinterpret_cast<const float*>(ops.c.data);
  const auto* residual = reinterpret_cast<const float*>(ops.epilogue.residual);
  for (int64_t r = row0; r < row1; ++r) {
    prefetch_to_l2(c + r * ops.c.ld + col, 2 * NR * sizeof(float));
    if (residual) prefetch_to_l2(residual + r * ops.epilogue.residual_ld + col, 2 * NR * sizeof(float));
  }
}
#endif

// Whether products with `kernel` run the AVX-512 tiles (and pack patches with AVX-512 permutes).
bool avx512_tiles(GemmKernelChoice kernel) {
#ifdef NPUSIM_GEMM_X86
  return kernel == GemmKernelChoice::Avx512 || kernel == GemmKernelChoice::Amx;
#else
  (void)kernel;
  return false;
#endif
}

// The rows of a strided A that a worker's buffers hold packed whole (WorkerBuffers::whole_a), for this run.
struct WholeARows {
  int64_t row0 = -1, row1 = -1;
};

// With `whole_a`, the region's rows of a strided A are taken packed whole from buffers.whole_a, packed there first
// unless `packed_rows` says they are; else A is packed a block at a time. `shared_b`, when given, holds all of B
// packed (panel p at p * k * NR) and the region packs none of it.
void run_region(const Region& region, const Operands& ops, const GemmSpec& spec, int64_t kc, int64_t mc, int64_t nc,
                const WorkerBuffers& buffers, GemmKernelChoice kernel, bool whole_a, WholeARows& packed_rows,
                const float* shared_b = nullptr) {
  const bool avx2 = kernel != GemmKernelChoice::Portable;
  const bool avx512 = avx512_tiles(kernel);
  const int64_t k = spec.k;
  const PackedMatrix* packed_a = spec.a_prepacked ? std::get<const PackedMatrix*>(ops.a) : nullptr;
  const PackedMatrix* packed_b = spec.b_prepacked ? std::get<const PackedMatrix*>(ops.b) : nullptr;
  const bool direct_a = packed_a && packed_a->elem() == Elem::F32;
  const StridedOperand* strided_b = packed_b || shared_b ? nullptr : std::get_if<StridedOperand>(&ops.b);
  // A bf16 B the region packs itself stays bf16 for the AVX2 tile (see pack_b_interleaved); one prepacked in that
  // order is read by the AVX2 tile (or the portable one) whichever kernel runs.
  const bool interleaved_b = (kernel == GemmKernelChoice::Avx2 && strided_b && strided_b->elem == Elem::BF16) ||
                             (packed_b && packed_b->interleaved());
  const Elem b_elem = packed_b ? packed_b->elem() : interleaved_b ? Elem::BF16 : Elem::F32;
  // By live rows of the A panel (1 to MR) and whether the B panel is narrow.
  MicroKernel kernels[MR + 1][2];
  for (int64_t live = 1; live <= MR; ++live)
    for (bool narrow : {false, true}) kernels[live][narrow] = micro_kernel(b_elem, avx2, narrow, live, interleaved_b);
  // A row-major fp32 B whose rows start on cache lines, which the AVX-512 tiles read where it lies: no packing pass
  // (rows that straddle lines measured slower read in place, 176 -> 163 GFLOP/s for 512 x 49 x 2048 on Zen 5).
  const bool b_readable_in_place = strided_b && !strided_b->transposed && strided_b->elem == Elem::F32 &&
                                   strided_b->ld % NR == 0 && reinterpret_cast<uintptr_t>(strided_b->data) % 64 == 0;
  // The 6x32 / 6x16 AVX-512 tiles, unless fp32 panels run faster on the AVX2 tile here: not where B is read in
  // place, which only the AVX-512 tiles do.
  const bool wide = avx512 && !interleaved_b && !(b_elem == Elem::F32 && fp32_prefers_avx2() && !b_readable_in_place);
#ifdef NPUSIM_GEMM_X86
  // A prepacked A under a single column step is read once: its panels are asked for further ahead.
  const bool streamed_a = direct_a && region.col1 - region.col0 <= 2 * NR;
  const gemm_detail::PairKernel single512 = wide ? gemm_detail::avx512_kernel(b_elem, false, streamed_a) : nullptr;
  const gemm_detail::PairKernel pair512 = wide ? gemm_detail::avx512_kernel(b_elem, true, streamed_a) : nullptr;
  const gemm_detail::RowsKernel single512_rows12 =
      wide ? gemm_detail::avx512_rows12_kernel(b_elem, false, streamed_a) : nullptr;
  const gemm_detail::RowsKernel pair512_rows12 =
      wide ? gemm_detail::avx512_rows12_kernel(b_elem, true, streamed_a) : nullptr;
#endif
  const size_t b_es = packed_b ? elem_size(packed_b->elem()) : interleaved_b ? sizeof(uint16_t) : sizeof(float);
  const bool in_place_b = wide && b_readable_in_place;
  // Whether the AVX-512 tiles store an fp32 C through the epilogue themselves (see TileOutput).
  const GemmEpilogue& e = ops.epilogue;
  const bool fused =
      wide && k > 0 && ops.c.elem == Elem::F32 && !e.unary && (!e.residual || e.residual_elem == Elem::F32);
#ifdef NPUSIM_GEMM_X86
  const bool pairs = avx512 && !packed_a && !packed_b && cpu_has_avx512_bf16() && bf16_pair_operands(ops);
  const gemm_detail::Bf16PairKernel single_pairs = pairs ? gemm_detail::avx512_bf16_pair_kernel(false) : nullptr;
  const gemm_detail::Bf16PairKernel double_pairs = pairs ? gemm_detail::avx512_bf16_pair_kernel(true) : nullptr;
#endif
  const int64_t k_pairs = (k + 1) / 2;
  auto* a_words = reinterpret_cast<uint32_t*>(buffers.a_block);
  auto* b_words = reinterpret_cast<uint32_t*>(buffers.b_block);
#ifdef NPUSIM_GEMM_X86
  if (pairs && kernel == GemmKernelChoice::Amx && amx_fits(k, kc, mc))
    return run_region_amx(region, ops, k, kc, mc, nc, buffers);
#endif
  // The AVX2 tiles of a strided A share a row block's last rows between its last two panels (see panel_rows).
  const bool balanced = avx2 && !wide && !packed_a;
  // The region's rows of A packed once for every column block (panel p at p * k * MR, or p * k_pairs * MR words),
  // a row block at a time so that the panels match the blocks'.
  whole_a = whole_a && buffers.whole_a && !packed_a;
  if (whole_a && (packed_rows.row0 != region.row0 || packed_rows.row1 != region.row1)) {
    packed_rows = {region.row0, region.row1};
    const auto& strided_a = std::get<StridedOperand>(ops.a);
#ifdef NPUSIM_GEMM_X86
    if (pairs)
      pack_a_pairs(strided_a, region.row0, region.row1 - region.row0, 0, k,
                   reinterpret_cast<uint32_t*>(buffers.whole_a));
    else
#endif
      for (int64_t ic = region.row0; ic < region.row1; ic += mc)
        pack_a_strided(strided_a, ic, std::min(mc, region.row1 - ic), 0, k, buffers.whole_a + (ic - region.row0) * k,
                       avx2, balanced);
  }
  for (int64_t jc = region.col0; jc < region.col1; jc += nc) {
    const int64_t cols = std::min(nc, region.col1 - jc);
#ifdef NPUSIM_GEMM_X86
    if (pairs) {
      pack_b_pairs(ops.b, k, jc, cols, b_words);
      for (int64_t ic = region.row0; ic < region.row1; ic += mc) {
        const int64_t rows = std::min(mc, region.row1 - ic);
        if (k == 0)
          for (int64_t i = 0; i < rows; ++i) std::fill(buffers.sums + i * nc, buffers.sums + i * nc + cols, 0.0f);
        for (int64_t pc = 0; pc < k; pc += kc) {  // kc is even when k takes several blocks
          const int64_t depth = std::min(kc, k - pc), depth_pairs = (depth + 1) / 2;
          if (!whole_a) pack_a_pairs(std::get<StridedOperand>(ops.a), ic, rows, pc, depth, a_words);
          auto a_panel = [&](int64_t panel) {
            return whole_a ? reinterpret_cast<const uint32_t*>(buffers.whole_a) +
                                 ((ic - region.row0) / MR + panel) * k_pairs * MR + pc / 2 * MR
                           : a_words + panel * depth_pairs * MR;
          };
          for (int64_t jr = 0; jr < cols;) {
            const bool two = cols - jr > NR;
            const uint32_t* b0 = b_words + jr / NR * k_pairs * NR + pc / 2 * NR;
            const uint32_t* b1 = two ? b0 + k_pairs * NR : b0;
            for (int64_t panel = 0; panel * MR < rows; ++panel)
              (two ? double_pairs : single_pairs)(depth_pairs, a_panel(panel), b0, b1,
                                                  buffers.sums + panel * MR * nc + jr, nc, pc > 0);
            jr += two ? 2 * NR : NR;
          }
        }
        store_rows(buffers.sums, nc, rows, cols, ic, jc, ops.c, ops.epilogue, avx2);
      }
      continue;
    }
#endif
    // The AVX-512 tiles read B in place (see in_place_b), but for a last partial panel, which is packed.
    const int64_t in_place_cols = in_place_b ? cols / NR * NR : 0;
    if (!packed_b && !shared_b && in_place_cols < cols) {
      if (interleaved_b)
        pack_b_interleaved(*strided_b, k, jc, cols, reinterpret_cast<uint16_t*>(buffers.b_block), avx2);
      else
        pack_b_widened(ops.b, k, jc + in_place_cols, cols - in_place_cols, buffers.b_block, avx2, avx512);
    }
    for (int64_t ic = region.row0; ic < region.row1; ic += mc) {
      const int64_t rows = std::min(mc, region.row1 - ic);
      if (k == 0)
        for (int64_t i = 0; i < rows; ++i) std::fill(buffers.sums + i * nc, buffers.sums + i * nc + cols, 0.0f);
      for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t depth = std::min(kc, k - pc);
        if (!direct_a && !whole_a) {
          if (packed_a)
            pack_a_converted(*packed_a, ic, rows, pc, depth, buffers.a_block);
          else
            pack_a_strided(std::get<StridedOperand>(ops.a), ic, rows, pc, depth, buffers.a_block, avx2, balanced);
        }
        auto b_panel = [&](int64_t jr) {
          if (jr < in_place_cols)
            return strided_b->data + static_cast<size_t>(pc * strided_b->ld + jc + jr) * sizeof(float);
          jr -= in_place_cols;  // the packed panels start at the first column not read in place
          if (packed_b) return packed_b->panel((jc + jr) / NR) + static_cast<size_t>(pc * NR) * b_es;
          if (shared_b) return reinterpret_cast<const std::byte*>(shared_b + ((jc + jr) / NR * k + pc) * NR);
          return reinterpret_cast<const std::byte*>(buffers.b_block) +
                 static_cast<size_t>(jr / NR * k * NR + pc * NR) * b_es;
        };
        // Bytes from one depth step of the panel at column jr to the next: a row of B where it is read in place.
        [[maybe_unused]] auto b_step_of = [&](int64_t jr) {
          return static_cast<int64_t>(jr < in_place_cols ? strided_b->ld * sizeof(float) : NR * b_es);
        };
        auto a_panel = [&](int64_t panel) -> const float* {
          if (direct_a) return reinterpret_cast<const float*>(packed_a->panel(ic / MR + panel)) + pc * MR;
          if (whole_a) return buffers.whole_a + ((ic - region.row0) / MR + panel) * k * MR + pc * MR;
          return buffers.a_block + panel * depth * MR;
        };
        const int64_t panels = ceil_div(rows, MR);
        // A last panel of one live column goes to the column kernel: a tile would do sixteen columns' work for it
        // (on AVX-512, a whole 12x16 tile; the 7x7 images' 49 columns end in one).
        [[maybe_unused]] const bool column_kernel = avx2 && b_elem == Elem::F32 && depth <= kMaxDepthBlockFewColumns;
        // The last depth block's tiles store through the epilogue themselves where they can.
        [[maybe_unused]] const bool through = fused && pc + depth >= k;
        // A product of one shallow depth block, whose tiles store through the epilogue, goes a pair of A panels
        // across all the block's columns at a time: C and the residual are then written and read along whole rows
        // of the block, not 128 bytes of each of its rows per column step (256 x 3136 x 64 with a residual on Zen 5:
        // 0.63 -> 0.59 ms, and 1.8 -> 1.4 ms while other guests crowd the L3); deeper blocks keep each B panel in L1
        // for all the rows instead, and narrow ones gain nothing (49 columns: 10% slower).
        const bool bands = wide && through && depth == k && k <= kRowBandDepth && cols >= kRowBandColumns;
        const int64_t band = bands ? 2 : panels;
        // Columns [jr, next) of A panels [first, end), returning next: whichever kernel the columns left take.
        const auto column_step = [&](int64_t jr, int64_t first, int64_t end) -> int64_t {
          const std::byte* b0 = b_panel(jr);
          [[maybe_unused]] const int64_t row0 = first * MR, row1 = std::min(rows, end * MR);  // in the row block
#ifdef NPUSIM_GEMM_X86
          if (column_kernel && cols - jr == 1) {
            const int64_t b_step = b_step_of(jr);
            alignas(32) float column[kMaxDepthBlockFewColumns];
            for (int64_t p = 0; p < depth; ++p) column[p] = *reinterpret_cast<const float*>(b0 + p * b_step);
            for (int64_t panel = first; panel < end; ++panel) {
              const PanelRows tile = panel_rows(rows, panel, balanced);
              // The column tile writes all MR rows: not for the two panels that share their rows.
              if (tile.count == MR || (panel == panels - 1 && tile.first % MR == 0))
                micro_column_avx2(depth, a_panel(panel), column, buffers.sums + tile.first * nc + jr, nc, pc > 0);
              else
                kernels[tile.count][true](depth, a_panel(panel), b0, buffers.sums + tile.first * nc + jr, nc, pc > 0);
            }
            if (through)  // the tiles stored theirs through the epilogue already
              store_rows(buffers.sums + row0 * nc + jr, nc, row1 - row0, 1, ic + row0, jc + jr, ops.c, ops.epilogue,
                         avx2);
            return jr + NR;
          }
          // Two B panels at a time while two remain, and two A panels (12 rows) at a time while two remain (the
          // sums buffer is padded to whole panels).
          if (wide) {
            // The C and residual lines that the tiles a little later store through the epilogue, asked into L2
            // now: a tile's rows lie a whole row of C apart, which the hardware prefetchers do not follow (with C
            // and the residual out of the caches, 256 x 3136 x 64 with a residual took 1.6 ms, 1.1 ms with these).
            // Two column steps ahead in bands (their steps are short), one otherwise.
            if (through) {
              const int64_t ahead = jc + jr + (bands ? 2 : 1) * 2 * NR;
              if (ahead + 2 * NR <= jc + cols) prefetch_tile_rows(ops, ic + row0, ic + row1, ahead);
            }
            // A pair reads both of its panels in place, or both packed; it leaves a last single column to the
            // column kernel.
            const bool in_place = jr < in_place_cols;
            const bool pair = cols - jr > NR && !(column_kernel && cols - jr == NR + 1) &&
                              (!in_place || jr + 2 * NR <= in_place_cols);
            const std::byte* b1 = pair ? b_panel(jr + NR) : b0;
            const int64_t b_step = b_step_of(jr);
            int64_t panel = first;
            for (; panel + 1 < end; panel += 2) {
              const gemm_detail::TileOutput out =
                  through ? tile_output(ops, ic + panel * MR, jc + jr, rows - panel * MR, cols - jr)
                          : gemm_detail::TileOutput{};
              (pair ? pair512_rows12 : single512_rows12)(depth, a_panel(panel), a_panel(panel + 1), b0, b1, b_step,
                                                         buffers.sums + panel * MR * nc + jr, nc, pc > 0,
                                                         through ? &out : nullptr);
            }
            for (; panel < end; ++panel) {
              const gemm_detail::TileOutput out =
                  through ? tile_output(ops, ic + panel * MR, jc + jr, rows - panel * MR, cols - jr)
                          : gemm_detail::TileOutput{};
              (pair ? pair512 : single512)(depth, a_panel(panel), b0, b1, b_step, buffers.sums + panel * MR * nc + jr,
                                           nc, pc > 0, through ? &out : nullptr);
            }
            return jr + (pair ? 2 * NR : NR);
          }
#endif
          const bool narrow = cols - jr <= NR / 2;
          // A prepacked B comes from memory, one depth block of a panel at a time in a panel k values deep: the
          // next panel's block is asked into L2 a part at a time while this one's A panels are multiplied (prepacked
          // bf16 weights of a 128-token prompt, AVX2, one Zen 4 thread: 2% slower than packing them during the
          // product without this, 3-5% faster with).
          const std::byte* next_b = packed_b && jr + NR < cols ? b_panel(jr + NR) : nullptr;
          const int64_t next_lines = next_b ? ceil_div(depth * NR * static_cast<int64_t>(b_es), 64) : 0;
          const int64_t lines_per_panel = ceil_div(next_lines, std::max<int64_t>(1, end - first));
          for (int64_t panel = first, line = 0; panel < end; ++panel) {
            const PanelRows tile = panel_rows(rows, panel, balanced);
            for (const int64_t stop = std::min(next_lines, line + lines_per_panel); line < stop; ++line)
              __builtin_prefetch(next_b + line * 64, 0, 2);
            kernels[tile.count][narrow](depth, a_panel(panel), b0, buffers.sums + tile.first * nc + jr, nc, pc > 0);
          }
          return jr + NR;
        };
        for (int64_t first = 0; first < panels; first += band)
          for (int64_t jr = 0; jr < cols;) jr = column_step(jr, first, std::min(panels, first + band));
      }
      if (!fused) store_rows(buffers.sums, nc, rows, cols, ic, jc, ops.c, ops.epilogue, avx2);
    }
  }
}

}  // namespace

void PackedGemm::check(const GemmOperand& a, const GemmOperand& b, const GemmOutput& c,
                       const GemmEpilogue& epilogue) const {
  const GemmSpec& s = spec_;
  check_operand(a, GemmSide::A, s.a_prepacked, s.m, s.k);
  check_operand(b, GemmSide::B, s.b_prepacked, s.k, s.n);
  require(is_float_elem(c.elem) && c.data && c.ld >= s.n, "bad output");
  require(!epilogue.residual || (is_float_elem(epilogue.residual_elem) && epilogue.residual_ld >= s.n), "bad residual");
}

void PackedGemm::run(const GemmOperand& a, const GemmOperand& b, const GemmOutput& c, const GemmEpilogue& epilogue,
                     ThreadPool& pool, const ScratchSpace& scratch) const {
  const GemmSpec& s = spec_;
  if (s.m == 0 || s.n == 0) return;
  check(a, b, c, epilogue);
  const Grid grid = plan_grid(s, pool.size(), mc_, nc_, shared_b_floats_ > 0);
  const int64_t row_panels = ceil_div(s.m, MR), col_panels = ceil_div(s.n, NR);
  const GemmKernelChoice kernel = active_kernel();
  const Operands ops{a, b, c, epilogue};
  float* shared_b = nullptr;
  const auto region_of = [&](int64_t index) {
    const int64_t r = index / grid.cols, q = index % grid.cols;
    return Region{split(row_panels, grid.rows, r) * MR, std::min(s.m, split(row_panels, grid.rows, r + 1) * MR),
                  split(col_panels, grid.cols, q) * NR, std::min(s.n, split(col_panels, grid.cols, q + 1) * NR)};
  };
  const auto buffers_of = [&](int worker) {
    return worker_buffers(scratch.worker_as<float>(worker), mc_, nc_, kc_, s.b_prepacked ? 0 : s.k * nc_,
                          whole_a_floats_);
  };
  if (grid.shared_b) {
    shared_b = shared_b_of(scratch);
    const bool avx2 = kernel != GemmKernelChoice::Portable;
    const bool avx512 = avx512_tiles(kernel);
    pool.parallel_for(col_panels, 1, [&](int64_t first, int64_t last, int) {
      const int64_t col0 = first * NR, cols = std::min(s.n, last * NR) - col0;
      float* dst = shared_b + first * s.k * NR;
      pack_b_widened(b, s.k, col0, cols, dst, avx2, avx512);
    });
  }
  const int pieces = static_cast<int>(grid.rows * grid.cols);
  if (pieces == 1) {
    WholeARows packed_rows;
    run_region(region_of(0), ops, s, kc_, mc_, nc_, buffers_of(0), kernel, s.n > nc_, packed_rows, shared_b);
    return;
  }
  // Each piece's region is claimed a column block at a time (parallel_claim), so that a worker that finishes its
  // own goes on with blocks another has not reached; a block is computed the same way whoever claims it.
  std::array<int64_t, ThreadPool::kMaxClaimRuns + 1> starts{};
  for (int index = 0; index < pieces; ++index) {
    const Region region = region_of(index);
    const bool empty = region.row0 >= region.row1 || region.col0 >= region.col1;
    starts[index + 1] = starts[index] + (empty ? 0 : ceil_div(region.col1 - region.col0, nc_));
  }
  pool.parallel_claim<WholeARows>(starts.data(), pieces,
                                  [&](WholeARows& packed_rows, int index, int64_t unit, int worker) {
                                    const Region region = region_of(index);
                                    Region block = region;
                                    block.col0 = region.col0 + (unit - starts[index]) * nc_;
                                    block.col1 = std::min(region.col1, block.col0 + nc_);
                                    run_region(block, ops, s, kc_, mc_, nc_, buffers_of(worker), kernel,
                                               region.col1 - region.col0 > nc_, packed_rows, shared_b);
                                  });
}

bool PackedGemm::single_worker(int threads) const {
  const Grid grid = plan_grid(spec_, threads, mc_, nc_, shared_b_floats_ > 0);
  return grid.rows * grid.cols == 1;
}

bool PackedGemm::packs_b_once(int threads) const {
  return spec_.m > 0 && spec_.n > 0 && plan_grid(spec_, threads, mc_, nc_, shared_b_floats_ > 0).shared_b;
}

float* PackedGemm::shared_b_of(const ScratchSpace& scratch) const {
  const int64_t own = mc_ * nc_ + mc_ * kc_ + (spec_.b_prepacked ? 0 : spec_.k * nc_) + whole_a_floats_;
  return scratch.worker_as<float>(0) + own;
}

void PackedGemm::run_on_worker(const GemmOperand& a, const GemmOperand& b, const GemmOutput& c,
                               const GemmEpilogue& epilogue, int worker, const ScratchSpace& scratch) const {
  const GemmSpec& s = spec_;
  if (s.m == 0 || s.n == 0) return;
  check(a, b, c, epilogue);
  const WorkerBuffers buffers =
      worker_buffers(scratch.worker_as<float>(worker), mc_, nc_, kc_, s.b_prepacked ? 0 : s.k * nc_, whole_a_floats_);
  WholeARows packed_rows;
  run_region({0, s.m, 0, s.n}, Operands{a, b, c, epilogue}, s, kc_, mc_, nc_, buffers, active_kernel(), s.n > nc_,
             packed_rows);
}

void store_through_epilogue(float* sums, int64_t ld_sums, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                            const GemmOutput& c, const GemmEpilogue& epilogue) {
  const bool avx2 = use_avx2();
  for (int64_t j = 0; j < cols; j += kMaxColBlock)  // store_rows converts residuals a block of columns at a time
    store_rows(sums + j, ld_sums, rows, std::min(kMaxColBlock, cols - j), row0, col0 + j, c, epilogue, avx2);
}

void set_gemm_kernel_choice(GemmKernelChoice choice) { g_choice.store(choice, std::memory_order_relaxed); }

bool gemm_uses_avx2() { return use_avx2(); }

bool gemm_kernel_supported(GemmKernelChoice choice) {
  switch (choice) {
    case GemmKernelChoice::Avx2:
      return cpu_has_avx2();
    case GemmKernelChoice::Avx512:
      return cpu_has_avx512();
    case GemmKernelChoice::Amx:
      return cpu_has_amx();
    default:
      return true;
  }
}

GemmKernelChoice gemm_active_kernel() { return active_kernel(); }

}  // namespace npusim::cpu
