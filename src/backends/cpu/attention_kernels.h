#pragma once
// Attention of a decoding step over a KV cache: the fused `attention` op with one query position, no mask, and the
// cache_position bound (the shape of every decode step of the native LLM graphs). The heads that share a key/value
// head (grouped-query attention) are computed together, so each cache row is read once per step, in its storage
// type, and only the positions written so far are read.
#include <optional>

#include "backends/cpu/kernels.h"

namespace npusim::cpu {

// The kernel for such a node, or nothing (the general attention kernel then runs it).
std::optional<Kernel> decode_attention(const KernelContext& ctx);

}  // namespace npusim::cpu
