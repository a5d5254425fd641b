#include "backends/cpu/gemv.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/compact_bf16.h"
#include "core/cpu_features.h"
#include "npusim/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/avx2_sums.h"
#define NPUSIM_GEMV_X86 1
#endif

namespace npusim::cpu {

namespace {

// How an int8 weight is scaled: float weights are not; one scale per row is applied to the finished sum; smaller
// groups scale the weights as they are widened.
enum class Scaling { None, PerRow, PerGroup };

Scaling scaling_of(const GemvWeight& w) {
  if (w.type != GemvWeightType::Int8) return Scaling::None;
  return w.group >= w.k ? Scaling::PerRow : Scaling::PerGroup;
}

// Called once per output value from every kernel, so inlined into each.
inline __attribute__((always_inline)) void store_result(const GemvProblem& p, int64_t i, int64_t j, float value) {
  if (p.bias) value += load_float(p.bias, p.bias_elem, p.bias_count == 1 ? 0 : j);
  if (p.y_elem == Elem::F32)
    reinterpret_cast<float*>(p.y)[i * p.ldy + j] = value;
  else if (p.y_elem == Elem::BF16)
    reinterpret_cast<uint16_t*>(p.y)[i * p.ldy + j] = float_to_bf16(value);
  else
    store_float(p.y, p.y_elem, i * p.ldy + j, value);
}

// Activations quantized to int8 in blocks of kActivationBlock values along k, for int8 weights on AVX2: the
// products then run on 8-bit integer multiply-adds, and memory, not widening, sets the speed.
constexpr int64_t kActivationBlock = 32;

struct Int8Activations {
  const int8_t* values = nullptr;  // [m, stride], zero past k
  const float* scales = nullptr;   // [m, blocks]
  int64_t stride = 0, blocks = 0;
  // With AVX-512 VNNI and one row: per scale group of the weight, 128 times the sum over its blocks of scale times
  // the block's sum of values: what offsetting the weights to unsigned adds to a row's sum, less its weight scale.
  const float* offset_terms = nullptr;
};

// An array that grows, never shrinks, and starts on a cache line: a 64-byte vector load from it never straddles
// two lines.
template <class T>
class LineAlignedArray {
 public:
  T* resize(size_t count) {
    storage_.resize(count + kLine / sizeof(T));
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = reinterpret_cast<T*>((address + kLine - 1) / kLine * kLine);
    return data_;
  }
  T* data() const { return data_; }

