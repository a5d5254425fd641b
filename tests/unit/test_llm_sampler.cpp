// Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty and seeds, on small logit rows whose
// probabilities are worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "llm/sampler.h"
#include "npusim/error.h"

namespace npusim {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// softmax of `logits` / temperature, in double.
std::vector<double> softmax(const std::vector<float>& logits, double temperature = 1.0) {
  double peak = -std::numeric_limits<double>::infinity();
  for (float v : logits) peak = std::max(peak, v / temperature);
  std::vector<double> p;
  double sum = 0;
  for (float v : logits) sum += p.emplace_back(std::exp(v / temperature - peak));
  for (double& v : p) v /= sum;
  return p;
}

// `tolerance` covers logits written as fp32 logarithms of exact probabilities.
void expect_probabilities(const std::vector<double>& actual, const std::vector<double>& expected,
                          double tolerance = 1e-12) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], tolerance) << "token " << i;
}

TEST(Argmax, FirstOfEqualValuesAndNaNNeverWins) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 2}), 1);
  EXPECT_EQ(argmax(std::vector<float>{5, 5, 1}), 0);
  EXPECT_EQ(argmax(std::vector<float>{NAN, -1, -2}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -kInf, 0}), 2);
  EXPECT_THROW(argmax(std::vector<float>{}), Error);
}

TEST(Sampler, GreedyTakesTheArgmaxWhateverTheSeed) {
  const std::vector<float> logits{0.1f, 2.5f, -1.0f, 2.4f};
  for (uint64_t seed : {0, 1, 99}) {
    Sampler sampler({.temperature = 0.0, .top_k = 1, .seed = seed});
    for (int i = 0; i < 5; ++i) EXPECT_EQ(sampler.sample(logits, {}), 1);
  }
  Sampler greedy({});
  expect_probabilities(greedy.probabilities(logits, {}), {0, 1, 0, 0});
}

TEST(Sampler, TemperatureScalesLogitsBeforeSoftmax) {
  const std::vector<float> logits{1.0f, 2.0f, 0.0f};
  for (double t : {0.5, 1.0, 2.0}) {
    Sampler sampler({.temperature = t});
    expect_probabilities(sampler.probabilities(logits, {}), softmax(logits, t));
  }
}

TEST(Sampler, TopKKeepsTheKLargestAndTiesWithTheKth) {
  const std::vector<float> logits{3.0f, 1.0f, 2.0f, 0.0f, 2.0f};
  Sampler top1({.temperature = 1.0, .top_k = 1});
  expect_probabilities(top1.probabilities(logits, {}), {1, 0, 0, 0, 0});
  // k = 2: the second largest (2.0) is tied by token 4, which stays too.
  Sampler top2({.temperature = 1.0, .top_k = 2});
  const double a = std::exp(3.0), b = std::exp(2.0), sum = a + 2 * b;
  expect_probabilities(top2.probabilities(logits, {}), {a / sum, 0, b / sum, 0, b / sum});
  // k beyond the vocabulary keeps everything.
  Sampler top9({.temperature = 1.0, .top_k = 9});
  expect_probabilities(top9.probabilities(logits, {}), softmax(logits));
}

