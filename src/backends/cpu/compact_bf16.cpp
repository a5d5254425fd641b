#include "backends/cpu/compact_bf16.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include "backends/cpu/gemv.h"
#include "core/cpu_features.h"
#include "npusim/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "backends/cpu/compact_bf16_avx2.h"
#define NPUSIM_COMPACT_X86 1
#endif

namespace npusim::cpu {

namespace {

constexpr int64_t kNibbleBytes = kCompactBlock / 2;

uint16_t exponent_of(uint16_t bits) { return static_cast<uint16_t>((bits >> 7) & 0xFF); }

// The row's top exponent E over its finite values.
int top_exponent_portable(const uint16_t* row, int64_t k) {
  int top = 0;
  for (int64_t i = 0; i < k; ++i)
    if (exponent_of(row[i]) != 0xFF) top = std::max<int>(top, exponent_of(row[i]));
  return std::max<int>(top, kCompactLowestTop);
}

// Code of one value in a row whose window starts at exponent `low`, or nullopt-like -1 for an escape.
int code_of(uint16_t bits, int low) {
  const int exponent = exponent_of(bits);
  const int offset = exponent - low;
  if (offset < 0 || offset >= kCompactWindow) return -1;
  return ((bits >> 15) << 11) | (offset << 7) | (bits & 0x7F);
}

// The code's low byte in the block's byte t, its high nibble (sign, offset >> 1) in the nibble bytes: low nibbles
// for values 0..31, high ones for values 32..63.
void put_code(uint8_t* block, int64_t t, int code) {
  block[t] = static_cast<uint8_t>(code & 0xFF);
  uint8_t& nibbles = block[kCompactBlock + t % kNibbleBytes];
  const int shift = t < kNibbleBytes ? 0 : 4;
  nibbles = static_cast<uint8_t>((nibbles & ~(0xF << shift)) | ((code >> 8) << shift));
}

int code_at(const uint8_t* block, int64_t t) {
  const int nibble = (block[kCompactBlock + t % kNibbleBytes] >> (t < kNibbleBytes ? 0 : 4)) & 0xF;
  return (nibble << 8) | block[t];
}

// Encodes values [begin, k) of row `row` into its codes `out` (zeroed blocks, `stride` bytes apart) and appends
// their escapes.
void encode_row_portable(const uint16_t* row, int64_t begin, int64_t k, int top, uint8_t* out, int64_t stride,
                         std::vector<CompactEscape>& escapes) {
  const int low = top - (kCompactWindow - 1);
  for (int64_t i = begin; i < k; ++i) {
    const int code = code_of(row[i], low);
    if (code < 0) escapes.push_back({static_cast<uint32_t>(i), bf16_bits_to_float(row[i])});
    put_code(out + i / kCompactBlock * stride, i % kCompactBlock, std::max(code, 0));
  }
}

uint16_t decoded_bits(int code, int top) {
  const int offset = (code >> 7) & 0xF;
  return static_cast<uint16_t>(((code >> 11) << 15) | ((offset + top - (kCompactWindow - 1)) << 7) | (code & 0x7F));
}

// Values [begin, k) of a row from its codes (blocks `stride` bytes apart).
void decode_row_portable(const uint8_t* codes, int64_t stride, int64_t begin, int64_t k, int top, uint16_t* out) {
  for (int64_t i = begin; i < k; ++i)
    out[i] = decoded_bits(code_at(codes + i / kCompactBlock * stride, i % kCompactBlock), top);
}

#ifdef NPUSIM_COMPACT_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2,popcnt")

int top_exponent_avx2(const uint16_t* row, int64_t k) {
  const __m256i field = _mm256_set1_epi16(0x7F80);
  __m256i top = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m256i exponent = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i)), field);
    top = _mm256_max_epu16(top, _mm256_andnot_si256(_mm256_cmpeq_epi16(exponent, field), exponent));
  }
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  int result = 0;
  for (uint16_t lane : lanes) result = std::max<int>(result, lane >> 7);
  for (; i < k; ++i)
    if (exponent_of(row[i]) != 0xFF) result = std::max<int>(result, exponent_of(row[i]));
  return std::max<int>(result, kCompactLowestTop);
}

// 16 codes of 16 values; `escaped` gets a bit per value outside the window.
inline __attribute__((always_inline)) __m256i codes16(__m256i bits, __m256i low, uint32_t& escaped) {
  const __m256i offset = _mm256_sub_epi16(_mm256_and_si256(bits, _mm256_set1_epi16(0x7FFF)), low);
  const __m256i inside = _mm256_cmpeq_epi16(_mm256_min_epu16(offset, _mm256_set1_epi16(0x7FF)), offset);
  escaped = ~static_cast<uint32_t>(_mm256_movemask_epi8(inside));  // two bits per value
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi16(bits, 4), _mm256_set1_epi16(0x800));
  return _mm256_and_si256(_mm256_or_si256(offset, sign), inside);
}