 private:
  static constexpr uintptr_t kLine = 64;
  std::vector<T> storage_;
  T* data_ = nullptr;
};

// Scratch of the thread that quantizes; grows, never shrinks, so steady-state calls allocate nothing.
struct ActivationScratch {
  LineAlignedArray<int8_t> values;
  LineAlignedArray<float> scales;
  std::vector<float> offset_terms;
};

// A bf16 weight vector of 16 values widens to two fp32 vectors without a shuffle: 32-bit lane i holds weights 2i
// (low half) and 2i+1 (high half), so shifting the lane left by 16 gives the even weights and clearing the low half
// the odd ones. The activations are reordered once per call to match (per 16 values: the 8 even, then the 8 odd);
// a single-row product then costs one load, one integer op and one FMA per 8 weights and reads one memory stream.
constexpr int64_t kPairBlock = 16;

// What the kernels read besides the weight, prepared once per call by the calling thread.
struct Activations {
  const Int8Activations* int8 = nullptr;  // int8 weight on AVX2
  const float* paired = nullptr;          // bf16 weight, one row of activations, AVX2: x reordered in pairs
  const uint16_t* bf16 = nullptr;         // bf16 weight, one row of activations given as bf16, AVX-512 BF16
  // compact bf16 weight, one row of activations, in its decoder's order: as bf16 for AVX-512 BF16, else fp32
  const uint16_t* compact_bf16 = nullptr;
  const float* compact_floats = nullptr;
};

bool one_bf16_row(const GemvProblem& p) { return p.weight.type == GemvWeightType::BF16 && p.m == 1; }
// Short bf16 rows against one row of activations pair them; long ones go kGemvLongRowGroup at a time instead.
bool paired_products(const GemvProblem& p) { return one_bf16_row(p) && p.weight.k < kGemvLongRow; }

void pair_activations(const float* x, int64_t k, float* out) {
  const int64_t whole = k / kPairBlock * kPairBlock;
  for (int64_t b = 0; b < whole; b += kPairBlock)
    for (int64_t t = 0; t < kPairBlock / 2; ++t) {
      out[b + t] = x[b + 2 * t];
      out[b + kPairBlock / 2 + t] = x[b + 2 * t + 1];
    }
  std::copy(x + whole, x + k, out + whole);
}

// One weight value as int8 with 1 / scale `inverse`: rounded to nearest even, clamped to [-127, 127], NaN as 0.
int8_t quantized(float value, float inverse) {
  const float scaled = std::nearbyint(value * inverse);
  return static_cast<int8_t>(std::clamp(std::isnan(scaled) ? 0.0f : scaled, -127.0f, 127.0f));
}

bool int8_products(const GemvWeight& w) {
  return w.type == GemvWeightType::Int8 && w.k >= kActivationBlock &&
         (w.group >= w.k || w.group % kActivationBlock == 0);
}

// ---- portable ----

constexpr int64_t kPortableChunk = 256;

// Weights [first, first + count) of row j as fp32, scaled.
void widen_row(const GemvWeight& w, int64_t j, int64_t first, int64_t count, float* out) {
  const int64_t offset = j * w.k + first;
  switch (w.type) {
    case GemvWeightType::F32:
      std::copy_n(static_cast<const float*>(w.values) + offset, count, out);
      return;
    case GemvWeightType::F16: {
      const auto* bits = static_cast<const uint16_t*>(w.values) + offset;
      for (int64_t i = 0; i < count; ++i) out[i] = fp16_to_float(bits[i]);
      return;
    }
    case GemvWeightType::BF16: {
      const auto* bits = static_cast<const uint16_t*>(w.values) + offset;
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_bits_to_float(bits[i]);
      return;
    }
    case GemvWeightType::Int8: {
      const auto* values = static_cast<const int8_t*>(w.values) + offset;
      const float* scales = w.scales + j * w.groups();
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(values[i]) * scales[(first + i) / w.group];
      return;
    }
    case GemvWeightType::CompactBF16:
      break;
  }
  fail("gemv: compact bf16 rows are decoded before the portable product");
}

void portable_columns(const GemvProblem& p, int64_t begin, int64_t end) {
  float row[kPortableChunk];
  float sums[kGemvMaxRows];
  for (int64_t j = begin; j < end; ++j) {
    std::fill_n(sums, p.m, 0.0f);
    for (int64_t first = 0; first < p.weight.k; first += kPortableChunk) {
      const int64_t count = std::min(kPortableChunk, p.weight.k - first);
      widen_row(p.weight, j, first, count, row);
      for (int64_t i = 0; i < p.m; ++i) {
        const float* x = p.x + i * p.ldx + first;
        float sum = 0.0f;
        for (int64_t t = 0; t < count; ++t) sum += x[t] * row[t];
        sums[i] += sum;
      }
    }
    for (int64_t i = 0; i < p.m; ++i) store_result(p, i, j, sums[i]);
  }
}

// ---- AVX2 + FMA (+ F16C) ----

#ifdef NPUSIM_GEMV_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define NPUSIM_GEMV_INLINE inline __attribute__((always_inline))

struct F32Loader {
  using T = float;
  static NPUSIM_GEMV_INLINE __m256 load(const float* p) { return _mm256_loadu_ps(p); }
};
struct BF16Loader {
  using T = uint16_t;
  // bf16 is the upper half of an fp32.
  static NPUSIM_GEMV_INLINE __m256 load(const uint16_t* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
};
struct F16Loader {
  using T = uint16_t;
  static NPUSIM_GEMV_INLINE __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct I8Loader {
  using T = int8_t;
  static NPUSIM_GEMV_INLINE __m256 load(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

// Far enough ahead to cover the memory latency at full bandwidth, near enough to stay in L1.
constexpr int64_t kPrefetchBytes = 1024;

// acc[m][r] += x[m, i..i+8) * W[r, i..i+8) (weights times their group scale when Grouped).
template <class L, int M, int R, bool Grouped>
NPUSIM_GEMV_INLINE void fma_step(const typename L::T* const (&rows)[R], int64_t i, const float* x, int64_t ldx,
                                 const __m256 (&scale)[R], __m256 (&acc)[M][R]) {
  __m256 xs[M];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) xs[m] = _mm256_loadu_ps(x + m * ldx + i);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m256 w = L::load(rows[r] + i);
    if constexpr (Grouped) w = _mm256_mul_ps(w, scale[r]);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) acc[m][r] = _mm256_fmadd_ps(xs[m], w, acc[m][r]);
  }
}

// acc over [begin, end), a span of whole vectors; the main loop reads one cache line of every row per iteration
// and prefetches ahead.
template <class L, int M, int R, bool Grouped>
NPUSIM_GEMV_INLINE void dot_span(const typename L::T* const (&rows)[R], int64_t begin, int64_t end, const float* x,
                                 int64_t ldx, const __m256 (&scale)[R], __m256 (&acc)[M][R]) {
  constexpr int64_t kLine = 64 / sizeof(typename L::T);  // elements per cache line
  constexpr int64_t kAhead = kPrefetchBytes / sizeof(typename L::T);
  int64_t i = begin;
  for (; i + kLine <= end; i += kLine) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + i + kAhead), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int64_t v = 0; v < kLine; v += 8) fma_step<L, M, R, Grouped>(rows, i + v, x, ldx, scale, acc);
  }
  for (; i + 8 <= end; i += 8) fma_step<L, M, R, Grouped>(rows, i, x, ldx, scale, acc);
}

float widen_one(const float* p) { return *p; }
float widen_one(const int8_t* p) { return static_cast<float>(*p); }

template <class L>
float widen_scalar(const typename L::T* p) {
  if constexpr (std::is_same_v<L, BF16Loader>)
    return bf16_bits_to_float(*p);
  else if constexpr (std::is_same_v<L, F16Loader>)
    return fp16_to_float(*p);
  else
    return widen_one(p);
}

// Output columns j0 .. j0 + R of every row.
template <class L, Scaling S, int M, int R>
void avx2_block(const GemvProblem& p, int64_t j0) {
  const GemvWeight& w = p.weight;
  const int64_t k = w.k, whole = k / 8 * 8, groups = w.groups();
  const typename L::T* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const typename L::T*>(w.values) + (j0 + r) * k;
  __m256 acc[M][R];
  __m256 scale[R];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  if constexpr (S == Scaling::PerGroup) {
    for (int64_t g = 0, first = 0; first < whole; ++g, first += w.group) {
      for (int r = 0; r < R; ++r) scale[r] = _mm256_set1_ps(w.scales[(j0 + r) * groups + g]);
      dot_span<L, M, R, true>(rows, first, std::min(first + w.group, whole), p.x, p.ldx, scale, acc);
    }
  } else {
    dot_span<L, M, R, false>(rows, 0, whole, p.x, p.ldx, scale, acc);
  }
  for (int m = 0; m < M; ++m) {
    const float* x = p.x + m * p.ldx;
    for (int r = 0; r < R; ++r) {
      float sum = horizontal_sum(acc[m][r]);
      for (int64_t i = whole; i < k; ++i) {
        float value = widen_scalar<L>(rows[r] + i);
        if constexpr (S == Scaling::PerGroup) value *= w.scales[(j0 + r) * groups + i / w.group];
        sum += x[i] * value;
      }
      if constexpr (S == Scaling::PerRow) sum *= w.scales[(j0 + r) * groups];
      store_result(p, m, j0 + r, sum);
    }
  }
}