TEST(Sampler, TopPKeepsTheSmallestHeadCoveringP) {
  // Probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logs).
  const std::vector<float> logits{std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)};
  Sampler p70({.temperature = 1.0, .top_p = 0.7});  // 0.5 + 0.25 >= 0.7
  expect_probabilities(p70.probabilities(logits, {}), {2.0 / 3, 1.0 / 3, 0, 0}, 1e-7);
  Sampler p40({.temperature = 1.0, .top_p = 0.4});  // the most likely alone covers 0.4
  expect_probabilities(p40.probabilities(logits, {}), {1, 0, 0, 0});
  Sampler p90({.temperature = 1.0, .top_p = 0.9});  // the smallest alone (0.125) exceeds 1 - 0.9: all stay
  expect_probabilities(p90.probabilities(logits, {}), {0.5, 0.25, 0.125, 0.125}, 1e-7);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTop) {
  const std::vector<float> logits{std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  Sampler sampler({.temperature = 1.0, .min_p = 0.25});  // floor 0.15: token 2 goes
  expect_probabilities(sampler.probabilities(logits, {}), {0.6 / 0.9, 0.3 / 0.9, 0}, 1e-7);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  const std::vector<float> logits{2.0f, -1.0f, 1.9f, 0.5f};
  // Token 0 (2.0 -> 1.0) and token 1 (-1 -> -2) were seen, once or twice: the penalty applies once.
  Sampler sampler({.temperature = 1.0, .repetition_penalty = 2.0});
  const std::vector<int32_t> history{0, 1, 0, 77, -3};  // ids outside the vocabulary are ignored
  expect_probabilities(sampler.probabilities(logits, history), softmax({1.0f, -2.0f, 1.9f, 0.5f}));
  // Greedy too: the penalty moves the argmax from token 0 to token 2.
  Sampler greedy({.repetition_penalty = 2.0});
  EXPECT_EQ(greedy.sample(logits, history), 2);
  EXPECT_EQ(greedy.sample(logits, {}), 0);
}

TEST(Sampler, ProcessorsComposeInHuggingFaceOrder) {
  // temperature 0.5 doubles the logits, top-k 3 drops token 3, top-p 0.9 then drops the smallest survivor.
  const std::vector<float> logits{1.0f, 0.5f, 0.0f, -3.0f};
  Sampler sampler({.temperature = 0.5, .top_k = 3, .top_p = 0.9});
  const double a = std::exp(2.0), b = std::exp(1.0), c = std::exp(0.0);
  const double sum = a + b + c;
  ASSERT_LT(c / sum, 0.1);  // the tail token alone stays under 1 - top_p
  expect_probabilities(sampler.probabilities(logits, {}), {a / (a + b), b / (a + b), 0, 0});
}

TEST(Sampler, SameSeedSameTokensAndFrequenciesFollowTheDistribution) {
  const std::vector<float> logits{0.0f, std::log(3.0f), -kInf, NAN};  // probabilities 0.25, 0.75, 0, 0
  Sampler first({.temperature = 1.0, .seed = 42});
  Sampler second({.temperature = 1.0, .seed = 42});
  std::map<int32_t, int> counts;
  std::vector<int32_t> a, b;
  for (int i = 0; i < 4000; ++i) {
    a.push_back(first.sample(logits, {}));
    b.push_back(second.sample(logits, {}));
    ++counts[a.back()];
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_EQ(counts.count(3), 0u);
  EXPECT_NEAR(counts[1] / 4000.0, 0.75, 0.03);
  Sampler other({.temperature = 1.0, .seed = 43});
  std::vector<int32_t> c;
  for (int i = 0; i < 4000; ++i) c.push_back(other.sample(logits, {}));
  EXPECT_NE(a, c);
}

TEST(Sampler, RejectsBadOptionsAndRows) {
  EXPECT_THROW(Sampler({.temperature = -1.0}), Error);
  EXPECT_THROW(Sampler({.temperature = NAN}), Error);
  EXPECT_THROW(Sampler({.top_k = -1}), Error);
  EXPECT_THROW(Sampler({.top_p = 0.0}), Error);
  EXPECT_THROW(Sampler({.top_p = 1.5}), Error);
  EXPECT_THROW(Sampler({.min_p = -0.1}), Error);
  EXPECT_THROW(Sampler({.repetition_penalty = 0.0}), Error);
  Sampler sampler({.temperature = 1.0});
  EXPECT_THROW(sampler.sample(std::vector<float>{}, {}), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{-kInf, NAN}, {}), Error);
}

}  // namespace
}  // namespace npusim
