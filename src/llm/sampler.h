#pragma once
// Picks the next token from a row of logits: greedy (temperature 0), or sampling after the Hugging Face
// processors in their order: repetition penalty, temperature, top-k, top-p, min-p. The random stream is the
// sampler's own (splitmix64 seeded by `seed`), so a seed gives the same tokens on every platform.
#include <cstdint>
#include <span>
#include <vector>

namespace npusim {

struct SamplingOptions {
  double temperature = 0.0;         // 0: greedy
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double min_p = 0.0;               // 0: off
  double repetition_penalty = 1.0;  // 1: off; applies to every token of `history`
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0; }
};

// Fails with the option's name when a value is out of range (negative temperature, top_p outside (0, 1], ...).
void check_sampling_options(const SamplingOptions& options);

class Sampler {
 public:
  explicit Sampler(SamplingOptions options);

  // The next token. `history` holds the tokens so far (prompt and generated) for the repetition penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  // The probabilities sampling draws from (after every processor), zero for filtered tokens; greedy gives 1 on
  // the argmax. For tests and for inspecting a distribution.
  std::vector<double> probabilities(std::span<const float> logits, std::span<const int32_t> history) const;

  const SamplingOptions& options() const { return options_; }

 private:
  double next_uniform();  // in [0, 1)

  SamplingOptions options_;
  uint64_t state_;
};

// The index of the largest value (the first of equal ones); NaN never wins.
int32_t argmax(std::span<const float> values);

}  // namespace npusim