// One activation row against one weight row at a time: a single memory stream per thread, four accumulators to
// hide the FMA latency.
template <class L>
void avx2_single_row(const GemvProblem& p, int64_t j) {
  const int64_t k = p.weight.k, whole = k / 8 * 8;
  const typename L::T* row = static_cast<const typename L::T*>(p.weight.values) + j * k;
  constexpr int64_t kAhead = kPrefetchBytes / sizeof(typename L::T);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= whole; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row + i + kAhead), _MM_HINT_T0);
    if constexpr (sizeof(typename L::T) == 4)
      _mm_prefetch(reinterpret_cast<const char*>(row + i + kAhead + 16), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u)
      acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(p.x + i + 8 * u), L::load(row + i + 8 * u), acc[u]);
  }
  for (; i < whole; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(p.x + i), L::load(row + i), acc[0]);
  float sum = horizontal_sum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < k; ++i) sum += p.x[i] * widen_scalar<L>(row + i);
  store_result(p, 0, j, sum);
}

NPUSIM_GEMV_INLINE __m256 even_of(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
NPUSIM_GEMV_INLINE __m256 odd_of(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// A bf16 weight row against activations reordered by pair_activations; see kPairBlock.
void avx2_bf16_paired_row(const GemvProblem& p, const float* x, int64_t j) {
  const int64_t k = p.weight.k, whole = k / kPairBlock * kPairBlock;
  const uint16_t* row = static_cast<const uint16_t*>(p.weight.values) + j * k;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 2 * kPairBlock <= whole; i += 2 * kPairBlock) {
    const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i));
    const __m256i second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i + kPairBlock));
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), even_of(first), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), odd_of(first), acc[1]);
    acc[2] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), even_of(second), acc[2]);
    acc[3] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), odd_of(second), acc[3]);
  }
  if (i < whole) {
    const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i));
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), even_of(last), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), odd_of(last), acc[1]);
    i += kPairBlock;
  }
  float sum = horizontal_sum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < k; ++i) sum += x[i] * bf16_bits_to_float(row[i]);
  store_result(p, 0, j, sum);
}

template <class L, Scaling S, int M>
void avx2_rows(const GemvProblem& p, int64_t begin, int64_t end) {
  if constexpr (M == 1 && S == Scaling::None) {
    int64_t j = begin;
    if (p.weight.k >= kGemvLongRow)
      for (; j + kGemvLongRowGroup <= end; j += kGemvLongRowGroup) avx2_block<L, S, 1, kGemvLongRowGroup>(p, j);
    for (; j < end; ++j) avx2_single_row<L>(p, j);
    return;
  }
  // Accumulators for M x R outputs stay in the 16 vector registers.
  constexpr int R = M <= 3 ? 4 : 2;
  int64_t j = begin;
  for (; j + R <= end; j += R) avx2_block<L, S, M, R>(p, j);
  for (; j < end; ++j) avx2_block<L, S, M, 1>(p, j);
}

template <class L, Scaling S>
void avx2_typed(const GemvProblem& p, int64_t begin, int64_t end) {
  switch (p.m) {
    case 1:
      return avx2_rows<L, S, 1>(p, begin, end);
    case 2:
      return avx2_rows<L, S, 2>(p, begin, end);
    case 3:
      return avx2_rows<L, S, 3>(p, begin, end);
    case 4:
      return avx2_rows<L, S, 4>(p, begin, end);
    case 5:
      return avx2_rows<L, S, 5>(p, begin, end);
    case 6:
      return avx2_rows<L, S, 6>(p, begin, end);
    default:
      return avx2_rows<L, S, 7>(p, begin, end);
  }
}

// x rows to int8 blocks: scale = max |x| / 127 per block, values rounded to nearest.
void avx2_quantize_activations(const GemvProblem& p, ActivationScratch& scratch, Int8Activations& out) {
  const int64_t k = p.weight.k;
  out.blocks = (k + kActivationBlock - 1) / kActivationBlock;
  out.stride = out.blocks * kActivationBlock;
  scratch.values.resize(static_cast<size_t>(p.m * out.stride));
  scratch.scales.resize(static_cast<size_t>(p.m * out.blocks));
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < p.m; ++i) {
    const float* x = p.x + i * p.ldx;
    int8_t* q = scratch.values.data() + i * out.stride;
    float* scales = scratch.scales.data() + i * out.blocks;
    const int64_t whole = k / kActivationBlock;
    for (int64_t b = 0; b < whole; ++b) {
      const float* block = x + b * kActivationBlock;
      __m256 v[4];
      __m256 largest = _mm256_setzero_ps();
      for (int t = 0; t < 4; ++t) {
        v[t] = _mm256_loadu_ps(block + 8 * t);
        largest = _mm256_max_ps(largest, _mm256_andnot_ps(sign, v[t]));
      }
      __m128 half = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
      half = _mm_max_ps(half, _mm_movehl_ps(half, half));
      half = _mm_max_ss(half, _mm_movehdup_ps(half));
      const float top = _mm_cvtss_f32(half);
      scales[b] = top / 127.0f;
      const __m256 inverse = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
      __m256i n[4];
      for (int t = 0; t < 4; ++t) n[t] = _mm256_cvtps_epi32(_mm256_mul_ps(v[t], inverse));
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kActivationBlock),
                          _mm256_permutevar8x32_epi32(packed, order));
    }
    if (whole < out.blocks) {
      const int64_t first = whole * kActivationBlock;
      float top = 0.0f;
      for (int64_t t = first; t < k; ++t) top = std::max(top, std::fabs(x[t]));
      scales[whole] = top / 127.0f;
      const float inverse = top > 0.0f ? 127.0f / top : 0.0f;
      for (int64_t t = first; t < out.stride; ++t)
        q[t] = t < k ? static_cast<int8_t>(std::nearbyint(x[t] * inverse)) : int8_t{0};
    }
  }
  out.values = scratch.values.data();
  out.scales = scratch.scales.data();
}

