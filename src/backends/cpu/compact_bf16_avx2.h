#pragma once
// The AVX2 decoder of a compact bf16 block (compact_bf16.h), shared by the row decoder and the GEMV kernel: each
// value's low byte is stored as it is in the bf16 word; its high nibble (sign and the offset's top three bits)
// becomes the word's high byte through a 16-entry byte table (one shuffle for 32 values). Include only where the
// AVX2 target is on (the functions carry it: call them from AVX2 code only).
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/compact_bf16.h"

namespace npusim::cpu {

// The bf16 word's high byte for nibble n = sign << 3 | offset >> 1 under the fixed exponent base 112:
// sign << 7 | (112 + offset) >> 1, whose low three bits are the offset's top three (112 = 0b1110000).
inline __attribute__((always_inline, target("avx2"))) __m256i compact_high_byte_table() {
  return _mm256_setr_epi8(
      0x38, 0x39, 0x3A, 0x3B, 0x3C, 0x3D, 0x3E, 0x3F, static_cast<char>(0xB8), static_cast<char>(0xB9),
      static_cast<char>(0xBA), static_cast<char>(0xBB), static_cast<char>(0xBC), static_cast<char>(0xBD),
      static_cast<char>(0xBE), static_cast<char>(0xBF), 0x38, 0x39, 0x3A, 0x3B, 0x3C, 0x3D, 0x3E, 0x3F,
      static_cast<char>(0xB8), static_cast<char>(0xB9), static_cast<char>(0xBA), static_cast<char>(0xBB),
      static_cast<char>(0xBC), static_cast<char>(0xBD), static_cast<char>(0xBE), static_cast<char>(0xBF));
}

// Vector q (0..3) of a block as 16 bf16 words sign << 15 | (112 + offset) << 7 | mantissa (the value times
// 2^(127 - E)): values [0..7, 16..23], [8..15, 24..31], [32..39, 48..55], [40..47, 56..63].
inline __attribute__((always_inline, target("avx2"))) __m256i compact_block_words(const uint8_t* block, int q) {
  const __m256i nibbles = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kCompactBlock));
  const __m256i index = _mm256_and_si256(q < 2 ? nibbles : _mm256_srli_epi16(nibbles, 4), _mm256_set1_epi8(0x0F));
  const __m256i high = _mm256_shuffle_epi8(compact_high_byte_table(), index);
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * (q / 2)));
  return q % 2 == 0 ? _mm256_unpacklo_epi8(low, high) : _mm256_unpackhi_epi8(low, high);
}

}  // namespace npusim::cpu
