// One activation row against rows of a compact bf16 weight (see compact_bf16.h). A block's 96 bytes decode in a
// table lookup and byte interleaves, in the order those leave the values in: vector q of the AVX2 decoder holds the
// values S_q = [0..7, 16..23], [8..15, 24..31], [32..39, 48..55], [40..47, 56..63] of the block (q = 0..3); the
// AVX-512 decoder holds S_0 then S_2 in one vector and S_1 then S_3 in the other. The activations are put in that
// order once per product, so the weights are never reordered.
#include <algorithm>
#include <array>

#include "backends/cpu/compact_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/avx2_sums.h"
#include "backends/cpu/compact_bf16_avx2.h"
#define NPUSIM_COMPACT_X86 1
#endif

namespace npusim::cpu {

namespace {

// Position in its block of lane `lane` (0..15) of the AVX2 decoder's vector q.
constexpr int lane_value(int q, int lane) { return (q / 2) * 32 + (q % 2) * 8 + (lane < 8 ? lane : lane + 8); }

// Where each ordered activation of a block comes from.
using BlockOrder = std::array<uint8_t, kCompactBlock>;

// AVX2: per vector q, the even lanes (widened by a shift) then the odd ones (widened by a mask).
constexpr BlockOrder avx2_order() {
  BlockOrder order{};
  for (int q = 0; q < 4; ++q)
    for (int i = 0; i < 8; ++i) {
      order[16 * q + i] = static_cast<uint8_t>(lane_value(q, 2 * i));
      order[16 * q + 8 + i] = static_cast<uint8_t>(lane_value(q, 2 * i + 1));
    }
  return order;
}

// AVX-512: vector A holds S_0 then S_2, vector B holds S_1 then S_3.
constexpr BlockOrder avx512_order() {
  BlockOrder order{};
  for (int half = 0; half < 2; ++half)
    for (int part = 0; part < 2; ++part)
      for (int lane = 0; lane < 16; ++lane)
        order[32 * half + 16 * part + lane] = static_cast<uint8_t>(lane_value(half + 2 * part, lane));
  return order;
}

template <class T>
void put_in_order(const T* x, int64_t k, const BlockOrder& order, T* out) {
  const int64_t whole = k / kCompactBlock, blocks = (k + kCompactBlock - 1) / kCompactBlock;
  for (int64_t b = 0; b < whole; ++b) {
    const T* in = x + b * kCompactBlock;
    T* to = out + b * kCompactBlock;
    for (int64_t p = 0; p < kCompactBlock; ++p) to[p] = in[order[static_cast<size_t>(p)]];
  }
  for (int64_t b = whole; b < blocks; ++b)
    for (int64_t p = 0; p < kCompactBlock; ++p) {
      const int64_t at = b * kCompactBlock + order[static_cast<size_t>(p)];
      out[b * kCompactBlock + p] = at < k ? x[at] : T{0};
    }
}

// Row j's escapes: what their values differ from what their code 0 decoded to (2^-15 before the row's scale).
float escape_terms(const CompactBf16Weight& w, int64_t j, const float* x, float scale) {
  const float decoded = scale * 0x1p-15f;
  float sum = 0.0f;
  for (int64_t e = w.escape_at[static_cast<size_t>(j)]; e < w.escape_at[static_cast<size_t>(j) + 1]; ++e) {
    const CompactEscape& escape = w.escapes[static_cast<size_t>(e)];
    sum += (escape.value - decoded) * x[escape.column];
  }
  return sum;
}

}  // namespace

void order_for_avx2(const float* x, int64_t k, float* out) {
  static constexpr BlockOrder kOrder = avx2_order();
  put_in_order(x, k, kOrder, out);
}

void order_for_avx512(const uint16_t* x, int64_t k, uint16_t* out) {
  static constexpr BlockOrder kOrder = avx512_order();
  put_in_order(x, k, kOrder, out);
}

#ifdef NPUSIM_COMPACT_X86

#pragma GCC push_options
#pragma GCC target("avx2,fma")

// The AVX2 kernel prefetches for one row, not for a group (30% slower with); the AVX-512 one leaves its streams to
// the hardware (software prefetches measured 8-12% slower for one row there, 5-10% for four rows of 8960 values, on
// one and two threads). Four blocks ahead (384 bytes in a row whose blocks follow each other): a Qwen2.5-1.5B-shaped
// decode step on one Zen 4 thread (AVX2) ran at 10.0-10.9 tokens/s with two to four blocks, 9.0-9.6 with six or
// eight, 5.6-5.9 with none.
constexpr int64_t kPrefetchBlocks = 4;

// Row j's products with x, one sum per lane (the four chains of multiply-adds added up).
inline __m256 compact_row_lanes_avx2(const CompactBf16Weight& w, int64_t j, const float* x_ordered) {
  const uint8_t* codes = w.row_codes(j);
  const int64_t stride = w.block_stride(j);
  const __m256i odd = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const int64_t blocks = w.blocks();
  for (int64_t b = 0; b < blocks; ++b) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + (b + kPrefetchBlocks) * stride), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(codes + (b + kPrefetchBlocks) * stride + 64), _MM_HINT_T0);
    const float* xb = x_ordered + b * kCompactBlock;
    // The block's four vectors decoded at once (10-20% faster than one at a time).
    __m256i words[4];
    for (int q = 0; q < 4; ++q) words[q] = compact_block_words(codes + b * stride, q);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const __m256 x_even = _mm256_loadu_ps(xb + 16 * q), x_odd = _mm256_loadu_ps(xb + 16 * q + 8);
      acc[q & 1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(words[q], 16)), x_even, acc[q & 1]);
      acc[2 + (q & 1)] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(words[q], odd)), x_odd, acc[2 + (q & 1)]);
    }
  }
  return _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
}

