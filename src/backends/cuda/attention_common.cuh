// Device helpers shared by the attention kernels (the CUDA-core forms in attention_kernels.cu and the tensor-core
// prefill form in attention_mma.cu): the attended key range, mask terms, scores, asynchronous tile copies and warp
// reductions.
#pragma once

#include <climits>
#include <cstdint>

#include "backends/cuda/device_common.cuh"
#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

// Key positions a query reads: all of them, or 0..max(cache_position) (read on the device, so that a replayed
// CUDA graph follows the position). Every lane of a warp calls it: the lanes read the positions together (a prefill
// chunk has one per query row).
__device__ __forceinline__ int64_t attended_keys(const AttentionParams& p) {
  if (!p.cache_position || p.cache_position_count == 0) return p.source;
  long long last = LLONG_MIN;
  for (int64_t j = threadIdx.x % 32; j < p.cache_position_count; j += 32)
    last = max(last, static_cast<long long>(p.cache_position[j]));
  for (int offset = 16; offset > 0; offset /= 2) last = max(last, __shfl_xor_sync(0xffffffffu, last, offset));
  return min(max(static_cast<int64_t>(last) + 1, int64_t{0}), p.source);
}

// What the mask adds to the score of query row `row` against key j: 0 without a mask, -inf where a bool mask is
// false, else the mask's value.
__device__ __forceinline__ float mask_term(const AttentionParams& p, int64_t b, int64_t head, int64_t row, int64_t j) {
  if (!p.mask) return 0.0f;
  const int64_t at =
      b * p.mask_batch_stride + head * p.mask_head_stride + row * p.mask_row_stride + j * p.mask_column_stride;
  if (p.mask_elem == kBool) return static_cast<const uint8_t*>(p.mask)[at] ? 0.0f : -INFINITY;
  return load_f(p.mask, p.mask_elem, at);
}

// The score from the dot product and the mask's term: scaled, causal limit and mask applied.
__device__ __forceinline__ float masked_score(const AttentionParams& p, float dot, float mask, int64_t row, int64_t j) {
  float s = __fmul_rn(dot, p.scale);
  if (p.causal && j > row) s = -INFINITY;
  if (p.mask) s = __fadd_rn(s, mask);
  return s;
}

// The output of a query row from its weighted sum, its maximum score and its sum of weights.
__device__ __forceinline__ float finished_value(const AttentionParams& p, float weighted, float peak, float sum) {
  if (peak == -INFINITY) return p.zero_masked_rows ? 0.0f : NAN;  // the softmax of a row with every score -inf
  return weighted / sum;
}

__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* global_src, bool valid) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(global_src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;"); }
template <int Pending>
__device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}
__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

}  // namespace npusim::cuda
