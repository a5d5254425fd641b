#pragma once
// The CPU backend: every node gets a kernel chosen and parameterized at prepare time; nodes without one run the
// registry's reference implementation on converted copies (the fallback), and the prepared program says which.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace npusim::cpu {

using npusim::WeightQuantization;

struct CpuOptions {
  int threads = 0;  // counting the calling thread; 0: one per hardware thread
  // Fill all activation memory with 0xff bytes (NaN for floats, -1 for integers, 255 for bools) before every run,
  // so that an element a kernel forgets to write, or a value read before it is written, shows in the outputs.
  bool poison_memory = false;
  WeightQuantization weights = WeightQuantization::None;
  int64_t quantization_group = 0;  // 0: one scale per output channel
  // A directory of packed-weights files (see pack_cache.h): a program prepared again maps what an earlier preparation
  // packed instead of packing again. Empty: pack at every preparation.
  std::string pack_cache;
  // Constant bf16 linear weights kept in 12 bits per value without loss (compact_bf16.h); a weight with too many
  // values far below its rows' largest stays as it is.
  bool compact_bf16 = false;
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(CpuOptions options = {}) : options_(options) {}
  BackendCapabilities capabilities() const override;
  std::unique_ptr<PreparedProgram> prepare(const Program& program,
                                           const std::vector<std::pair<ValueId, Tensor>>& weights) override;
  std::unique_ptr<PreparedProgram> prepare_with_state(const Program& program,
                                                      const std::vector<std::pair<ValueId, Tensor>>& weights,
                                                      const std::vector<std::pair<std::string, std::string>>& state,
                                                      const PreparedProgram* share_with = nullptr) override;

 private:
  CpuOptions options_;
};

}  // namespace npusim::cpu