// Sum over one block of 32 products of int8 values, as 8 int32 lanes: |w| times x with w's sign, in pairs to int16
// (at most 2 * 127 * 127, no saturation), then to int32.
NPUSIM_GEMV_INLINE __m256 block_dot(__m256i w_abs, __m256i w, __m256i x) {
  const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

template <int M, int R, bool Grouped>
void avx2_int8_block(const GemvProblem& p, const Int8Activations& a, int64_t j0) {
  const GemvWeight& w = p.weight;
  const int64_t k = w.k, whole = k / kActivationBlock, groups = w.groups();
  constexpr int64_t kAhead = kPrefetchBytes;
  const int8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const int8_t*>(w.values) + (j0 + r) * k;
  __m256 acc[M][R];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < whole; ++b) {
    const int64_t at = b * kActivationBlock;
    if ((b & 1) == 0)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + at + kAhead), _MM_HINT_T0);
    __m256i xs[M];
    __m256 dx[M];
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      xs[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.values + m * a.stride + at));
      dx[m] = _mm256_broadcast_ss(a.scales + m * a.blocks + b);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + at));
      const __m256i w_abs = _mm256_abs_epi8(wv);
      __m256 dw;
      if constexpr (Grouped) dw = _mm256_broadcast_ss(w.scales + (j0 + r) * groups + at / w.group);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const __m256 scale = Grouped ? _mm256_mul_ps(dx[m], dw) : dx[m];
        acc[m][r] = _mm256_fmadd_ps(block_dot(w_abs, wv, xs[m]), scale, acc[m][r]);
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    const int8_t* xq = a.values + m * a.stride;
    for (int r = 0; r < R; ++r) {
      float sum = horizontal_sum(acc[m][r]);
      if (whole < a.blocks) {
        int32_t tail = 0;
        for (int64_t i = whole * kActivationBlock; i < k; ++i) tail += int32_t{rows[r][i]} * int32_t{xq[i]};
        float scale = a.scales[m * a.blocks + whole];
        if constexpr (Grouped) scale *= w.scales[(j0 + r) * groups + whole * kActivationBlock / w.group];
        sum += static_cast<float>(tail) * scale;
      }
      if constexpr (!Grouped) sum *= w.scales[(j0 + r) * groups];
      store_result(p, m, j0 + r, sum);
    }
  }
}

// One activation row against one int8 weight row: a single memory stream, even and odd blocks in two accumulators.
// No software prefetch, as in vnni_int8_row (7-15% faster without on one large weight, one and two threads).
template <bool Grouped>
void avx2_int8_single_row(const GemvProblem& p, const Int8Activations& a, int64_t j) {
  const GemvWeight& w = p.weight;
  const int64_t k = w.k, whole = k / kActivationBlock, groups = w.groups();
  const int8_t* row = static_cast<const int8_t*>(w.values) + j * k;
  const float* row_scales = w.scales + j * groups;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t b = 0;
  const auto block = [&](int64_t index, __m256& sum) {
    const int64_t at = index * kActivationBlock;
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + at));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.values + at));
    __m256 scale = _mm256_broadcast_ss(a.scales + index);
    if constexpr (Grouped) scale = _mm256_mul_ps(scale, _mm256_broadcast_ss(row_scales + at / w.group));
    sum = _mm256_fmadd_ps(block_dot(_mm256_abs_epi8(wv), wv, xv), scale, sum);
  };
  for (; b + 2 <= whole; b += 2) {
    block(b, acc[0]);
    block(b + 1, acc[1]);
  }
  if (b < whole) block(b, acc[0]);
  float sum = horizontal_sum(_mm256_add_ps(acc[0], acc[1]));
  if (whole < a.blocks) {
    int32_t tail = 0;
    for (int64_t i = whole * kActivationBlock; i < k; ++i) tail += int32_t{row[i]} * int32_t{a.values[i]};
    float scale = a.scales[whole];
    if constexpr (Grouped) scale *= row_scales[whole * kActivationBlock / w.group];
    sum += static_cast<float>(tail) * scale;
  }
  if constexpr (!Grouped) sum *= row_scales[0];
  store_result(p, 0, j, sum);
}

template <bool Grouped, int M>
void avx2_int8_rows(const GemvProblem& p, const Int8Activations& a, int64_t begin, int64_t end) {
  if constexpr (M == 1) {
    for (int64_t j = begin; j < end; ++j) avx2_int8_single_row<Grouped>(p, a, j);
    return;
  }
  constexpr int R = M <= 3 ? 4 : 2;
  int64_t j = begin;
  for (; j + R <= end; j += R) avx2_int8_block<M, R, Grouped>(p, a, j);
  for (; j < end; ++j) avx2_int8_block<M, 1, Grouped>(p, a, j);
}

template <bool Grouped>
void avx2_int8_typed(const GemvProblem& p, const Int8Activations& a, int64_t begin, int64_t end) {
  switch (p.m) {
    case 1:
      return avx2_int8_rows<Grouped, 1>(p, a, begin, end);
    case 2:
      return avx2_int8_rows<Grouped, 2>(p, a, begin, end);
    case 3:
      return avx2_int8_rows<Grouped, 3>(p, a, begin, end);
    case 4:
      return avx2_int8_rows<Grouped, 4>(p, a, begin, end);
    case 5:
      return avx2_int8_rows<Grouped, 5>(p, a, begin, end);
    case 6:
      return avx2_int8_rows<Grouped, 6>(p, a, begin, end);
    default:
      return avx2_int8_rows<Grouped, 7>(p, a, begin, end);
  }
}

void avx2_int8_columns(const GemvProblem& p, const Int8Activations& a, int64_t begin, int64_t end) {
  if (p.weight.group >= p.weight.k) return avx2_int8_typed<false>(p, a, begin, end);
  avx2_int8_typed<true>(p, a, begin, end);
}

