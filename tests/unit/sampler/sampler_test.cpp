// tests/unit/sampler/sampler_test.cpp: each logits transform against a hand-computed expectation,
// greedy, raw logprobs, seed reproducibility, and the statistics of temperature / top-p draws.
#include "engine/sampler/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"

namespace tessera {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> logs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(float(std::log(p)));
  return out;
}

std::vector<bool> kept(const std::vector<float>& logits) {
  std::vector<bool> out;
  for (float x : logits) out.push_back(x != -kInf);
  return out;
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0, 1, 1};
  Sampler s(p, prompt, 5);
  s.record_generated(4);
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f};
  s.apply_penalties(logits);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f, -2.0f}));
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountGeneratedTokensOnly) {
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 1.0f;
  const std::vector<int32_t> prompt = {0, 0, 0};  // the prompt does not count
  Sampler s(p, prompt, 4);
  s.record_generated(2);
  s.record_generated(2);
  s.record_generated(3);
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  s.apply_penalties(logits);
  // token 2: 1 - (0.5 * 2 + 1) = -1; token 3: 1 - (0.5 * 1 + 1) = -0.5
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 1.0f, -1.0f, -0.5f}));
  EXPECT_EQ(s.num_generated(), 3);
}

// vLLM's order: repetition first, then frequency/presence. The other order would give 0.5.
TEST(Sampler, RepetitionPenaltyComesBeforePresence) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 1.0f;
  Sampler s(p, {}, 2);
  s.record_generated(0);
  std::vector<float> logits = {2.0f, 2.0f};
  s.apply_penalties(logits);
  EXPECT_EQ(logits, (std::vector<float>{0.0f, 2.0f}));  // 2 / 2 - 1
}

TEST(Sampler, Temperature) {
  std::vector<float> logits = {1.0f, -2.0f, 0.0f};
  Sampler::apply_temperature(logits, 0.5f);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -4.0f, 0.0f}));
  Sampler::apply_temperature(logits, 1.0f);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -4.0f, 0.0f}));
}

TEST(Sampler, TopKKeepsTies) {
  std::vector<float> a = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  Sampler::apply_top_k(a, 2);
  EXPECT_EQ(kept(a), (std::vector<bool>{false, true, false, true, false}));
  std::vector<float> b = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  Sampler::apply_top_k(b, 3);
  EXPECT_EQ(kept(b), (std::vector<bool>{false, true, true, true, false}));
  EXPECT_EQ(b[2], 2.0f);  // kept values are untouched
  std::vector<float> c = {1.0f, 3.0f};
  Sampler::apply_top_k(c, 0);
  Sampler::apply_top_k(c, 5);
  EXPECT_EQ(kept(c), (std::vector<bool>{true, true}));
}

