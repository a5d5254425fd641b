#pragma once
// bf16 weights in 12 bits per value, without loss. Decoding streams every weight once per token, so fewer bytes
// are a faster step wherever memory bandwidth sets the speed; the values the products see are the bf16 values
// themselves.
//
// The values of one row lie within a few binades of its largest one: a row keeps its top exponent E (at least 16)
// once, and each value its sign, its exponent as an offset d = e - (E - 15) in 0..15, and its 7 mantissa bits:
// code = sign << 11 | d << 7 | mantissa. A value outside the row's 16 binades (zero, subnormals, tiny values,
// Inf, NaN) is an escape: it keeps code 0 and its exact value in the row's escape list. Rows are split in blocks
// of 64 values stored in 96 bytes: the 64 codes' low bytes (code & 0xFF: the offset's low bit and the mantissa),
// then 32 bytes of high nibbles (code >> 8: the sign and the offset's top three bits; byte t: value t in its low
// nibble, value t + 32 in its high one). The last block of a row is padded with code 0. A low byte is the decoded
// bf16 word's low byte as it is, and a 16-entry byte table turns a nibble into its high byte, so that vector
// decoders take a block apart in one shuffle per 32 values (compact_bf16_avx2.h).
//
// A code decodes without the row's exponent to bf16 bits sign << 15 | (112 + d) << 7 | mantissa, the value times
// 2^(127 - E): products sum those and scale the row's sum by 2^(E - 127) exactly, then add what the escapes differ
// by. Vector decoders yield a block's values in an order of their own (see compact_bf16_gemv.cpp); the
// activations are put in that order once per product.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cpu/gemv.h"
#include "backends/cpu/storage.h"
#include "backends/cpu/thread_pool.h"

namespace npusim::cpu {

constexpr int64_t kCompactBlock = 64;       // values per block
constexpr int64_t kCompactBlockBytes = 96;  // 64 high bytes, 32 bytes of nibbles
constexpr int64_t kCompactWindow = 16;      // binades a row's codes cover
constexpr int64_t kCompactLowestTop = 16;   // the smallest top exponent a row keeps, so that its window is normal
// The bf16 exponent field a decoder gives offset 0 (offset d decodes to 112 + d, above); its low four bits are zero,
// so the offset fills them in.
constexpr int kCompactExponentBase = 112;

struct CompactEscape {
  uint32_t column = 0;
  float value = 0.0f;  // the bf16 value, exactly
};

// A bf16 weight [n, k] in compact form, owned. Rows are stored in groups of `interleave` rows (the last group may
// hold fewer): block 0 of every row of the group, then block 1 of every row, and so on, so that a kernel that reads
// the group's rows together reads one stream. With interleave 1 each row's blocks follow each other.
struct CompactBf16Weight {
  AlignedBuffer codes;             // n * blocks() blocks of kCompactBlockBytes
  std::vector<uint8_t> top;        // [n]: each row's top exponent E
  std::vector<int64_t> escape_at;  // [n + 1]: row j's escapes are escapes[escape_at[j], escape_at[j + 1])
  std::vector<CompactEscape> escapes;
  int64_t n = 0, k = 0, interleave = 1;

  int64_t blocks() const { return (k + kCompactBlock - 1) / kCompactBlock; }
  // Where row j's first block lies in `codes`; its next blocks follow every block_stride(j) bytes.
  int64_t row_offset(int64_t j) const {
    if (interleave == 1) return j * blocks() * kCompactBlockBytes;  // no division for rows in order
    const int64_t first = j / interleave * interleave;
    return (first * blocks() + (j - first)) * kCompactBlockBytes;
  }
  int64_t block_stride(int64_t j) const {
    if (interleave == 1) return kCompactBlockBytes;
    return std::min(interleave, n - j / interleave * interleave) * kCompactBlockBytes;
  }
  const uint8_t* row_codes(int64_t j) const { return reinterpret_cast<const uint8_t*>(codes.data()) + row_offset(j); }
  // 2^(E - 127) for row j: what its decoded sums are multiplied by.
  float row_scale(int64_t j) const;
  // Row j's k values in order, exactly, as bf16 bits or fp32 (elem BF16 or F32).
  void decode_row(int64_t j, Elem elem, std::byte* out) const;
  // Bytes a product reads: codes, top exponents and escapes.
  int64_t stored_bytes() const;
};

// The compact form of a bf16 weight [n, k] (bits, row-major) with rows in groups of `interleave`, or null when more
// than `escape_share` of its values would be escapes (the weight then stays as it is: escapes cost a product 8 bytes
// each). Rows are split over the pool.
constexpr double kCompactEscapeShare = 1.0 / 256;
std::shared_ptr<const CompactBf16Weight> compact_bf16(const uint16_t* bits, int64_t n, int64_t k,
                                                      ThreadPool* pool = nullptr,
                                                      double escape_share = kCompactEscapeShare,
                                                      int64_t interleave = 1);

// Products of one activation row x [k] with row j of a compact weight, without bias (compact_bf16_gemv.cpp).
// `x_ordered` is x put in the decoder's order by order_for_avx2 / order_for_avx512: blocks() * kCompactBlock
// values, zero past k. The AVX-512 kernel multiplies bf16 pairs and so takes x as bf16 (exactly x).
void order_for_avx2(const float* x, int64_t k, float* out);
void order_for_avx512(const uint16_t* x, int64_t k, uint16_t* out);
// Rows j .. j + R at once (R = 1 or kGemvLongRowGroup; rows that share a block stride): each activation load
// serves R rows.
template <int R>
void compact_dots_avx2(const CompactBf16Weight& weight, int64_t j, const float* x_ordered, const float* x,
                       float (&out)[R]);
template <int R>
void compact_dots_avx512(const CompactBf16Weight& weight, int64_t j, const uint16_t* x_ordered, const float* x,
                         float (&out)[R]);
// Rows j .. j + kCompactRowsInTurn of a weight with short rows, one after the other as compact_dots_avx2<1> reads
// them (one memory stream), their sums reduced together: a row of a few blocks spends a good part of its time on
// its own reduction otherwise.
constexpr int kCompactRowsInTurn = 8;
void compact_dots_avx2_in_turn(const CompactBf16Weight& weight, int64_t j, const float* x_ordered, const float* x,
                               float (&out)[kCompactRowsInTurn]);
// Whether the GEMV multiplies compact weights as bf16 pairs against bf16 activations (compact_dots_avx512) rather
// than widened against fp32 ones (compact_dots_avx2): on AMD's Zen 4 with AVX-512 BF16, where it measured faster.
// On an Intel Xeon (Sapphire Rapids) the AVX2 kernel decodes faster: Qwen2.5-1.5B-shaped decode 218 -> 192 ms a
// token on one thread, 115 -> 104 ms on two.
bool compact_bf16_pairs();
// The interleave the GEMV reads fastest on this CPU for rows of k values: kGemvLongRowGroup where the AVX-512
// kernel reads long rows (kGemvLongRow values and more, gemv.h), else 1. Measured for k = 8960 on one Zen 4 thread,
// AVX-512 (bf16 activations): one row at a time 18-19 GB/s, four rows 20, eight rows 24-25, eight rows interleaved
// (one stream) 26-27; k = 1536, one row at a time: 28. AVX2 (fp32 activations, 35 KiB): one row at a time 10-11,
// eight rows in their own streams 17-19, eight interleaved 15.
int64_t compact_interleave(int64_t k);

}  // namespace npusim::cpu