void avx2_columns(const GemvProblem& p, int64_t begin, int64_t end) {
  switch (p.weight.type) {
    case GemvWeightType::F32:
      return avx2_typed<F32Loader, Scaling::None>(p, begin, end);
    case GemvWeightType::F16:
      return avx2_typed<F16Loader, Scaling::None>(p, begin, end);
    case GemvWeightType::BF16:
      return avx2_typed<BF16Loader, Scaling::None>(p, begin, end);
    case GemvWeightType::Int8:
      if (scaling_of(p.weight) == Scaling::PerRow) return avx2_typed<I8Loader, Scaling::PerRow>(p, begin, end);
      return avx2_typed<I8Loader, Scaling::PerGroup>(p, begin, end);
    case GemvWeightType::CompactBF16:
      break;
  }
  fail("gemv: compact bf16 rows are decoded before the AVX2 product");
}

// The largest |value| of a group, NaN values skipped (as std::max skips them).
float avx2_largest_magnitude(const float* values, int64_t count) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 largest = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)  // max_ps returns its second operand when the first is NaN
    largest = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(values + i)), largest);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  float top = 0.0f;
  for (float lane : lanes) top = std::max(top, lane);
  for (; i < count; ++i) top = std::max(top, std::fabs(values[i]));
  return top;
}

// out[i] = values[i] * inverse rounded to nearest even (as std::nearbyint), clamped to [-127, 127], NaN as 0.
void avx2_quantize_values(const float* values, int64_t count, float inverse, int8_t* out) {
  const __m256 scale = _mm256_set1_ps(inverse), low = _mm256_set1_ps(-127.0f), high = _mm256_set1_ps(127.0f);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 scaled = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(values + i), scale),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 number = _mm256_and_ps(_mm256_cmp_ps(scaled, scaled, _CMP_ORD_Q), scaled);  // NaN -> 0
    const __m256i whole = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(number, low), high));
    const __m128i narrow = _mm_packs_epi32(_mm256_castsi256_si128(whole), _mm256_extracti128_si256(whole, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packs_epi16(narrow, narrow));
  }
  for (; i < count; ++i) out[i] = quantized(values[i], inverse);
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
// GCC 12's _mm512_reduce_add_ps starts from _mm256_undefined_pd(), which -W(maybe-)uninitialized reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// R bf16 weight rows against bf16 activations: each vdpbf16ps multiplies 32 pairs exactly and adds them in fp32;
// every activation load serves the R rows.
template <int R>
void avx512_bf16_rows(const GemvProblem& p, int64_t j) {
  const int64_t k = p.weight.k;
  const uint16_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const uint16_t*>(p.weight.values) + (j + r) * k;
  const uint16_t* x = p.x_bf16;
  constexpr int U = R == 1 ? 2 : 1;
  __m512 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 * U <= k; i += 32 * U) {
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u) {
      const auto xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i + 32 * u));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        acc[r][u] =
            _mm512_dpbf16_ps(acc[r][u], xv, reinterpret_cast<__m512bh>(_mm512_loadu_si512(rows[r] + i + 32 * u)));
    }
  }
  for (; i < k; i += 32) {
    const __mmask32 live = static_cast<__mmask32>(k - i >= 32 ? ~0u : (1u << (k - i)) - 1);
    const auto xv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(live, x + i));
    for (int r = 0; r < R; ++r)
      acc[r][0] =
          _mm512_dpbf16_ps(acc[r][0], xv, reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(live, rows[r] + i)));
  }
  for (int r = 0; r < R; ++r) {
    __m512 total = acc[r][0];
    for (int u = 1; u < U; ++u) total = _mm512_add_ps(total, acc[r][u]);
    store_result(p, 0, j + r, _mm512_reduce_add_ps(total));
  }
}

// Short rows go one at a time (one memory stream; several short streams measured slower); long rows kGemvLongRowGroup
// at a time (k = 8960, one Zen 4 thread: four rows at a time 11-20% faster than one, eight 5% faster than four).
void avx512_bf16_columns(const GemvProblem& p, int64_t begin, int64_t end) {
  int64_t j = begin;
  if (p.weight.k >= kGemvLongRow)
    for (; j + kGemvLongRowGroup <= end; j += kGemvLongRowGroup) avx512_bf16_rows<kGemvLongRowGroup>(p, j);
  for (; j < end; ++j) avx512_bf16_rows<1>(p, j);
}

// values[i] * scale as bf16 (rounded to nearest even, as float_to_bf16 rounds finite values) for i < count.
void avx512_scaled_bf16(const int8_t* values, int64_t count, float scale, uint16_t* out) {
  const __m512 factor = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 live = static_cast<__mmask16>(count - i >= 16 ? 0xFFFF : (1u << (count - i)) - 1);
    const __m512 wide = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(live, values + i)));
    const __m256bh narrow = _mm512_cvtneps_pbh(_mm512_mul_ps(wide, factor));
    _mm256_mask_storeu_epi16(out + i, live, reinterpret_cast<const __m256i&>(narrow));
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")
// As above: _mm512_reduce_add_ps.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

bool vnni_products(const GemvProblem& p) { return p.m == 1 && cpu_features().avx512vnni && int8_products(p.weight); }

// The offset terms of Int8Activations for the scale groups of `w`.
void vnni_prepare(const GemvWeight& w, ActivationScratch& scratch, Int8Activations& a) {
  const int64_t blocks_per_group = w.group >= w.k ? a.blocks : w.group / kActivationBlock;
  scratch.offset_terms.assign(static_cast<size_t>((a.blocks + blocks_per_group - 1) / blocks_per_group), 0.0f);
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < a.blocks; ++b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.values + b * kActivationBlock));
    const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, x);
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sums);
    int32_t total = 0;
    for (int32_t lane : lanes) total += lane;
    scratch.offset_terms[static_cast<size_t>(b / blocks_per_group)] += 128.0f * a.scales[b] * static_cast<float>(total);
  }
  a.offset_terms = scratch.offset_terms.data();
}