// Two vectors of 16 codes (values 0..15, 16..31 of a run) to 32 bytes in order.
inline __attribute__((always_inline)) __m256i bytes_of(__m256i first, __m256i second) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi16(first, second), 0xD8);
}

void encode_block_avx2(const uint16_t* values, int64_t base, __m256i low, uint8_t* out,
                       std::vector<CompactEscape>& escapes) {
  __m256i codes[4];
  for (int q = 0; q < 4; ++q) {
    uint32_t escaped = 0;
    codes[q] = codes16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 16 * q)), low, escaped);
    for (; escaped != 0; escaped &= escaped - 1) {
      const int byte = std::countr_zero(escaped);
      escaped &= escaped - 1;  // the value's second bit
      const int64_t t = 16 * q + byte / 2;
      escapes.push_back({static_cast<uint32_t>(base + t), bf16_bits_to_float(values[t])});
    }
  }
  const __m256i byte = _mm256_set1_epi16(0xFF);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      bytes_of(_mm256_and_si256(codes[0], byte), _mm256_and_si256(codes[1], byte)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32),
                      bytes_of(_mm256_and_si256(codes[2], byte), _mm256_and_si256(codes[3], byte)));
  const __m256i low_nibbles = bytes_of(_mm256_srli_epi16(codes[0], 8), _mm256_srli_epi16(codes[1], 8));
  const __m256i high_nibbles = bytes_of(_mm256_srli_epi16(codes[2], 8), _mm256_srli_epi16(codes[3], 8));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kCompactBlock),
                      _mm256_or_si256(low_nibbles, _mm256_slli_epi16(high_nibbles, 4)));
}

void encode_row_avx2(const uint16_t* row, int64_t k, int top, uint8_t* out, int64_t stride,
                     std::vector<CompactEscape>& escapes) {
  const __m256i low = _mm256_set1_epi16(static_cast<int16_t>((top - (kCompactWindow - 1)) << 7));
  const int64_t whole = k / kCompactBlock;
  for (int64_t b = 0; b < whole; ++b)
    encode_block_avx2(row + b * kCompactBlock, b * kCompactBlock, low, out + b * stride, escapes);
  encode_row_portable(row, whole * kCompactBlock, k, top, out, stride, escapes);
}

void decode_row_avx2(const uint8_t* codes, int64_t stride, int64_t k, int top, uint16_t* out) {
  // The words carry kCompactExponentBase; the row's base is top - (kCompactWindow - 1).
  const __m256i rebase =
      _mm256_set1_epi16(static_cast<int16_t>((top - (kCompactWindow - 1) - kCompactExponentBase) * 128));
  const int64_t whole = k / kCompactBlock;
  for (int64_t b = 0; b < whole; ++b) {
    __m256i bits[4];
    for (int q = 0; q < 4; ++q) bits[q] = _mm256_add_epi16(compact_block_words(codes + b * stride, q), rebase);
    auto* dst = reinterpret_cast<__m256i*>(out + b * kCompactBlock);
    _mm256_storeu_si256(dst, _mm256_permute2x128_si256(bits[0], bits[1], 0x20));
    _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(bits[0], bits[1], 0x31));
    _mm256_storeu_si256(dst + 2, _mm256_permute2x128_si256(bits[2], bits[3], 0x20));
    _mm256_storeu_si256(dst + 3, _mm256_permute2x128_si256(bits[2], bits[3], 0x31));
  }
  decode_row_portable(codes, stride, whole * kCompactBlock, k, top, out);
}

#pragma GCC pop_options
#endif

bool vector_isa() { return gemv_isa() != GemvIsa::Portable; }

}  // namespace

float CompactBf16Weight::row_scale(int64_t j) const {
  return std::bit_cast<float>(static_cast<uint32_t>(top[static_cast<size_t>(j)]) << 23);
}

