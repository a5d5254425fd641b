#pragma once
// Emits the canonical graph of a decoder-only transformer of the Qwen2 or Llama family straight from its
// configuration: one forward step over `tokens` new tokens against a static KV cache of `context` positions.
//
// Inputs: input_ids [1, T], position_ids [1, T], cache_position [T] (the cache rows the new tokens go to),
// attention_mask [1, 1, T, C] (additive float: 0 visible, -inf masked; only when T > 1: a single token sees the
// cache up to its own position, which the attention's cache_position bound already enforces), then
// kv_0 .. kv_{2L-1} [1, Hkv, C, D] (even = keys, odd = values, per layer), as the exported decode graphs name them.
// Outputs: logits [1, T or 1, V] (only the last token's unless `all_logits`), then the 2L updated caches, each
// index_copy of its input at cache_position: bound as state, they are written in place.
//
// Weights keep their Hugging Face names (model.layers.0.self_attn.q_proj.weight, ...); a tied LM head reads
// model.embed_tokens.weight. Rotary frequencies come from ModelConfig::rope_inv_freq (default, linear, dynamic,
// llama3 and yarn scaling) as a constant.
#include <cstdint>
#include <string>
#include <vector>

#include "llm/model_config.h"
#include "npusim/graph.h"

namespace npusim {

struct NativeGraphOptions {
  int64_t tokens = 1;       // T: new tokens per step
  int64_t context = 0;      // C: positions of the static cache
  bool all_logits = false;  // logits for every new token, not only the last
};

// The families the builder knows, e.g. "Qwen2ForCausalLM (qwen2), LlamaForCausalLM (llama)".
std::string native_architectures();
// Fails with a clear reason when the configuration is not a family the builder emits, or uses a feature it does
// not implement (sliding windows, partial rotary).
void check_native_support(const ModelConfig& config);

Graph build_native_graph(const ModelConfig& config, const NativeGraphOptions& options);

// Names of the cache inputs and of the outputs that update them, in order: {kv_0, kv_0_out}, ...
std::vector<std::pair<std::string, std::string>> native_cache_pairs(const ModelConfig& config);

// The additive mask a chunk of `tokens` new tokens starting at cache position `start` needs: row i sees cache
// positions 0 .. start + i. Shape [1, 1, tokens, context], fp32.
Tensor causal_chunk_mask(int64_t start, int64_t tokens, int64_t context);

}  // namespace npusim
