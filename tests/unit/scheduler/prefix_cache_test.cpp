// tests/unit/scheduler/prefix_cache_test.cpp: prefix caching through the EngineLoop on the CPU
// backend with the tiny Llama fixture. A request sharing a 1,000-token prefix with an earlier one
// prefills only its tail, and its output equals a cold engine's; a randomized mix of prefixes and mask
// policies under eviction pressure gives every request the output of a cold run, so no step read K/V
// that another prompt, position or mask had written; and documents (segments) seen before, sent again
// in another order, are copied (K re-rotated) instead of computed, with a cold run's output.
#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;

GenerateRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens, std::optional<MaskPolicy> attention = {}) {
  GenerateRequest r;
  r.model = "tiny-llama";
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = 0;
  r.attention = std::move(attention);
  return r;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n) {
  std::uniform_int_distribution<int32_t> id(3, 127);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = id(rng);
  return t;
}

Collected run(EngineLoop& engine, GenerateRequest r) {
  SubmitResult s = engine.submit_generate(std::move(r));
  EXPECT_EQ(s.error, SubmitError::kNone) << s.message;
  if (!s.stream) return {};
  return collect(*s.stream);
}

// Stats are published after the step that sent the final events.
EngineStats idle_stats(EngineLoop& engine) {
  EXPECT_TRUE(engine.wait_idle(10s));
  EngineStats st = engine.stats();
  for (int i = 0; i < 200 && (st.running != 0 || st.kv_blocks_used != 0); ++i) {
    std::this_thread::sleep_for(5ms);
    st = engine.stats();
  }
  return st;
}

// Same tokens; logprobs equal to within the last bits that a different row count in the GEMM may
// change (the cold run computes the shared prefix's rows too).
void expect_same_output(const Collected& warm, const Collected& cold, const std::string& what) {
  EXPECT_EQ(warm.final_event.finish_reason, RequestFinishReason::kLength) << what;
  EXPECT_EQ(warm.tokens, cold.tokens) << what;
  ASSERT_EQ(warm.logprobs.size(), cold.logprobs.size()) << what;
  for (size_t i = 0; i < warm.logprobs.size(); ++i) EXPECT_NEAR(warm.logprobs[i], cold.logprobs[i], 1e-4f) << what;
}