void CompactBf16Weight::decode_row(int64_t j, Elem elem, std::byte* out) const {
  if (elem != Elem::BF16 && elem != Elem::F32) fail("compact bf16 weight: rows decode to bfloat16 or float32 only");
  const int top_exponent = top[static_cast<size_t>(j)];
  uint16_t* bits = reinterpret_cast<uint16_t*>(out);
  if (elem == Elem::F32) {
    static thread_local std::vector<uint16_t> scratch;
    scratch.resize(static_cast<size_t>(k));
    bits = scratch.data();
  }
#ifdef NPUSIM_COMPACT_X86
  if (vector_isa())
    decode_row_avx2(row_codes(j), block_stride(j), k, top_exponent, bits);
  else
#endif
    decode_row_portable(row_codes(j), block_stride(j), 0, k, top_exponent, bits);
  for (int64_t e = escape_at[static_cast<size_t>(j)]; e < escape_at[static_cast<size_t>(j) + 1]; ++e) {
    const CompactEscape& escape = escapes[static_cast<size_t>(e)];
    bits[escape.column] = static_cast<uint16_t>(std::bit_cast<uint32_t>(escape.value) >> 16);
  }
  if (elem == Elem::F32)
    to_float(reinterpret_cast<const std::byte*>(bits), Elem::BF16, reinterpret_cast<float*>(out), k);
}

int64_t CompactBf16Weight::stored_bytes() const {
  return static_cast<int64_t>(codes.size() + top.size() + escapes.size() * sizeof(CompactEscape) +
                              escape_at.size() * sizeof(int64_t));
}

bool compact_bf16_pairs() {
  const CpuFeatures& cpu = cpu_features();
  return gemv_isa() == GemvIsa::Avx512 && cpu.avx512bf16 && cpu.amd;
}

int64_t compact_interleave(int64_t k) { return k >= kGemvLongRow && compact_bf16_pairs() ? kGemvLongRowGroup : 1; }

std::shared_ptr<const CompactBf16Weight> compact_bf16(const uint16_t* bits, int64_t n, int64_t k, ThreadPool* pool,
                                                      double escape_share, int64_t interleave) {
  if (n < 0 || k < 0) fail("compact bf16: negative weight dims");
  if (k > int64_t{UINT32_MAX}) fail("compact bf16: rows of " + std::to_string(k) + " values are too long");
  if (interleave < 1) fail("compact bf16: rows interleaved in groups of " + std::to_string(interleave));
  auto weight = std::make_shared<CompactBf16Weight>();
  weight->n = n;
  weight->k = k;
  weight->interleave = interleave;
  weight->codes = AlignedBuffer(static_cast<size_t>(n * weight->blocks() * kCompactBlockBytes), Pages::Huge);
  weight->top.resize(static_cast<size_t>(n));
  const auto limit = static_cast<int64_t>(escape_share * static_cast<double>(n * k));
  // Each piece of rows collects its escapes on its own; they are joined in row order afterwards.
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(n, 64));
  std::vector<std::vector<CompactEscape>> escapes(static_cast<size_t>(pieces));
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(pieces));
  std::atomic<int64_t> total{0};
  [[maybe_unused]] const bool vectors = vector_isa();
  const auto encode_piece = [&](int64_t piece) {
    const int64_t begin = n * piece / pieces, end = n * (piece + 1) / pieces;
    std::vector<CompactEscape>& found = escapes[static_cast<size_t>(piece)];
    for (int64_t j = begin; j < end && total.load(std::memory_order_relaxed) <= limit; ++j) {
      const uint16_t* row = bits + j * k;
      uint8_t* out = reinterpret_cast<uint8_t*>(weight->codes.data()) + weight->row_offset(j);
      const int64_t stride = weight->block_stride(j);
      const size_t before = found.size();
#ifdef NPUSIM_COMPACT_X86
      if (vectors) {
        const int top = top_exponent_avx2(row, k);
        weight->top[static_cast<size_t>(j)] = static_cast<uint8_t>(top);
        encode_row_avx2(row, k, top, out, stride, found);
      } else
#endif
      {
        const int top = top_exponent_portable(row, k);
        weight->top[static_cast<size_t>(j)] = static_cast<uint8_t>(top);
        encode_row_portable(row, 0, k, top, out, stride, found);
      }
      counts[static_cast<size_t>(piece)].push_back(static_cast<int64_t>(found.size() - before));
      total.fetch_add(static_cast<int64_t>(found.size() - before), std::memory_order_relaxed);
    }
  };
  if (pool)
    pool->parallel_for(pieces, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t piece = begin; piece < end; ++piece) encode_piece(piece);
    });
  else
    for (int64_t piece = 0; piece < pieces; ++piece) encode_piece(piece);
  if (total.load() > limit) return nullptr;
  weight->escape_at.reserve(static_cast<size_t>(n + 1));
  weight->escape_at.push_back(0);
  for (int64_t piece = 0; piece < pieces; ++piece) {
    for (int64_t count : counts[static_cast<size_t>(piece)])
      weight->escape_at.push_back(weight->escape_at.back() + count);
    weight->escapes.insert(weight->escapes.end(), escapes[static_cast<size_t>(piece)].begin(),
                           escapes[static_cast<size_t>(piece)].end());
  }
  return weight;
}

}  // namespace npusim::cpu
