#pragma once
// The AVX2 decoder of a compact bf16 block (compact_bf16.h), shared by the row decoder and the GEMV kernel: each
// value's low byte is stored as it is in the bf16 word; its high nibble (sign and the offset's top three bits)
// becomes the word's high byte through a 16-entry byte table (one shuffle for 32 values). Include only where the
// AVX2 target is on (the functions carry it: call them from AVX2 code only).
#include <immintrin.h>

#include <array>
#include <cstdint>

#include "backends/cpu/compact_bf16.h"

namespace npusim::cpu {

// The bf16 word's high byte for each nibble n = sign << 3 | offset >> 1: sign << 7 | (kCompactExponentBase +
// offset) >> 1, whose low three bits are the offset's top three (the base's low four bits are zero).
inline constexpr std::array<uint8_t, 16> kCompactHighBytes = [] {
  std::array<uint8_t, 16> bytes{};
  for (int n = 0; n < 16; ++n) bytes[n] = static_cast<uint8_t>((n & 8) << 4 | (kCompactExponentBase >> 1) | (n & 7));
  return bytes;
}();

// The table in one 128-bit lane, for byte shuffles that look up within each lane.
inline __attribute__((always_inline, target("avx2"))) __m128i compact_high_byte_lane() {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(kCompactHighBytes.data()));
}

// Vector q (0..3) of a block as 16 bf16 words sign << 15 | (kCompactExponentBase + offset) << 7 | mantissa (the value
// times 2^(127 - E)): values [0..7, 16..23], [8..15, 24..31], [32..39, 48..55], [40..47, 56..63].
inline __attribute__((always_inline, target("avx2"))) __m256i compact_block_words(const uint8_t* block, int q) {
  const __m256i nibbles = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kCompactBlock));
  const __m256i index = _mm256_and_si256(q < 2 ? nibbles : _mm256_srli_epi16(nibbles, 4), _mm256_set1_epi8(0x0F));
  const __m256i high = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(compact_high_byte_lane()), index);
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * (q / 2)));
  return q % 2 == 0 ? _mm256_unpacklo_epi8(low, high) : _mm256_unpackhi_epi8(low, high);
}

}  // namespace npusim::cpu
