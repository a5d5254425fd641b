#pragma once
// Products of a few activation rows with a linear layer's weight, y[m, n] = x[m, k] · W[n, k]^T + bias, for m up to
// kGemvMaxRows: the shape of LLM decoding, where every weight is read once per step and memory bandwidth decides
// the speed. Weights stay in their storage form (fp32, fp16, bf16, or int8 with scales) and are widened to fp32
// in registers; several weight rows are walked together so that each activation load serves them all. With an int8
// weight on AVX2 the activations are quantized too (int8, one scale per block of 32 values along k) and the products
// run on 8-bit integer multiply-adds (VNNI where the CPU has it); with a bf16 weight, one activation row and the same
// row given as bf16, CPUs with AVX-512 BF16 multiply bf16 pairs directly; the portable path keeps fp32 activations.
// A compact bf16 weight is decoded in registers against one activation row, and decoded a few rows at a time into
// bf16 scratch otherwise.
// Work is split over the pool by output columns (weight rows); nothing is allocated per call once a thread has seen its
// largest problem.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "backends/cpu/storage.h"
#include "backends/cpu/thread_pool.h"

namespace npusim::cpu {

// Rows of at least kGemvLongRow values go kGemvLongRowGroup at a time against one row of activations, in every
// kernel: their activations (8-35 KiB) no longer stay in L1 beside the weights streaming through, so they are read
// once per group rather than once per row (k = 8960, one Zen 4 thread, AVX2: bf16 and f16 rows one at a time 11-12
// GB/s, eight at a time 17-18; compact_bf16.h and the AVX-512 bf16 kernel for the others).
constexpr int64_t kGemvLongRow = 4096;
constexpr int kGemvLongRowGroup = 8;

constexpr int64_t kGemvMaxRows = 7;

enum class GemvWeightType : uint8_t { F32, F16, BF16, Int8, CompactBF16 };

struct CompactBf16Weight;

// A weight [n, k], row-major. An int8 weight is symmetric: W[j, i] = values[j, i] * scales[j * groups + i / group]
// with groups = ceil(k / group); `group` is k (one scale per output channel) or a multiple of 8. A compact bf16
// weight (compact_bf16.h) is `compact`; `values` is unused.
struct GemvWeight {
  GemvWeightType type = GemvWeightType::F32;
  const void* values = nullptr;
  int64_t n = 0, k = 0;
  const float* scales = nullptr;
  int64_t group = 0;
  const CompactBf16Weight* compact = nullptr;

  int64_t groups() const { return group > 0 ? (k + group - 1) / group : 0; }
};

// y[i, j] for i < m, j < weight.n. x is fp32 with row stride ldx; y is stored as `y_elem` with row stride ldy;
// the bias ([n] or a single value, stored as `bias_elem`) is optional.
struct GemvProblem {
  int64_t m = 1;
  const float* x = nullptr;
  int64_t ldx = 0;
  const uint16_t* x_bf16 = nullptr;  // optional: x as bf16 bits, equal to x exactly (a bf16 activation widened)
  GemvWeight weight;
  const std::byte* bias = nullptr;
  Elem bias_elem = Elem::F32;
  int64_t bias_count = 0;  // n, or 1 for one value for every column
  std::byte* y = nullptr;
  Elem y_elem = Elem::F32;
  int64_t ldy = 0;
};

// Output columns [begin, end) of every row, on the calling thread.
void gemv_columns(const GemvProblem& problem, int64_t begin, int64_t end);
// All columns, split over the pool.
void gemv(const GemvProblem& problem, ThreadPool& pool);

// Which implementation runs: chosen once from the CPU's features; tests may force a lesser one. Avx512 is the AVX2
// kernels plus the AVX-512 dot products the CPU has: bf16 pairs (vdpbf16ps) for bf16 weights, and for int8 weights
// against one row of activations, bytes (vpdpbusd, VNNI).
enum class GemvIsa : uint8_t { Portable, Avx2, Avx512 };
GemvIsa gemv_isa();
// Forces an implementation (nullopt: back to the CPU's choice). Forcing one the CPU lacks fails.
void force_gemv_isa(std::optional<GemvIsa> isa);

// A weight quantized to symmetric int8, owned.
struct QuantizedWeight {
  AlignedBuffer values;  // int8 [n, k]
  AlignedBuffer scales;  // fp32 [n, groups]
  int64_t n = 0, k = 0, group = 0;

  GemvWeight view() const;
  // Row j widened back to k values of `elem` (F32 or BF16; bf16 rounds each value times its scale to nearest even).
  void dequantize_row(int64_t j, Elem elem, std::byte* out) const;
};

// Quantizes a float weight [n, k] stored as `elem`; `group` 0 means one scale per output channel. Rows are split
// over the pool.
QuantizedWeight quantize_int8(const std::byte* weight, Elem elem, int64_t n, int64_t k, int64_t group,
                              ThreadPool* pool = nullptr);

}  // namespace npusim::cpu
