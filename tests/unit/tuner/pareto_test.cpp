// tests/unit/tuner/pareto_test.cpp: the front and the policies on made-up measurements, with the
// answers worked out by hand; NSGA-II on a made-up space.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "tuner/pareto.h"

namespace tessera::tuner {
namespace {

using ::testing::HasSubstr;

// A decoder measurement: decode latency, perplexity, memory in MiB.
Measurement point(const std::string& format, double latency_ms, double ppl, double memory_mb) {
  Measurement m;
  m.candidate.weight_format = format;
  m.decode = {Timing{1, latency_ms, latency_ms, latency_ms}};
  m.prefill = {Timing{128, 10 * latency_ms, 10 * latency_ms, 10 * latency_ms}};
  m.perplexity = ppl;
  m.weight_bytes = static_cast<int64_t>(memory_mb * 1024 * 1024);
  return m;
}

std::vector<Measurement> sample() {
  return {
      point("f32", 10.0, 20.00, 500),   // 0: reference: best quality, slowest, biggest
      point("f16", 6.0, 20.01, 260),    // 1: front
      point("q8_0", 4.0, 20.10, 140),   // 2: front (within 1%)
      point("q4_1", 3.0, 20.50, 90),    // 3: front (2.5% worse)
      point("q4_0", 3.2, 21.50, 80),    // 4: front only by memory
      point("bf16", 6.5, 20.02, 260),   // 5: dominated by 1
  };
}

TEST(Pareto, DominanceNeedsNoWorseEverywhereAndBetterSomewhere) {
  const auto ms = sample();
  EXPECT_TRUE(dominates(ms[1], ms[5]));
  EXPECT_FALSE(dominates(ms[5], ms[1]));
  EXPECT_FALSE(dominates(ms[1], ms[1]));
  EXPECT_FALSE(dominates(ms[2], ms[3]));
  Measurement failed = point("q4_0", 1.0, 1.0, 1.0);
  failed.error = "boom";
  EXPECT_TRUE(dominates(ms[4], failed));
  EXPECT_FALSE(dominates(failed, ms[4]));
}

TEST(Pareto, FrontIsEveryNonDominatedPoint) {
  auto ms = sample();
  EXPECT_EQ(pareto_front(ms), (std::vector<size_t>{0, 1, 2, 3, 4}));
  ms.push_back(point("q4_1", 2.0, 20.05, 70));  // dominates 2, 3, 4 and 5; not 0 or 1 (better perplexity)
  EXPECT_EQ(pareto_front(ms), (std::vector<size_t>{0, 1, 6}));
}

TEST(Pareto, FastestDecodeWithinPerplexityBudget) {
  const auto ms = sample();
  Policy p{Policy::Kind::kFastestDecodeWithinPplPct, 1.0};
  PolicyChoice c = choose(ms, p, ms[0]);
  EXPECT_EQ(c.index, 2u) << c.reason;  // q8_0: 20.10 <= 20.20; q4_1's 20.50 is over
  EXPECT_THAT(c.reason, HasSubstr("within 1% of the reference perplexity 20"));
  p.value = 3.0;
  EXPECT_EQ(choose(ms, p, ms[0]).index, 3u);  // q4_1 (3.0 ms) beats q4_0 (3.2 ms, and 7.5% over anyway)
  p.value = 10.0;
  EXPECT_EQ(choose(ms, p, ms[0]).index, 3u);
  p.value = 0.0;
  EXPECT_EQ(choose(ms, p, ms[0]).index, 0u);  // only the reference itself
}

TEST(Pareto, BestQualityWithinMemory) {
  const auto ms = sample();
  Policy p{Policy::Kind::kBestQualityWithinMemoryMb, 100.0};
  EXPECT_EQ(choose(ms, p, ms[0]).index, 3u);  // q4_1 (90 MiB) is better than q4_0 (80 MiB)
  p.value = 270.0;
  EXPECT_EQ(choose(ms, p, ms[0]).index, 1u);  // f16: 20.01
  p.value = 50.0;
  EXPECT_THAT([&] { choose(ms, p, ms[0]); }, ::testing::ThrowsMessage<Error>(
                                                 HasSubstr("no measured candidate meets best_quality_within_memory_mb: 50")));
}

TEST(Pareto, TiesGoToTheSmallerMemory) {
  std::vector<Measurement> ms{point("f32", 5.0, 20.0, 500), point("q8_0", 4.0, 20.0, 140), point("f16", 4.0, 20.0, 260)};
  EXPECT_EQ(choose(ms, Policy{Policy::Kind::kFastestDecodeWithinPplPct, 1.0}, ms[0]).index, 1u);
}

// Random weights: no quality; the front is latency x memory and the policies pick the fastest
// (within a memory budget where the policy has one).
TEST(Pareto, WithoutQualityThePolicyPicksTheFastestWithinMemory) {
  std::vector<Measurement> ms{point("bf16", 10.0, 0, 13000), point("int8", 6.0, 0, 7000),
                              point("int4_g128", 4.0, 0, 4000), point("fp8_e4m3", 6.5, 0, 7000)};
  for (Measurement& m : ms) m.quality_measured = false;
  ms[2].perplexity = 1e9;  // ignored: not measured
  EXPECT_EQ(pareto_front(ms), (std::vector<size_t>{2}));
  const PolicyChoice fastest = choose(ms, Policy{Policy::Kind::kFastestDecodeWithinPplPct, 1.0}, ms[0]);
  EXPECT_EQ(fastest.index, 2u);
  EXPECT_THAT(fastest.reason, HasSubstr("quality not measurable (random weights)"));
  EXPECT_EQ(choose(ms, Policy{Policy::Kind::kBestQualityWithinMemoryMb, 8000}, ms[0]).index, 2u);
  ms[2].weight_bytes = int64_t{9000} << 20;
  EXPECT_EQ(choose(ms, Policy{Policy::Kind::kBestQualityWithinMemoryMb, 8000}, ms[0]).index, 1u);
  EXPECT_THROW(choose(ms, Policy{Policy::Kind::kBestQualityWithinMemoryMb, 100}, ms[0]), Error);
}

TEST(Pareto, UnmeasuredQualityIsNullInTheRecordAndReadBack) {
  Measurement m = point("int8", 6.0, 0, 7000);
  m.quality_measured = false;
  const nlohmann::json j = m.to_json();
  EXPECT_TRUE(j.at("perplexity").is_null());
  EXPECT_TRUE(j.at("kl").is_null());
  const Measurement back = Measurement::from_json(j);
  EXPECT_FALSE(back.quality_measured);
  EXPECT_DOUBLE_EQ(back.latency_ms(), 6.0);
  EXPECT_TRUE(Measurement::from_json(point("int8", 6.0, 20.5, 7000).to_json()).quality_measured);
}

TEST(Pareto, PoliciesRefuseTheWrongKindOfModel) {
  const auto ms = sample();
  EXPECT_THAT([&] { choose(ms, Policy{Policy::Kind::kFastestWithinCosine, 0.99}, ms[0]); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is for encoders")));
  Measurement enc;
  enc.prefill = {Timing{128, 5, 5, 5}};
  enc.cosine = 1.0;
  Measurement enc_q = enc;
  enc_q.prefill = {Timing{128, 3, 3, 3}};
  enc_q.cosine = 0.995;
  std::vector<Measurement> encs{enc, enc_q};
  EXPECT_EQ(choose(encs, Policy{Policy::Kind::kFastestWithinCosine, 0.99}, enc).index, 1u);
  EXPECT_EQ(choose(encs, Policy{Policy::Kind::kFastestWithinCosine, 0.999}, enc).index, 0u);
  EXPECT_THAT([&] { choose(encs, Policy{Policy::Kind::kFastestDecodeWithinPplPct, 1}, enc); },
              ::testing::ThrowsMessage<Error>(HasSubstr("needs a decoder's perplexity")));
}

// NSGA-II over a 4 x 2 x 2 x 3 space with a made-up cost: it must stay inside the space, evaluate
// within its budget, and find the one candidate that is best in every objective.
TEST(Pareto, Nsga2SearchesTheSpaceAndFindsTheDominatingPoint) {
  const TuneSpace space = parse_space(R"(
weight_format: [f32, f16, q8_0, q4_0]
fusions: {add_rms_norm: [fused, separate], qkv: [fused, separate]}
kernels: {threads: [1, 2, 4]}
search: {exhaustive_max: 4, population: 16, generations: 12, seed: 7}
)", "space.yaml");
  ASSERT_EQ(space.size(), 48);
  std::map<std::string, Measurement> seen;
  int calls = 0;
  const std::function<Measurement(const Candidate&)> evaluate = [&](const Candidate& c) {
    ++calls;
    auto it = seen.find(c.key());
    if (it != seen.end()) return it->second;
    const double format = c.weight_format == "q4_0" ? 0 : c.weight_format == "q8_0" ? 1 : c.weight_format == "f16" ? 2 : 3;
    const double penalty = (c.fuse_add_rms_norm ? 0 : 1) + (c.fuse_qkv ? 0 : 1) + (4 - c.threads) * 0.5;
    // q8_0, fused, 4 threads is best everywhere: q4_0 loses quality, larger formats lose speed and memory.
    Measurement m = point(c.weight_format, 1 + std::abs(format - 1) + penalty, 20 + std::abs(format - 1) + penalty,
                          100 + 10 * std::abs(format - 1) + penalty);
    m.candidate = c;
    return seen[c.key()] = m;
  };
  nsga2_search(space, evaluate);
  EXPECT_GT(calls, 0);
  EXPECT_LE(static_cast<int64_t>(seen.size()), space.size());
  std::vector<Measurement> visited;
  for (const auto& [key, m] : seen) visited.push_back(m);
  const std::vector<size_t> front = pareto_front(visited);
  ASSERT_EQ(front.size(), 1u);
  EXPECT_EQ(visited[front[0]].candidate.key(), "q8_0/kv=f32/arn=fused/qkv=fused/gu=fused/rope=separate/graphs=off/t4");
  EXPECT_EQ(nsga2_budget(space), 48);
}

}  // namespace
}  // namespace tessera::tuner