TEST(PrefixCaching, ASecondRequestSharingA1000TokenPrefixPrefillsOnlyItsTail) {
  CpuBackend backend(2);
  RecordingObserver observer;
  EngineConfig config;
  config.kv_block_size = 16;
  auto warm = make_tiny_llama_engine(backend, &observer, config, 1200);
  EngineConfig cold_config = config;
  cold_config.prefix_caching = false;
  auto cold = make_tiny_llama_engine(backend, nullptr, cold_config, 1200);

  std::mt19937 rng(7);
  const std::vector<int32_t> prefix = random_tokens(rng, 1000);
  auto with_tail = [&](size_t n) {
    std::vector<int32_t> p = prefix;
    const std::vector<int32_t> tail = random_tokens(rng, n);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const std::vector<int32_t> first = with_tail(30), second = with_tail(25);

  const Collected a = run(*warm, greedy(first, 8));
  EXPECT_EQ(a.final_event.cached_prompt_tokens, 0);
  const EngineStats after_first = idle_stats(*warm);
  EXPECT_EQ(after_first.prompt_tokens_computed, 1030);
  EXPECT_EQ(after_first.prefix_cache_hits, 0);
  EXPECT_GE(after_first.kv_blocks_cached, 1000 / 16);

  const Collected b = run(*warm, greedy(second, 8));
  const EngineStats after_second = idle_stats(*warm);
  // 62 full blocks of the prefix (992 tokens) come from the cache; the other 33 are computed.
  EXPECT_EQ(b.final_event.cached_prompt_tokens, 992);
  EXPECT_EQ(after_second.prompt_tokens_computed - after_first.prompt_tokens_computed, 1025 - 992);
  EXPECT_EQ(after_second.prefix_cache_queries - after_first.prefix_cache_queries, 1025);
  EXPECT_EQ(after_second.prefix_cache_hits, 992);
  EXPECT_EQ(observer.prefix_hit.load(), 992);
  EXPECT_EQ(observer.prefix_queried.load(), 1030 + 1025);
  EXPECT_EQ(after_second.kv_blocks_used, 0);

  expect_same_output(b, run(*cold, greedy(second, 8)), "the warm request against a cold engine");
  expect_same_output(a, run(*cold, greedy(first, 8)), "the first request against a cold engine");
  EXPECT_EQ(idle_stats(*cold).prefix_cache_hits, 0);

  // The whole prompt cached: the last token is still computed, for its logits.
  const Collected again = run(*warm, greedy(second, 8));
  EXPECT_EQ(again.final_event.cached_prompt_tokens, 1024);
  expect_same_output(again, b, "the same prompt a second time");
}

// Three base prefixes (two alike after their first blocks), random tails, and a policy each (causal,
// two windows, two segment layouts, one also with parallel positions),
// in concurrent waves through a pool of 40 blocks of 4 tokens: cached blocks are evicted all the
// time, found again, shared by running sequences, and released by preemption.
TEST(PrefixCaching, RandomMixedRequestsUnderEvictionPressureMatchColdRuns) {
  CpuBackend backend(2);
  EngineConfig config;
  config.kv_block_size = 4;
  config.kv_num_blocks = 40;
  config.max_batch_tokens = 24;
  RecordingObserver observer;
  auto warm = make_tiny_llama_engine(backend, &observer, config);
  EngineConfig cold_config = config;
  cold_config.prefix_caching = false;
  cold_config.kv_num_blocks = 64;
  auto cold = make_tiny_llama_engine(backend, nullptr, cold_config);

  std::mt19937 rng(20261123);
  // The second base repeats the first after another 12-token start: the same blocks at the same
  // positions after a different prefix, which must never match.
  std::vector<std::vector<int32_t>> bases = {random_tokens(rng, 40), random_tokens(rng, 12), random_tokens(rng, 31)};
  bases[1].insert(bases[1].end(), bases[0].begin() + 12, bases[0].end());
  struct Case {
    GenerateRequest request;
    std::string what;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 48; ++i) {
    const std::vector<int32_t>& base = bases[rng() % bases.size()];
    std::vector<int32_t> prompt(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(8 + rng() % (base.size() - 7)));
    const std::vector<int32_t> tail = random_tokens(rng, rng() % 9);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const auto n = static_cast<int32_t>(prompt.size());
    std::optional<MaskPolicy> policy;
    switch (rng() % 6) {
      case 0: break;
      case 1: policy = MaskPolicy::sliding_window(6, 2); break;
      case 2: policy = MaskPolicy::sliding_window(9, 0); break;
      case 3: policy = MaskPolicy::segments({n / 3, n / 3}, n / 4); break;
      case 4: policy = MaskPolicy::segments({n / 3, n / 3}, n / 4, /*parallel_positions=*/true); break;
      default: policy = MaskPolicy::segments({n / 2 - 1}, 3); break;
    }
    const std::string what = "case " + std::to_string(i) + " (" + std::to_string(n) + " tokens, " +
                             (policy ? policy->name() : std::string("causal")) + ")";
    cases.push_back({greedy(std::move(prompt), 3 + static_cast<int32_t>(rng() % 6), policy), what});
  }

  std::vector<Collected> expected;
  for (const Case& c : cases) expected.push_back(run(*cold, c.request));
  for (size_t wave = 0; wave < cases.size(); wave += 8) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = wave; i < wave + 8; ++i) {
      SubmitResult s = warm->submit_generate(cases[i].request);
      ASSERT_EQ(s.error, SubmitError::kNone) << cases[i].what << ": " << s.message;
      streams.push_back(s.stream);
    }
    for (size_t i = wave; i < wave + 8; ++i) {
      expect_same_output(collect(*streams[i - wave]), expected[i], cases[i].what);
    }
  }
  const EngineStats st = idle_stats(*warm);
  EXPECT_GT(st.prefix_cache_hits, 0);
  EXPECT_GT(st.prefix_cache_evictions, 0) << "the pool was meant to evict cached blocks";
  EXPECT_EQ(st.kv_blocks_used, 0);
  const EngineStats cold_st = idle_stats(*cold);
  EXPECT_LT(st.prompt_tokens_computed, cold_st.prompt_tokens_computed);
  EXPECT_GT(observer.prefix_hit.load(), 0);
  std::printf("[prefix-cache] %zu requests: %lld of %lld queried tokens hit, %lld evictions, %lld prompt tokens "
              "computed (cold: %lld)\n",
              cases.size(), static_cast<long long>(st.prefix_cache_hits), static_cast<long long>(st.prefix_cache_queries),
              static_cast<long long>(st.prefix_cache_evictions),
              static_cast<long long>(st.prompt_tokens_computed), static_cast<long long>(cold_st.prompt_tokens_computed));
}

