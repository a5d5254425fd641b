// The tensor-core form of attention for several query rows per head (prefill), chosen by launch_attention.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/device_kernels.h"

namespace npusim::cuda {

// Whether the tensor-core form takes these parameters: more than one query row per head, fp16 or bf16 keys and
// values (`elem`) on 16-byte aligned rows of equal width, a multiple of 16 up to 128, each key/value head shared by a
// whole number of query heads.
bool mma_attention_applies(const AttentionParams& p, int elem, const void* k, const void* v);
cudaError_t launch_mma_attention(cudaStream_t stream, const AttentionParams& p, int elem, void* out, int out_elem,
                                 Operand q, const void* k, const void* v);

}  // namespace npusim::cuda
