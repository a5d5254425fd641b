// The decode form of attention (one query row per head against a key/value cache), chosen by launch_attention.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

// Whether the decode form takes these parameters: one query row per head, fp16 or bf16 keys and values (`elem`) on
// 16-byte aligned rows of equal width 64 or 128 (256 would spill its registers), at most 16 query heads per key/value
// head.
bool decode_attention_applies(const AttentionParams& p, int elem, const void* k, const void* v);
// Scratch floats it needs for the runs' partial sums (0 when the cache is short enough for one run per head group).
// How the keys split into runs: at least `min_run_keys` per run, at most `max_splits` runs per head group until runs
// would pass 512 keys. 0 takes the measured defaults; the benchmarks sweep the others.
struct DecodeTuning {
  int min_run_keys = 0, max_splits = 0;
};
int64_t decode_attention_scratch_floats(const AttentionParams& p, DecodeTuning tuning = {});
// `scratch` holds decode_attention_scratch_floats(p, tuning) floats.
cudaError_t launch_decode_attention(cudaStream_t stream, const AttentionParams& p, int elem, void* out, int out_elem,
                                    Operand q, const void* k, const void* v, float* scratch, DecodeTuning tuning = {});

// Fetches the cache rows attention `p` will read (0..cache position, per key/value head; `k` and `v` as
// [batch, heads, source, features] of `elem`) into L2, reading nothing into the SMs: launched on a second stream
// while the kernels ahead of the attention run, it overlaps the cache's reads with theirs.
cudaError_t launch_cache_prefetch(cudaStream_t stream, const AttentionParams& p, int elem, const void* k,
                                  const void* v);

}  // namespace npusim::cuda