// One int8 weight row against one row of int8 activations with vpdpbusd, which multiplies unsigned by signed bytes:
// the weights are offset to unsigned (w + 128, a flip of the sign bit), and what that adds is taken off the row's
// sum once (the offset terms); each line's int32 sums are scaled and added in fp32: the line's two block scales
// spread over the lanes where vpdpbusd leaves each block's sums (0-7, 8-15). The scales are widened in registers
// rather than read as 64-byte vectors laid out per line: those doubled what the loop reads besides the weights, and
// rows of 8960 values then no longer stay in L1 with their activations (one thread: 24 -> 30 GB/s on k = 8960,
// 26 -> 29 on k = 1536). No software prefetch: one sequential stream is what the hardware prefetcher follows best
// (a quarter faster on one thread without it).
template <bool Grouped>
void vnni_int8_row(const GemvProblem& p, const Int8Activations& a, int64_t j) {
  const GemvWeight& w = p.weight;
  const int64_t k = w.k, lines = k / (2 * kActivationBlock), groups = w.groups();
  const int8_t* row = static_cast<const int8_t*>(w.values) + j * k;
  const float* row_scales = w.scales + j * groups;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const auto line_sum = [&](int64_t line, __m512 acc) {
    const int64_t at = line * 2 * kActivationBlock;
    const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(row + at), flip);
    const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(a.values + at));
    const __m128 pair = _mm_castsi128_ps(  // the scales of blocks 2 line and 2 line + 1
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.scales + 2 * line)));
    __m512 scale = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(pair));
    if constexpr (Grouped) {  // the two blocks may lie in different groups
      const __m128 both = _mm_setr_ps(row_scales[at / w.group], row_scales[(at + kActivationBlock) / w.group], 0, 0);
      scale = _mm512_mul_ps(scale, _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(both)));
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc);
  };
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t line = 0;
  for (; line + 2 <= lines; line += 2) {
    acc[0] = line_sum(line, acc[0]);
    acc[1] = line_sum(line + 1, acc[1]);
  }
  if (line < lines) acc[0] = line_sum(line++, acc[0]);
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
  for (int64_t b = 2 * line; b < a.blocks; ++b) {  // an odd last block and the part block, offset like the others
    int32_t dot = 0;
    for (int64_t i = b * kActivationBlock; i < std::min(k, (b + 1) * kActivationBlock); ++i)
      dot += (int32_t{row[i]} + 128) * int32_t{a.values[i]};
    float scale = a.scales[b];
    if constexpr (Grouped) scale *= row_scales[b * kActivationBlock / w.group];
    sum += static_cast<float>(dot) * scale;
  }
  if constexpr (Grouped) {
    for (int64_t g = 0; g < groups; ++g) sum -= row_scales[g] * a.offset_terms[g];
  } else {
    sum = (sum - a.offset_terms[0]) * row_scales[0];
  }
  store_result(p, 0, j, sum);
}

void vnni_int8_columns(const GemvProblem& p, const Int8Activations& a, int64_t begin, int64_t end) {
  if (p.weight.group >= p.weight.k) {
    for (int64_t j = begin; j < end; ++j) vnni_int8_row<false>(p, a, j);
  } else {
    for (int64_t j = begin; j < end; ++j) vnni_int8_row<true>(p, a, j);
  }
}

#pragma GCC diagnostic pop
#undef NPUSIM_GEMV_INLINE
#pragma GCC pop_options
#endif

GemvIsa detected_isa() {
#ifdef NPUSIM_GEMV_X86
  const CpuFeatures& cpu = cpu_features();
  if (!cpu.avx2_fma_f16c()) return GemvIsa::Portable;
  return cpu.avx512() && (cpu.avx512bf16 || cpu.avx512vnni) ? GemvIsa::Avx512 : GemvIsa::Avx2;
#else
  return GemvIsa::Portable;
#endif
}

std::atomic<int> forced_isa{-1};

// Problems below this many multiply-adds run on the calling thread: waking the pool costs more.
constexpr int64_t kParallelWork = int64_t{1} << 15;
// Weight bytes per piece of work a thread takes at a time.
constexpr int64_t kChunkBytes = int64_t{1} << 17;

void check_problem(const GemvProblem& p) {
  if (p.m < 1 || p.m > kGemvMaxRows)
    fail("gemv: " + std::to_string(p.m) + " rows of activations; the kernel takes 1 to " +
         std::to_string(kGemvMaxRows));
  const GemvWeight& w = p.weight;
  if (w.type == GemvWeightType::Int8 && w.k > 0 && (w.group < 1 || (w.group < w.k && w.group % 8 != 0)))
    fail("gemv: int8 scale groups of " + std::to_string(w.group) + " values; expected the row length (" +
         std::to_string(w.k) + ") or a multiple of 8");
  if (w.type == GemvWeightType::CompactBF16 && (!w.compact || w.compact->n != w.n || w.compact->k != w.k))
    fail("gemv: a compact bf16 weight without its codes, or of another shape");
}

}  // namespace

GemvIsa gemv_isa() {
  const int forced = forced_isa.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<GemvIsa>(forced) : detected_isa();
}

void force_gemv_isa(std::optional<GemvIsa> isa) {
  if (isa && *isa > detected_isa())
    fail(std::string("gemv: this CPU lacks ") + (*isa == GemvIsa::Avx2 ? "AVX2, FMA or F16C" : "AVX-512 BF16 or VNNI") +
         ", so its kernels cannot be forced");
  forced_isa.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
}

