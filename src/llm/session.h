#pragma once
// One conversation with a model: a KV cache that lives on the backend for the whole session and is updated in
// place, fed by prefill (prompt chunks) and decode steps (one token each).
//
// Two ways to the graphs, one result:
//  - native: the canonical graph from config.json (native_builder.h), compiled once per step size: a decode step
//    of one token and prefill chunks of powers of two up to `prefill_chunk`. A prompt is cut into the largest
//    chunks that fit, so nothing is padded; every program shares the one cache.
//  - exported: torch_ir prefill and decode graphs with a static cache (--prefill-ir / --decode-ir). The prefill
//    graph has a fixed length: a prompt up to that length is right-padded into it (the causal mask keeps the
//    padding out of every real token's view), longer prompts continue with decode steps.
// Either way a decode step reads only the cache positions written so far.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llm/model_dir.h"
#include "npusim/tensor.h"
#include "runtime/backend.h"

namespace npusim {

struct SessionOptions {
  int64_t context = 0;          // cache positions; 0: min(4096, max_position_embeddings), or the exported cache
  int64_t prefill_chunk = 128;  // native: the largest prefill step
  std::optional<DType> dtype;   // storage of activations, weights and cache; default: the checkpoint's float dtype
  std::string backend = "cpu";  // the backend both programs and the cache live on (see make_backend)
  int threads = 0;              // CPU threads counting the caller; 0: one per hardware thread
  // Linear weights quantized to int8 once at load (per output channel, or per group of `quantization_group`
  // input values, a multiple of 8); activations, cache and the other weights stay in `dtype`.
  WeightQuantization quantize = WeightQuantization::None;
  int64_t quantization_group = 0;
  // CPU backend, bf16 weights not quantized: linear weights kept in 12 bits per value without loss
  // (backends/cpu/compact_bf16.h); decoding reads a quarter fewer bytes per token.
  bool compact_bf16 = true;
  std::string prefill_ir;  // exported graphs instead of the native builder
  std::string decode_ir;
};

// Whether a session with these options keeps its linear weights compact (bf16 in 12 bits) for weights stored as
// `dtype`.
bool compact_weights(const SessionOptions& options, DType dtype);

class Session {
 public:
  Session(const ModelDir& model, const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int64_t context() const;
  int64_t position() const { return position_; }  // tokens in the cache
  int64_t vocab_size() const;
  DType dtype() const;
  // "native qwen2, bfloat16, context 4096, prefill chunks up to 128" and the like.
  std::string describe() const;

  // Appends tokens to the context (prefill for many, a decode step for one) and returns the logits after the
  // last of them. Fails when they do not fit in the context.
  std::vector<float> feed(std::span<const int32_t> tokens);
  // Compiles ahead what feeding `tokens` tokens at once will use (native prefill chunks), so that a timed feed
  // measures running, not compiling.
  void prepare(int64_t tokens);
  // Keeps only the first `position` tokens of the context (later ones are overwritten as new tokens come).
  void rewind(int64_t position);

  // Times every kernel of the following feeds; last_timings() is the last program run (the last chunk of a
  // prefill, or a decode step).
  void set_profiling(bool on);
  std::vector<KernelTiming> last_timings() const;

  // A copy of cache `index` (kv_index: even = keys, odd = values of layer index / 2), [1, Hkv, context, D].
  Tensor cache(int64_t index) const;
  int64_t cache_count() const;

  class Engine;

 private:
  std::unique_ptr<Engine> engine_;
  int64_t position_ = 0;
};

}  // namespace npusim