TEST(Sampler, TopPKeepsTheTokenThatReachesP) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  auto run = [&](float top_p) {
    std::vector<float> l = logs(probs);
    Sampler::apply_top_p(l, top_p);
    return kept(l);
  };
  EXPECT_EQ(run(0.45f), (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(run(0.7f), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(run(0.85f), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(run(1.0f), (std::vector<bool>{true, true, true, true}));
}

TEST(Sampler, TopPBeyondTheFirstSortedChunk) {
  // Uniform over 1000 tokens: 501 of them are needed to reach 0.5005, so the partial sort has to
  // extend past its first chunks; ties go to the lower id.
  std::vector<float> l(1000, 0.25f);
  Sampler::apply_top_p(l, 0.5005f);
  const std::vector<bool> k = kept(l);
  for (size_t i = 0; i < 1000; ++i) EXPECT_EQ(k[i], i < 501) << i;
}

// The bucketed top-p against a full sort, on peaked and flat random distributions of an awkward
// vocabulary size, with some tokens already masked.
TEST(Sampler, TopPMatchesAFullSortReference) {
  std::mt19937 gen(3);
  for (float scale : {0.5f, 2.0f, 8.0f}) {
    for (float top_p : {0.1f, 0.5f, 0.9f, 0.999f}) {
      std::normal_distribution<float> normal(0.0f, scale);
      std::vector<float> l(5125);
      for (float& x : l) x = normal(gen);
      for (size_t i = 0; i < l.size(); i += 7) l[i] = -kInf;
      std::vector<int32_t> ids;
      for (size_t i = 0; i < l.size(); ++i) {
        if (l[i] != -kInf) ids.push_back(int32_t(i));
      }
      std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
      double total = 0.0;
      for (int32_t i : ids) total += std::exp(double(l[i]));
      std::vector<bool> expect(l.size(), false);
      double cum = 0.0;
      for (int32_t i : ids) {
        expect[size_t(i)] = true;
        cum += std::exp(double(l[i])) / total;
        if (cum >= top_p) break;
      }
      Sampler::apply_top_p(l, top_p);
      EXPECT_EQ(kept(l), expect) << "scale " << scale << " top_p " << top_p;
    }
  }
}

TEST(Sampler, TopPIgnoresMaskedTokens) {
  std::vector<float> l = logs({0.6, 0.3, 0.1});
  l[0] = -kInf;  // renormalised over {0.3, 0.1}: 0.75 / 0.25
  Sampler::apply_top_p(l, 0.7f);
  EXPECT_EQ(kept(l), (std::vector<bool>{false, true, false}));
}

TEST(Sampler, MinPIsRelativeToTheMostLikelyToken) {
  std::vector<float> l = logs({0.5, 0.3, 0.15, 0.05});
  Sampler::apply_min_p(l, 0.2f);  // threshold 0.2 * 0.5 = 0.1
  EXPECT_EQ(kept(l), (std::vector<bool>{true, true, true, false}));
  std::vector<float> m = logs({0.5, 0.3, 0.15, 0.05});
  Sampler::apply_min_p(m, 0.0f);
  EXPECT_EQ(kept(m), (std::vector<bool>{true, true, true, true}));
}

TEST(Sampler, GreedyIsArgmaxAfterPenalties) {
  SamplingParams p;
  p.temperature = 0.0f;
  {
    Sampler s(p, {}, 4);
    std::vector<float> l = {0.1f, 3.0f, 3.0f, -1.0f};
    EXPECT_EQ(s.sample(l).token, 1);  // tie: lowest id
  }
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {1};
  Sampler s(p, prompt, 4);
  std::vector<float> l = {2.0f, 3.0f, 1.0f, -1.0f};  // token 1 -> 1.5
  EXPECT_EQ(s.sample(l).token, 0);
  std::vector<float> l2 = {2.0f, 3.0f, 1.0f, -1.0f};  // token 0 now generated too -> 1.0
  EXPECT_EQ(s.sample(l2).token, 1);
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 10.0f;  // log 0.7 * 10 < log 0.2
  p.logprobs = 2;
  const std::vector<int32_t> prompt = {2};
  Sampler s(p, prompt, 3);
  std::vector<float> l = logs({0.2, 0.1, 0.7});
  const SampledToken t = s.sample(l);
  EXPECT_EQ(t.token, 0);  // the penalty pushed token 2 down...
  EXPECT_NEAR(t.logprob, std::log(0.2), 1e-6);  // ...but logprobs are before penalties
  ASSERT_EQ(t.top_logprobs.size(), 2u);
  EXPECT_EQ(t.top_logprobs[0].token, 2);
  EXPECT_NEAR(t.top_logprobs[0].logprob, std::log(0.7), 1e-6);
  EXPECT_EQ(t.top_logprobs[1].token, 0);
  EXPECT_NEAR(t.top_logprobs[1].logprob, std::log(0.2), 1e-6);

  SamplingParams q;
  q.temperature = 0.5f;
  q.logprobs = 0;
  q.seed = 1;
  Sampler s2(q, {}, 3);
  std::vector<float> l2 = {0.0f, 0.0f, 0.0f};
  const SampledToken t2 = s2.sample(l2);
  EXPECT_NEAR(t2.logprob, std::log(1.0 / 3.0), 1e-6);  // temperature does not change it
  EXPECT_TRUE(t2.top_logprobs.empty());

  SamplingParams none;
  none.seed = 1;
  Sampler s3(none, {}, 3);
  std::vector<float> l3 = {0.0f, 0.0f, 0.0f};
  EXPECT_TRUE(std::isnan(s3.sample(l3).logprob));
}

TEST(Sampler, TopLogprobsOrderAndShiftInvariance) {
  const std::vector<float> l = {1.0f, 5.0f, 3.0f, 5.0f};
  const std::vector<TokenLogprob> top = Sampler::top_logprobs(l, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_EQ(top[1].token, 3);
  EXPECT_EQ(top[2].token, 2);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  EXPECT_NEAR(top[2].logprob, 3.0 - std::log(z), 1e-6);
  const std::vector<float> big = {1001.0f, 1005.0f, 1003.0f, 1005.0f};  // no overflow
  EXPECT_NEAR(Sampler::top_logprobs(big, 1)[0].logprob, top[0].logprob, 1e-5);
  EXPECT_EQ(Sampler::top_logprobs(l, 10).size(), 4u);
}

std::vector<int32_t> draw_sequence(const SamplingParams& p, int n, uint32_t logits_seed) {
  const int32_t vocab = 257;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  Sampler s(p, prompt, vocab);
  std::mt19937 gen(logits_seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<int32_t> out;
  std::vector<float> l(vocab);
  for (int i = 0; i < n; ++i) {
    for (float& x : l) x = normal(gen);
    out.push_back(s.sample(l).token);
  }
  return out;
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.top_k = 50;
  p.repetition_penalty = 1.1f;
  p.seed = 1234;
  const std::vector<int32_t> a = draw_sequence(p, 200, 7);
  EXPECT_EQ(a, draw_sequence(p, 200, 7));
  p.seed = 1235;
  EXPECT_NE(a, draw_sequence(p, 200, 7));
  SamplingParams unseeded;
  Sampler s1(unseeded, {}, 4), s2(unseeded, {}, 4);
  EXPECT_NE(s1.seed(), s2.seed());  // drawn from std::random_device
}

std::vector<double> frequencies(const SamplingParams& p, const std::vector<float>& logits, int draws) {
  Sampler s(p, {}, int32_t(logits.size()));
  std::vector<double> freq(logits.size(), 0.0);
  std::vector<float> l;
  for (int i = 0; i < draws; ++i) {
    l = logits;
    freq[size_t(s.sample(l).token)] += 1.0 / draws;
  }
  return freq;
}

// With 40k draws the standard error of a frequency is <= 0.0025; 0.01 is 4 sigma.
TEST(Sampler, TemperatureDrawsMatchTheScaledDistribution) {
  const std::vector<float> l = logs({0.5, 0.3, 0.2});
  SamplingParams p;
  p.seed = 42;
  std::vector<double> f = frequencies(p, l, 40000);
  EXPECT_NEAR(f[0], 0.5, 0.01);
  EXPECT_NEAR(f[1], 0.3, 0.01);
  EXPECT_NEAR(f[2], 0.2, 0.01);
  // T = 0.5 squares the probabilities: 0.25, 0.09, 0.04 over 0.38.
  p.temperature = 0.5f;
  f = frequencies(p, l, 40000);
  EXPECT_NEAR(f[0], 0.25 / 0.38, 0.01);
  EXPECT_NEAR(f[1], 0.09 / 0.38, 0.01);
  EXPECT_NEAR(f[2], 0.04 / 0.38, 0.01);
  // A high temperature flattens towards uniform.
  p.temperature = 100.0f;
  f = frequencies(p, l, 40000);
  for (double x : f) EXPECT_NEAR(x, 1.0 / 3.0, 0.015);  // exact: 0.336, 0.335, 0.329
}

// min-p and top-p see the temperature-scaled distribution.
TEST(Sampler, TruncationAppliesAfterTemperature) {
  const std::vector<float> l = logs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.seed = 11;
  p.temperature = 0.5f;  // probabilities become 0.25, 0.09, 0.0225, 0.0025 (unnormalised)
  p.min_p = 0.1f;        // ratios to the max: 1, 0.36, 0.09, 0.01 -> keeps tokens 0 and 1
  std::vector<double> f = frequencies(p, l, 4000);
  EXPECT_GT(f[1], 0.0);
  EXPECT_EQ(f[2], 0.0);  // at T = 1 its ratio 0.3 would have passed min_p = 0.1
  EXPECT_EQ(f[3], 0.0);
}

TEST(Sampler, TopPDrawsStayInTheNucleus) {
  const std::vector<float> l = logs({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.seed = 7;
  p.top_p = 0.75f;  // keeps {0.5, 0.3}: renormalised 0.625 / 0.375
  std::vector<double> f = frequencies(p, l, 40000);
  EXPECT_NEAR(f[0], 0.625, 0.01);
  EXPECT_NEAR(f[1], 0.375, 0.01);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_EQ(f[3], 0.0);
  p.top_p = 1.0f;
  p.top_k = 1;  // top-k 1 is greedy
  f = frequencies(p, l, 1000);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
}

TEST(Sampler, ChecksItsInputs) {
  SamplingParams p;
  EXPECT_THROW(Sampler(p, {}, 0), Error);
  const std::vector<int32_t> bad_prompt = {7};
  p.repetition_penalty = 1.2f;
  EXPECT_THROW(Sampler(p, bad_prompt, 4), Error);
  p.stop_token_ids = {4};
  EXPECT_THROW(Sampler(p, {}, 4), Error);
  p.stop_token_ids = {};
  p.top_p = 2.0f;
  EXPECT_THROW(Sampler(p, {}, 4), Error);
  p.top_p = 1.0f;
  Sampler s(p, {}, 4);
  std::vector<float> l(5, 0.0f);
  EXPECT_THROW(s.sample(l), Error);
  EXPECT_THROW(s.record_generated(4), Error);
}

// A device sampler gets the same uniform the host draw would use, and the penalty lists.
TEST(Sampler, SpecDrawsTheHostUniformAndListsPenaltyTokens) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.5f;
  p.logprobs = 3;
  const std::vector<int32_t> prompt = {1, 2, 2};
  Sampler a(p, prompt, 8);
  Sampler b(p, prompt, 8);
  // Host: one sample() consumes one 64-bit draw; the spec of the twin sampler carries that draw.
  std::vector<float> logits = {0.1f, 0.5f, 0.2f, 2.0f, 0.3f, 0.9f, 0.0f, 1.5f};
  const SampledToken host = a.sample(logits);
  SampleSpec spec = b.spec();
  std::mt19937_64 rng(42);
  EXPECT_DOUBLE_EQ(spec.uniform, double(rng() >> 11) * 0x1.0p-53);
  EXPECT_FLOAT_EQ(spec.temperature, 0.7f);
  EXPECT_EQ(spec.num_top_logprobs, 3);
  std::vector<int32_t> listed(spec.penalty_tokens.begin(), spec.penalty_tokens.end());
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(listed, (std::vector<int32_t>{1, 2}));
  for (int32_t c : spec.penalty_counts) EXPECT_EQ(c, 0);  // prompt tokens only so far
  // Accepting the host's choice leaves both samplers in the same state.
  SampleOutcome outcome;
  outcome.token = host.token;
  outcome.logprob = host.logprob;
  const SampledToken accepted = b.accept(outcome);
  EXPECT_EQ(accepted.token, host.token);
  spec = b.spec();
  bool found = false;
  for (size_t i = 0; i < spec.penalty_tokens.size(); ++i) {
    if (spec.penalty_tokens[i] == host.token) {
      found = true;
      EXPECT_EQ(spec.penalty_counts[i], 1);
    }
  }
  EXPECT_TRUE(found);
  // Greedy requests draw nothing: the RNG is untouched, as sample() leaves it.
  p.temperature = 0.0f;
  Sampler g(p, prompt, 8);
  EXPECT_EQ(g.spec().uniform, 0.0);
  EXPECT_EQ(g.spec().temperature, 0.0f);
}

TEST(Sampler, MaskUntilKeepsStopTokensOutForMinTokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 1;
  Sampler s(p, {}, 4);
  s.mask_until({2}, 2);
  // Token 2 is the most likely, but masked for the first two tokens, logprobs included.
  std::vector<float> logits = {0.0f, 1.0f, 5.0f, 0.5f};
  SampledToken a = s.sample(logits);
  EXPECT_EQ(a.token, 1);
  EXPECT_EQ(a.top_logprobs[0].token, 1);
  EXPECT_EQ(s.spec().masked_tokens.size(), 1u);  // spec() of the second token still masks
  logits = {0.0f, 1.0f, 5.0f, 0.5f};
  EXPECT_EQ(s.sample(logits).token, 1);
  EXPECT_TRUE(s.spec().masked_tokens.empty());
  logits = {0.0f, 1.0f, 5.0f, 0.5f};
  EXPECT_EQ(s.sample(logits).token, 2);
}

TEST(Sampler, AllowedTokensMaskEverythingElseLogprobsIncluded) {
  // 40 logits (two bitmask words, the second partly past the vocabulary); tokens 3 and 33 allowed.
  std::vector<float> logits(40, 0.0f);
  logits[7] = 9.0f;  // the most likely, but not allowed
  logits[3] = 1.0f;
  logits[33] = 2.0f;
  std::vector<int32_t> allowed = {1 << 3, 1 << 1};
  SampleSpec spec;
  spec.num_top_logprobs = 3;
  spec.allowed_tokens = allowed;
  std::vector<float> greedy = logits;
  const SampleOutcome g = sample_on_host(greedy, spec);
  EXPECT_EQ(g.token, 33);
  // The constrained distribution: p(33) = e^2 / (e^1 + e^2).
  EXPECT_NEAR(g.logprob, 2.0 - std::log(std::exp(1.0) + std::exp(2.0)), 1e-5);
  EXPECT_EQ(g.top[0].first, 33);
  EXPECT_EQ(g.top[1].first, 3);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> row = logits;
    spec.temperature = 1.5f;
    spec.uniform = i / 50.0;
    const int32_t t = sample_on_host(row, spec).token;
    EXPECT_TRUE(t == 3 || t == 33) << "draw " << i << " gave " << t;
  }
}

}  // namespace
}  // namespace tessera