namespace {

// Scratch of the thread that prepares activations; grows, never shrinks, so steady-state calls allocate nothing.
struct PreparedScratch {
  ActivationScratch int8;
  LineAlignedArray<float> paired;
  Int8Activations quantized;
  LineAlignedArray<uint16_t> ordered_bf16;
};

// Prepares what the AVX2 kernels read besides the weight (nothing for the portable ones); the result lives in the
// calling thread's scratch until its next call.
Activations prepare_activations([[maybe_unused]] const GemvProblem& p) {
  Activations prepared;
#ifdef NPUSIM_GEMV_X86
  const GemvIsa isa = gemv_isa();
  if (isa == GemvIsa::Portable) return prepared;
  static thread_local PreparedScratch scratch;
  if (p.weight.type == GemvWeightType::CompactBF16) {
    if (p.m != 1) return prepared;
    const int64_t padded = p.weight.compact->blocks() * kCompactBlock;
    if (compact_bf16_pairs() && p.x_bf16) {
      scratch.ordered_bf16.resize(static_cast<size_t>(padded));
      order_for_avx512(p.x_bf16, p.weight.k, scratch.ordered_bf16.data());
      prepared.compact_bf16 = scratch.ordered_bf16.data();
    } else {
      scratch.paired.resize(static_cast<size_t>(padded));
      order_for_avx2(p.x, p.weight.k, scratch.paired.data());
      prepared.compact_floats = scratch.paired.data();
    }
  } else if (isa == GemvIsa::Avx512 && cpu_features().avx512bf16 && one_bf16_row(p) && p.x_bf16) {
    prepared.bf16 = p.x_bf16;
  } else if (int8_products(p.weight)) {
    avx2_quantize_activations(p, scratch.int8, scratch.quantized);
    scratch.quantized.offset_terms = nullptr;
    if (isa == GemvIsa::Avx512 && vnni_products(p)) vnni_prepare(p.weight, scratch.int8, scratch.quantized);
    prepared.int8 = &scratch.quantized;
  } else if (paired_products(p)) {
    scratch.paired.resize(static_cast<size_t>(p.weight.k));
    pair_activations(p.x, p.weight.k, scratch.paired.data());
    prepared.paired = scratch.paired.data();
  }
#endif
  return prepared;
}

void run_columns(const GemvProblem& p, const Activations& activations, int64_t begin, int64_t end);

// Columns of a compact weight: long rows kGemvLongRowGroup at a time where they share a block stride (an interleaved
// group, or rows in order), the others one at a time; `dots(j, sums)` computes rows j .. j + R.
template <class Dots>
void compact_columns(const GemvProblem& p, int64_t begin, int64_t end, const Dots& dots) {
  const CompactBf16Weight& compact = *p.weight.compact;
  constexpr int group = kGemvLongRowGroup;
  int64_t j = begin;
  if (compact.k >= kGemvLongRow)
    for (; j + group <= end && compact.block_stride(j) == compact.block_stride(j + group - 1); j += group) {
      float sums[group];
      dots(j, sums);
      for (int r = 0; r < group; ++r) store_result(p, 0, j + r, sums[r]);
    }
  for (; j < end; ++j) {
    float sum[1];
    dots(j, sum);
    store_result(p, 0, j, sum[0]);
  }
}

// Rows of a compact weight decoded a few at a time into bf16 scratch, each few multiplied as a bf16 weight.
void decoded_compact_columns(const GemvProblem& p, int64_t begin, int64_t end) {
  constexpr int64_t kRows = 8;
  static thread_local std::vector<uint16_t> decoded;
  const CompactBf16Weight& compact = *p.weight.compact;
  decoded.resize(static_cast<size_t>(kRows * p.weight.k));
  for (int64_t j = begin; j < end; j += kRows) {
    const int64_t rows = std::min(kRows, end - j);
    for (int64_t r = 0; r < rows; ++r)
      compact.decode_row(j + r, Elem::BF16, reinterpret_cast<std::byte*>(decoded.data() + r * p.weight.k));
    GemvProblem part = p;
    part.weight = GemvWeight{.type = GemvWeightType::BF16, .values = decoded.data(), .n = rows, .k = p.weight.k};
    part.y = p.y + static_cast<size_t>(j) * elem_size(p.y_elem);
    if (p.bias && p.bias_count != 1) {
      part.bias = p.bias + static_cast<size_t>(j) * elem_size(p.bias_elem);
      part.bias_count = rows;
    }
    run_columns(part, Activations{}, 0, rows);
  }
}

void run_columns(const GemvProblem& p, const Activations& activations, int64_t begin, int64_t end) {
  if (p.weight.type == GemvWeightType::CompactBF16) {
#ifdef NPUSIM_GEMV_X86
    const CompactBf16Weight& compact = *p.weight.compact;
    if (activations.compact_bf16)
      return compact_columns(p, begin, end, [&]<int R>(int64_t j, float(&sums)[R]) {
        compact_dots_avx512<R>(compact, j, activations.compact_bf16, p.x, sums);
      });
    if (activations.compact_floats) {
      // Short rows eight at a time, one after the other (see compact_dots_avx2_in_turn).
      int64_t j = begin;
      if (compact.k < kGemvLongRow)
        for (; j + kCompactRowsInTurn <= end; j += kCompactRowsInTurn) {
          float sums[kCompactRowsInTurn];
          compact_dots_avx2_in_turn(compact, j, activations.compact_floats, p.x, sums);
          for (int r = 0; r < kCompactRowsInTurn; ++r) store_result(p, 0, j + r, sums[r]);
        }
      return compact_columns(p, j, end, [&]<int R>(int64_t row, float(&sums)[R]) {
        compact_dots_avx2<R>(compact, row, activations.compact_floats, p.x, sums);
      });
    }
#endif
    return decoded_compact_columns(p, begin, end);
  }
#ifdef NPUSIM_GEMV_X86
  if (activations.int8) {
    if (activations.int8->offset_terms) return vnni_int8_columns(p, *activations.int8, begin, end);
    return avx2_int8_columns(p, *activations.int8, begin, end);
  }
  if (activations.bf16) return avx512_bf16_columns(p, begin, end);
  if (activations.paired) {
    for (int64_t j = begin; j < end; ++j) avx2_bf16_paired_row(p, activations.paired, j);
    return;
  }
  if (gemv_isa() != GemvIsa::Portable) return avx2_columns(p, begin, end);
#endif
  portable_columns(p, begin, end);
}

}  // namespace

