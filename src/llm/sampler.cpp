#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "npusim/error.h"

namespace npusim {

namespace {

struct Candidate {
  int32_t token;
  double score;  // processed logit, then probability
};

bool before(const Candidate& a, const Candidate& b) {
  return a.score != b.score ? a.score > b.score : a.token < b.token;
}

// The logits after the repetition penalty: a repeated token's logit is divided by the penalty when positive and
// multiplied by it when negative (Hugging Face RepetitionPenaltyLogitsProcessor). NaN counts as -inf.
std::vector<double> penalized(std::span<const float> logits, std::span<const int32_t> history, double penalty) {
  std::vector<double> scores(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    scores[i] = std::isnan(logits[i]) ? -std::numeric_limits<double>::infinity() : static_cast<double>(logits[i]);
  if (penalty == 1.0) return scores;
  std::vector<bool> seen(logits.size(), false);
  for (int32_t token : history) {
    if (token < 0 || static_cast<size_t>(token) >= scores.size() || seen[static_cast<size_t>(token)]) continue;
    seen[static_cast<size_t>(token)] = true;
    double& score = scores[static_cast<size_t>(token)];
    score = score < 0 ? score * penalty : score / penalty;
  }
  return scores;
}

void softmax(std::vector<Candidate>& candidates) {
  const double peak = candidates.front().score;  // sorted, largest first
  double sum = 0;
  for (Candidate& c : candidates) sum += c.score = std::exp(c.score - peak);
  for (Candidate& c : candidates) c.score /= sum;
}

// The tokens left after temperature, top-k, top-p and min-p, with their probabilities, most likely first.
std::vector<Candidate> distribution(const SamplingOptions& options, std::span<const float> logits,
                                    std::span<const int32_t> history) {
  const std::vector<double> scores = penalized(logits, history, options.repetition_penalty);
  std::vector<Candidate> candidates;
  candidates.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i)
    if (scores[i] != -std::numeric_limits<double>::infinity())
      candidates.push_back({static_cast<int32_t>(i), scores[i] / options.temperature});
  if (candidates.empty()) fail("sampling: every logit is -inf or NaN");

  if (options.top_k > 0 && static_cast<size_t>(options.top_k) < candidates.size()) {
    // Hugging Face keeps every token whose score ties the k-th largest.
    std::nth_element(candidates.begin(), candidates.begin() + (options.top_k - 1), candidates.end(), before);
    const double kth = candidates[static_cast<size_t>(options.top_k - 1)].score;
    std::erase_if(candidates, [kth](const Candidate& c) { return c.score < kth; });
  }
  std::sort(candidates.begin(), candidates.end(), before);
  softmax(candidates);

  if (options.top_p < 1.0) {
    // Drop the least likely tokens while their total stays at most 1 - top_p; the most likely always stays.
    double tail = 0;
    size_t keep = candidates.size();
    while (keep > 1) {
      tail += candidates[keep - 1].score;
      if (tail > 1.0 - options.top_p) break;
      --keep;
    }
    candidates.resize(keep);
  }
  if (options.min_p > 0.0) {
    const double floor = options.min_p * candidates.front().score;
    std::erase_if(candidates, [floor](const Candidate& c) { return c.score < floor; });
  }
  double total = 0;
  for (const Candidate& c : candidates) total += c.score;
  for (Candidate& c : candidates) c.score /= total;
  return candidates;
}

int32_t greedy_token(std::span<const float> logits, std::span<const int32_t> history, double penalty) {
  if (penalty == 1.0) return argmax(logits);
  const std::vector<double> scores = penalized(logits, history, penalty);
  size_t best = 0;
  for (size_t i = 1; i < scores.size(); ++i)
    if (scores[i] > scores[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

int32_t argmax(std::span<const float> values) {
  if (values.empty()) fail("argmax of an empty row");
  size_t best = 0;
  for (size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[best] || (std::isnan(values[best]) && !std::isnan(values[i]))) best = i;
  return static_cast<int32_t>(best);
}

void check_sampling_options(const SamplingOptions& options) {
  const auto bad = [](const std::string& what) { fail("sampling: " + what); };
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature))
    bad("temperature must be a finite number >= 0, got " + std::to_string(options.temperature));
  if (options.top_k < 0) bad("top-k must be >= 0 (0 turns it off), got " + std::to_string(options.top_k));
  if (!(options.top_p > 0.0 && options.top_p <= 1.0))
    bad("top-p must be in (0, 1] (1 turns it off), got " + std::to_string(options.top_p));
  if (!(options.min_p >= 0.0 && options.min_p <= 1.0))
    bad("min-p must be in [0, 1] (0 turns it off), got " + std::to_string(options.min_p));
  if (!(options.repetition_penalty > 0.0) || !std::isfinite(options.repetition_penalty))
    bad("the repetition penalty must be > 0 (1 turns it off), got " + std::to_string(options.repetition_penalty));
}

Sampler::Sampler(SamplingOptions options) : options_(options), state_(options.seed) {
  check_sampling_options(options_);
}

double Sampler::next_uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) fail("sampling: empty logits");
  if (options_.greedy()) return greedy_token(logits, history, options_.repetition_penalty);
  const std::vector<Candidate> candidates = distribution(options_, logits, history);
  const double u = next_uniform();
  double cumulative = 0;
  for (const Candidate& c : candidates) {
    cumulative += c.score;
    if (u < cumulative) return c.token;
  }
  return candidates.back().token;  // rounding left the sum a hair below u
}

std::vector<double> Sampler::probabilities(std::span<const float> logits, std::span<const int32_t> history) const {
  std::vector<double> result(logits.size(), 0.0);
  if (logits.empty()) return result;
  if (options_.greedy()) {
    result[static_cast<size_t>(greedy_token(logits, history, options_.repetition_penalty))] = 1.0;
    return result;
  }
  for (const Candidate& c : distribution(options_, logits, history)) result[static_cast<size_t>(c.token)] = c.score;
  return result;
}

}  // namespace npusim