template <int R>
void compact_dots_avx2(const CompactBf16Weight& w, int64_t j, const float* x_ordered, const float* x, float (&out)[R]) {
  if constexpr (R == 1) {
    const float scale = w.row_scale(j);
    out[0] = horizontal_sum(compact_row_lanes_avx2(w, j, x_ordered)) * scale + escape_terms(w, j, x, scale);
  } else {
    const uint8_t* codes[R];
    for (int r = 0; r < R; ++r) codes[r] = w.row_codes(j + r);
    const int64_t stride = w.block_stride(j);
    const __m256i odd = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    // One chain of multiply-adds per row (the registers hold no more); each row's vector q is decoded where it is
    // used, which keeps the registers for the group's sums.
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const int64_t blocks = w.blocks();
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x_ordered + b * kCompactBlock;
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const __m256 x_even = _mm256_loadu_ps(xb + 16 * q), x_odd = _mm256_loadu_ps(xb + 16 * q + 8);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i bits = compact_block_words(codes[r] + b * stride, q);
          acc[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)), x_even, acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(bits, odd)), x_odd, acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const float scale = w.row_scale(j + r);
      out[r] = horizontal_sum(acc[r]) * scale + escape_terms(w, j + r, x, scale);
    }
  }
}

void compact_dots_avx2_in_turn(const CompactBf16Weight& w, int64_t j, const float* x_ordered, const float* x,
                               float (&out)[kCompactRowsInTurn]) {
  static_assert(kCompactRowsInTurn == 8, "the lanes of eight rows are added in one transposing pass");
  __m256 lanes[8];
  for (int r = 0; r < 8; ++r) lanes[r] = compact_row_lanes_avx2(w, j + r, x_ordered);
  alignas(32) float sums[8];
  _mm256_store_ps(sums, horizontal_sums(lanes));
  for (int r = 0; r < 8; ++r) {
    const float scale = w.row_scale(j + r);
    out[r] = sums[r] * scale;
    // Most rows have no escapes: without this test the kernel measured 15-20% slower (Qwen2.5-0.5B-shaped decode,
    // one AVX2 thread).
    if (w.escape_at[static_cast<size_t>(j + r)] != w.escape_at[static_cast<size_t>(j + r) + 1])
      out[r] += escape_terms(w, j + r, x, scale);
  }
}

template void compact_dots_avx2<1>(const CompactBf16Weight&, int64_t, const float*, const float*, float (&)[1]);
template void compact_dots_avx2<kGemvLongRowGroup>(const CompactBf16Weight&, int64_t, const float*, const float*,
                                                   float (&)[kGemvLongRowGroup]);

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")
// GCC 12's _mm512_reduce_add_ps starts from _mm256_undefined_pd(), which -W(maybe-)uninitialized reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

template <int R>
void compact_dots_avx512(const CompactBf16Weight& w, int64_t j, const uint16_t* x_ordered, const float* x,
                         float (&out)[R]) {
  const uint8_t* codes[R];
  for (int r = 0; r < R; ++r) codes[r] = w.row_codes(j + r);
  const int64_t stride = w.block_stride(j);
  // The nibble bytes go to both halves: the lower half's low nibbles (values 0..31), the upper half's high ones
  // (values 32..63), each through the table to its value's high byte.
  const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i table = _mm512_broadcast_i32x4(compact_high_byte_lane());
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const int64_t blocks = w.blocks();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* xb = x_ordered + b * kCompactBlock;
    const auto x0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xb));
    const auto x1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xb + 32));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* block = codes[r] + b * stride;
      const __m512i low = _mm512_loadu_si512(block);
      const __m512i nibbles =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kCompactBlock)));
      const __m512i high = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srlv_epi16(nibbles, shifts), nibble));
      // Sign, offset and mantissa under kCompactExponentBase.
      const __m512i a = _mm512_unpacklo_epi8(low, high), c = _mm512_unpackhi_epi8(low, high);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], reinterpret_cast<__m512bh>(a), x0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], reinterpret_cast<__m512bh>(c), x1);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
    const float scale = w.row_scale(j + r);
    out[r] = sum * scale + escape_terms(w, j + r, x, scale);
  }
}

template void compact_dots_avx512<1>(const CompactBf16Weight&, int64_t, const uint16_t*, const float*, float (&)[1]);
template void compact_dots_avx512<kGemvLongRowGroup>(const CompactBf16Weight&, int64_t, const uint16_t*, const float*,
                                                     float (&)[kGemvLongRowGroup]);

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif

}  // namespace npusim::cpu