void gemv_columns(const GemvProblem& problem, int64_t begin, int64_t end) {
  check_problem(problem);
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, problem.weight.n);
  if (begin >= end) return;
  run_columns(problem, prepare_activations(problem), begin, end);
}

void gemv(const GemvProblem& problem, ThreadPool& pool) {
  check_problem(problem);
  const int64_t n = problem.weight.n;
  if (n <= 0) return;
  const Activations activations = prepare_activations(problem);
  if (n * problem.weight.k * problem.m < kParallelWork || pool.size() == 1) {
    run_columns(problem, activations, 0, n);
    return;
  }
  // Chunks of whole 8-column groups, so that every block of rows stays whole, each thread's own share of them
  // claimed in order first (8% more GB/s on two threads than chunks taken in turn from one counter).
  const GemvWeightType type = problem.weight.type;
  const int64_t bytes_per_column = type == GemvWeightType::F32           ? problem.weight.k * 4
                                   : type == GemvWeightType::Int8        ? problem.weight.k
                                   : type == GemvWeightType::CompactBF16 ? problem.weight.k * 3 / 2
                                                                         : problem.weight.k * 2;
  const int64_t chunk = std::max<int64_t>(8, kChunkBytes / std::max<int64_t>(bytes_per_column, 1) / 8 * 8);
  const int64_t chunks = (n + chunk - 1) / chunk;
  struct NoState {};
  pool.parallel_claim_units<NoState>(chunks, [&](NoState&, int64_t c, int) {
    run_columns(problem, activations, c * chunk, std::min(n, (c + 1) * chunk));
  });
}

GemvWeight QuantizedWeight::view() const {
  return {.type = GemvWeightType::Int8,
          .values = values.data(),
          .n = n,
          .k = k,
          .scales = reinterpret_cast<const float*>(scales.data()),
          .group = group};
}

void QuantizedWeight::dequantize_row(int64_t j, Elem elem, std::byte* out) const {
  if (elem != Elem::F32 && elem != Elem::BF16) fail("int8 weight: rows widen to float32 or bfloat16 only");
  const auto* row = reinterpret_cast<const int8_t*>(values.data()) + j * k;
  const int64_t groups = (k + group - 1) / group;
  const float* row_scales = reinterpret_cast<const float*>(scales.data()) + j * groups;
  auto* floats = reinterpret_cast<float*>(out);
  auto* halves = reinterpret_cast<uint16_t*>(out);
#ifdef NPUSIM_GEMV_X86
  const bool avx512_bf16 = cpu_features().avx512() && cpu_features().avx512bf16;
#endif
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = row_scales[g];
    const int64_t end = std::min(k, (g + 1) * group);
    if (elem == Elem::F32) {
      for (int64_t i = g * group; i < end; ++i) floats[i] = static_cast<float>(row[i]) * scale;
      continue;
    }
#ifdef NPUSIM_GEMV_X86
    if (avx512_bf16) {
      avx512_scaled_bf16(row + g * group, end - g * group, scale, halves + g * group);
      continue;
    }
#endif
    for (int64_t i = g * group; i < end; ++i) halves[i] = float_to_bf16(static_cast<float>(row[i]) * scale);
  }
}

QuantizedWeight quantize_int8(const std::byte* weight, Elem elem, int64_t n, int64_t k, int64_t group,
                              ThreadPool* pool) {
  if (!is_float_elem(elem)) fail("int8 quantization needs a float weight");
  if (n < 0 || k < 0) fail("int8 quantization: negative weight dims");
  if (group <= 0 || group > k) group = std::max<int64_t>(k, 1);
  if (group < k && group % 8 != 0)
    fail("int8 quantization: groups of " + std::to_string(group) + " values; expected a multiple of 8");
  QuantizedWeight q;
  q.n = n;
  q.k = k;
  q.group = group;
  const int64_t groups = (k + group - 1) / group;
  q.values = AlignedBuffer(static_cast<size_t>(n * k), Pages::Huge);  // streamed once per decoded token
  q.scales = AlignedBuffer(static_cast<size_t>(n * groups) * sizeof(float), Pages::Huge);
  auto* values = reinterpret_cast<int8_t*>(q.values.data());
  auto* scales = reinterpret_cast<float*>(q.scales.data());
  const bool avx2 = gemv_isa() != GemvIsa::Portable;
  const auto quantize_rows = [&](int64_t begin, int64_t end, int) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = begin; j < end; ++j) {
      to_float(weight + static_cast<size_t>(j * k) * elem_size(elem), elem, row.data(), k);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t first = g * group, last = std::min(k, first + group);
        const float* in = row.data() + first;
        int8_t* out = values + j * k + first;
        float largest = 0.0f;
#ifdef NPUSIM_GEMV_X86
        if (avx2) largest = avx2_largest_magnitude(in, last - first);
#endif
        if (!avx2)
          for (int64_t i = 0; i < last - first; ++i) largest = std::max(largest, std::fabs(in[i]));
        const float scale = std::isfinite(largest) ? largest / 127.0f : 0.0f;
        const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
        scales[j * groups + g] = scale;
#ifdef NPUSIM_GEMV_X86
        if (avx2) {
          avx2_quantize_values(in, last - first, inverse, out);
          continue;
        }
#endif
        for (int64_t i = 0; i < last - first; ++i) out[i] = quantized(in[i], inverse);
      }
    }
  };
  if (pool)
    pool->parallel_for(n, 16, quantize_rows);
  else
    quantize_rows(0, n, 0);
  return q;
}

}  // namespace npusim::cpu