// Per-document reuse. Four 40-token documents, then a question; the same documents come back in
// another order beside another question. With no shared prefix each document's K/V is copied and
// re-rotated to its new place; with a shared prefix and parallel positions it is copied exactly;
// with a shared prefix numbered sequentially nothing can be reused.
struct DocumentCase {
  int32_t shared_prefix;
  bool parallel;
  bool reusable;
};

class DocumentReuse : public ::testing::TestWithParam<DocumentCase> {};

TEST_P(DocumentReuse, DocumentsInAnotherOrderMatchAColdRunAndAreCounted) {
  const DocumentCase c = GetParam();
  CpuBackend backend(2);
  EngineConfig config;
  config.kv_block_size = 16;
  auto warm = make_tiny_llama_engine(backend, nullptr, config, 1024);
  EngineConfig cold_config = config;
  cold_config.prefix_caching = false;
  auto cold = make_tiny_llama_engine(backend, nullptr, cold_config, 1024);

  std::mt19937 rng(99);
  const std::vector<int32_t> prefix = random_tokens(rng, static_cast<size_t>(c.shared_prefix));
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 4; ++d) docs.push_back(random_tokens(rng, 40));
  auto request = [&](const std::vector<int>& order, size_t question) {
    std::vector<int32_t> prompt = prefix;
    std::vector<int32_t> lengths;
    for (int d : order) {
      prompt.insert(prompt.end(), docs[d].begin(), docs[d].end());
      lengths.push_back(static_cast<int32_t>(docs[d].size()));
    }
    const std::vector<int32_t> q = random_tokens(rng, question);
    prompt.insert(prompt.end(), q.begin(), q.end());
    return greedy(prompt, 6, MaskPolicy::segments(lengths, c.shared_prefix, c.parallel));
  };
  const GenerateRequest first = request({0, 1, 2, 3}, 9), second = request({2, 0, 3, 1}, 11);

  run(*warm, first);
  const EngineStats before = idle_stats(*warm);
  const Collected got = run(*warm, second);
  const EngineStats after = idle_stats(*warm);
  const Collected want = run(*cold, second);
  const int64_t reused = after.segment_reused_tokens - before.segment_reused_tokens;
  std::printf("[segment-reuse] prefix %d, %s positions: %lld document tokens copied, %lld prompt tokens "
              "computed of %zu, %lld cached in all\n",
              c.shared_prefix, c.parallel ? "parallel" : "sequential", static_cast<long long>(reused),
              static_cast<long long>(after.prompt_tokens_computed - before.prompt_tokens_computed),
              second.prompt.size(), static_cast<long long>(got.final_event.cached_prompt_tokens));
  if (c.reusable) {
    EXPECT_EQ(reused, 160) << "every document should have been copied";
    // The prompt's computed tokens: the question, and the prefix's tokens past its last full block.
    EXPECT_EQ(after.prompt_tokens_computed - before.prompt_tokens_computed,
              static_cast<int64_t>(second.prompt.size()) - 160 - (c.shared_prefix / 16) * 16);
    EXPECT_EQ(got.final_event.cached_prompt_tokens, 160 + (c.shared_prefix / 16) * 16);
  } else {
    EXPECT_EQ(reused, 0);
  }
  // Re-rotated K differs from computed K by float rounding only.
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 2e-3f) << i;
}

INSTANTIATE_TEST_SUITE_P(Layouts, DocumentReuse,
                         ::testing::Values(DocumentCase{0, false, true}, DocumentCase{0, true, true},
                                           DocumentCase{37, true, true}, DocumentCase{37, false, false}),
                         [](const auto& info) {
                           return "prefix" + std::to_string(info.param.shared_prefix) +
                                  (info.param.parallel ? "_parallel" : "_sequential");
                         });

}  // namespace
}  // namespace tessera::test
