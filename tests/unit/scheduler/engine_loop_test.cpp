// tests/unit/scheduler/engine_loop_test.cpp: EngineLoop on the CPU backend with the tiny random-weight
// Llama and BERT fixtures: every request ends in exactly one final event; batched greedy output
// (tokens and logprobs, bitwise) equals the same request run alone, with and without preemption;
// cancel, deadlines, the queue bound, draining, shutdown, forward errors, submit validation and
// embedding batches.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "kernels/cpu/ops.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;

constexpr const char* kLm = "tiny-llama";

// Whether the CPU GEMM gives a row the same bits whatever the number of rows it is computed with.
// When it does, batched logprobs must equal solo logprobs bitwise; when it does not (OpenBLAS picks
// sgemv for one row and different sgemm tiles for few and many rows, each summing k in another
// order), they may differ in the last bits and only the greedy tokens are required to match.
bool cpu_gemm_row_invariant() {
  constexpr int64_t k = 64, n = 128, m = 64;
  std::vector<float> x(m * k), w(n * k), batched(m * n), alone(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 104729) % 1000) / 1000.0f - 0.5f;
  kernels::cpu::gemm_xwt(x.data(), w.data(), nullptr, batched.data(), m, n, k);
  for (int64_t r : {int64_t{0}, int64_t{13}, m - 1}) {
    kernels::cpu::gemm_xwt(x.data() + r * k, w.data(), nullptr, alone.data(), 1, n, k);
    if (!std::equal(alone.begin(), alone.end(), batched.begin() + r * n)) return false;
  }
  return true;
}


void expect_same_logprobs(const std::vector<float>& got, const std::vector<float>& want, size_t request) {
  static const bool bitwise = cpu_gemm_row_invariant();
  if (bitwise) {
    EXPECT_EQ(got, want) << "request " << request << ": logprobs not bitwise equal to solo";
    return;
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f) << "request " << request;
}
constexpr const char* kEncoder = "tiny-bert";

struct EngineOptions {
  EngineConfig config;
  bool with_encoder = false;
  int32_t poison = -1;  // >= 0: forward throws when this token id is in the batch
};

class EngineLoopTest : public ::testing::Test {
 protected:
  std::unique_ptr<EngineLoop> make_engine(const EngineOptions& options, bool start = true) {
    const ModelFiles files = locate_model(fixture_dir("tiny-llama"));
    EngineLoop::ServedLm lm;
    lm.name = kLm;
    lm.config = load_model_config(files);
    const WeightStore weights = load_weights(files);
    lm.model = make_causal_lm(lm.config, weights, backend_);
    if (options.poison >= 0) lm.model = std::make_unique<FaultyLm>(std::move(lm.model), options.poison);
    // The model drafts for itself: every draft should be kept.
    if (options.config.speculative.method == "draft_model") lm.draft_model = make_causal_lm(lm.config, weights, backend_);
    lm.tokenizer = std::make_shared<LetterTokenizer>(lm.config.vocab_size);
    std::vector<EngineLoop::ServedLm> lms;
    lms.push_back(std::move(lm));
    std::vector<EngineLoop::ServedEncoder> encoders;
    if (options.with_encoder) {
      const ModelFiles bert_files = locate_model(fixture_dir("tiny-bert"));
      EngineLoop::ServedEncoder enc;
      enc.name = kEncoder;
      enc.config = load_model_config(bert_files);
      const WeightStore bert_weights = load_weights(bert_files);
      enc.model = make_encoder(enc.config, bert_weights, backend_);
      if (options.poison >= 0) enc.model = std::make_unique<FaultyEncoder>(std::move(enc.model), options.poison);
      encoders.push_back(std::move(enc));
    }
    auto engine = std::make_unique<EngineLoop>(options.config, backend_, std::move(lms), std::move(encoders),
                                               &observer_);
    if (start) engine->start();
    return engine;
  }

  static GenerateRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
    GenerateRequest r;
    r.model = kLm;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;  // fixed lengths make the comparisons stronger
    r.sampling.logprobs = 0;       // the sampled token's logprob: compared bitwise
    return r;
  }

  // Varied prompts (ids in the tiny vocab, lengths 3..42).
  static std::vector<int32_t> prompt_of(int i) {
    std::vector<int32_t> p;
    const int len = 3 + (i * 7) % 40;
    for (int t = 0; t < len; ++t) p.push_back(static_cast<int32_t>(3 + (i * 31 + t * 17) % 120));
    return p;
  }

  static Collected run_alone(EngineLoop& engine, GenerateRequest r) {
    SubmitResult s = engine.submit_generate(std::move(r));
    EXPECT_EQ(s.error, SubmitError::kNone) << s.message;
    return collect(*s.stream);
  }

  CpuBackend backend_{2};
  RecordingObserver observer_;
};

TEST_F(EngineLoopTest, ManyConcurrentRequestsEachEndOnceAndBatchedGreedyEqualsSolo) {
  constexpr int kRequests = 64;
  EngineOptions options;
  options.config.max_batch_tokens = 256;  // several steps of chunked prefill for 64 prompts
  auto engine = make_engine(options);
  std::vector<Collected> solo;
  for (int i = 0; i < kRequests; ++i) solo.push_back(run_alone(*engine, greedy(prompt_of(i), 4 + i % 9)));

  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < kRequests; ++i) {
    SubmitResult s = engine->submit_generate(greedy(prompt_of(i), 4 + i % 9));
    ASSERT_EQ(s.error, SubmitError::kNone) << s.message;
    streams.push_back(s.stream);
  }
  // Read from several threads, as front ends do.
  std::vector<Collected> batched(kRequests);
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < kRequests; i += 4) batched[i] = collect(*streams[i]);
    });
  }
  for (auto& r : readers) r.join();
  for (int i = 0; i < kRequests; ++i) {
    const Collected& b = batched[static_cast<size_t>(i)];
    const Collected& s = solo[static_cast<size_t>(i)];
    EXPECT_EQ(b.finals, 1);
    EXPECT_EQ(b.final_event.finish_reason, RequestFinishReason::kLength) << i;
    EXPECT_EQ(b.final_event.completion_tokens, 4 + i % 9);
    EXPECT_EQ(b.final_event.prompt_tokens, static_cast<int64_t>(prompt_of(i).size()));
    EXPECT_EQ(b.tokens, s.tokens) << "request " << i << ": batched greedy differs from solo";
    expect_same_logprobs(b.logprobs, s.logprobs, static_cast<size_t>(i));
    EXPECT_EQ(b.text, s.text);
    EXPECT_EQ(b.text.size(), b.tokens.size());
  }
  ASSERT_TRUE(engine->wait_idle(5s));
  const EngineStats st = settled_stats(*engine);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.kv_cache_usage, 0.0);
  EXPECT_EQ(observer_.started, 2 * kRequests);
  EXPECT_EQ(observer_.first_tokens.load(), 2 * kRequests);
  EXPECT_EQ(observer_.policies.front(), "causal");
}

class SpeculationTest : public EngineLoopTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(SpeculationTest, KeepsGreedyOutputTokenForTokenAndFreesEveryBlock) {
  EngineOptions plain;
  EngineOptions speculative;
  speculative.config.speculative.method = GetParam();
  speculative.config.speculative.num_speculative_tokens = 4;
  speculative.config.speculative.untimed_row_cost = 0;  // every draft verified, whatever it costs
  speculative.config.speculative.ngram = NgramDrafterConfig{1, 3};
  if (std::string(GetParam()) == "draft_model") speculative.config.speculative.draft_model = "tiny-llama";
  auto off = make_engine(plain);
  auto on = make_engine(speculative);
  // Prompts that repeat themselves (the drafter's best case) beside the varied ones.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(prompt_of(i));
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 24 + i; ++t) p.push_back(static_cast<int32_t>(10 + (t % (3 + i))));
    prompts.push_back(p);
  }
  // The draft model drafts without a request's penalties, so it would guess less often for them than
  // the acceptance check below allows a model drafting for itself.
  const bool penalties = std::string(GetParam()) != "draft_model";
  auto request = [penalties](const std::vector<int32_t>& prompt, int i) {
    GenerateRequest r = greedy(prompt, 12 + i % 13);
    if (i % 3 == 0) r.sampling.min_tokens = 5;  // speculates from its fifth token on
    if (penalties && i % 4 == 3) {  // each verify position counts the drafts before it
      r.sampling.repetition_penalty = 1.3f;
      r.sampling.presence_penalty = 0.4f;
      r.sampling.frequency_penalty = 0.3f;
    }
    return r;
  };
  std::vector<std::shared_ptr<RequestStream>> off_streams, on_streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    off_streams.push_back(off->submit_generate(request(prompts[i], static_cast<int>(i))).stream);
    on_streams.push_back(on->submit_generate(request(prompts[i], static_cast<int>(i))).stream);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Collected a = collect(*off_streams[i]);
    const Collected b = collect(*on_streams[i]);
    EXPECT_EQ(b.tokens, a.tokens) << "request " << i << ": speculation changed the greedy output";
    ASSERT_EQ(b.logprobs.size(), a.logprobs.size());
    // A verify row's logits come from a forward of several rows: equal up to the GEMM's rounding.
    for (size_t t = 0; t < a.logprobs.size(); ++t) EXPECT_NEAR(b.logprobs[t], a.logprobs[t], 1e-4f) << i;
    EXPECT_EQ(b.text, a.text);
    EXPECT_EQ(b.final_event.finish_reason, RequestFinishReason::kLength);
    EXPECT_EQ(b.final_event.completion_tokens, 12 + static_cast<int64_t>(i) % 13);
  }
  ASSERT_TRUE(on->wait_idle(5s));
  const EngineStats st = settled_stats(*on);
  EXPECT_GT(st.spec_drafts, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0) << "no draft was kept: the test does not exercise acceptance";
  if (std::string(GetParam()) == "draft_model") {
    EXPECT_GE(st.spec_accepted_tokens * 10, st.spec_draft_tokens * 9) << "the model drafting for itself was refused";
  } else {
    EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens) << "no draft was rejected: rollback is not exercised";
  }
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(settled_stats(*off).spec_drafts, 0);
}

INSTANTIATE_TEST_SUITE_P(Drafters, SpeculationTest, ::testing::Values("ngram", "suffix", "draft_model"));

// Counts of each generated token at positions 1..3 (position 0 comes from the prompt's forward,
// which never speculates) over `n` seeded sampled requests.
std::map<int32_t, int> sampled_token_counts(EngineLoop& engine, const std::vector<int32_t>& prompt, int n) {
  std::map<int32_t, int> counts;
  for (int first = 0; first < n; first += 128) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = first; i < std::min(n, first + 128); ++i) {
      GenerateRequest r;
      r.model = kLm;
      r.prompt = prompt;
      r.sampling.temperature = 1.0f;
      r.sampling.top_k = 3;  // few outcomes a position, so that drafts are often kept
      r.sampling.seed = static_cast<uint64_t>(i);
      r.sampling.max_tokens = 4;
      r.sampling.ignore_eos = true;
      streams.push_back(engine.submit_generate(std::move(r)).stream);
    }
    for (const auto& stream : streams) {
      const Collected c = collect(*stream);
      for (size_t t = 1; t < c.tokens.size(); ++t) ++counts[c.tokens[t] * 4 + static_cast<int32_t>(t)];
    }
  }
  return counts;
}

// Two-sample chi-square of equal totals over the categories with at least 10 draws between them
// (the rest pooled), against its 0.999 quantile (Wilson-Hilferty): a failure means the two samples
// come from different distributions with 99.9% confidence.
void expect_same_distribution(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::map<int32_t, std::pair<int, int>> joint;
  for (const auto& [k, v] : a) joint[k].first = v;
  for (const auto& [k, v] : b) joint[k].second = v;
  double chi2 = 0.0;
  int categories = 0;
  std::pair<int, int> pooled{0, 0};
  for (const auto& [k, ab] : joint) {
    if (ab.first + ab.second < 10) {
      pooled.first += ab.first;
      pooled.second += ab.second;
      continue;
    }
    chi2 += std::pow(ab.first - ab.second, 2) / (ab.first + ab.second);
    ++categories;
  }
  if (pooled.first + pooled.second > 0) {
    chi2 += std::pow(pooled.first - pooled.second, 2) / (pooled.first + pooled.second);
    ++categories;
  }
  const double df = categories - 1;
  const double critical = df * std::pow(1.0 - 2.0 / (9.0 * df) + 3.09 * std::sqrt(2.0 / (9.0 * df)), 3);
  EXPECT_LT(chi2, critical) << "chi-square " << chi2 << " over " << categories << " categories";
  EXPECT_GE(categories, 4);
}

TEST_F(EngineLoopTest, SampledSpeculationKeepsTheOutputDistribution) {
  EngineOptions plain;
  EngineOptions speculative;
  speculative.config.speculative.method = "ngram";
  speculative.config.speculative.num_speculative_tokens = 3;
  speculative.config.speculative.untimed_row_cost = 0;
  speculative.config.speculative.ngram = NgramDrafterConfig{1, 2};
  speculative.config.speculative.disable_by_batch_size = 0;  // the 128 requests at once all speculate
  auto off = make_engine(plain);
  auto on = make_engine(speculative);
  std::vector<int32_t> prompt;
  for (int t = 0; t < 30; ++t) prompt.push_back(static_cast<int32_t>(20 + t % 5));
  constexpr int kDraws = 1024;
  expect_same_distribution(sampled_token_counts(*off, prompt, kDraws), sampled_token_counts(*on, prompt, kDraws));
  ASSERT_TRUE(on->wait_idle(5s));
  const EngineStats st = settled_stats(*on);
  EXPECT_GT(st.spec_accepted_tokens, 0) << "no draft was kept: acceptance is not exercised";
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens) << "no draft was rejected";
}

TEST_F(EngineLoopTest, PreemptionWithATinyPoolKeepsGreedyOutput) {
  EngineOptions options;
  options.config.kv_block_size = 4;
  options.config.kv_num_blocks = 12;  // 48 tokens: two or three of the requests below at once
  options.config.max_batch_tokens = 16;
  auto engine = make_engine(options);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt = prompt_of(i);
    prompt.resize(std::min<size_t>(prompt.size(), 14));
    requests.push_back(greedy(prompt, 20));
  }
  std::vector<Collected> solo;
  for (const GenerateRequest& r : requests) solo.push_back(run_alone(*engine, r));
  ASSERT_EQ(observer_.preemptions.load(), 0);

  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const GenerateRequest& r : requests) {
    SubmitResult s = engine->submit_generate(r);
    ASSERT_EQ(s.error, SubmitError::kNone) << s.message;
    streams.push_back(s.stream);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Collected c = collect(*streams[i]);
    EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kLength);
    EXPECT_EQ(c.tokens, solo[i].tokens) << "request " << i << " changed under preemption";
    expect_same_logprobs(c.logprobs, solo[i].logprobs, i);
    EXPECT_EQ(c.text, solo[i].text) << "text re-emitted or lost after recompute";
  }
  EXPECT_GT(observer_.preemptions.load(), 0) << "the pool was meant to run out";
  ASSERT_TRUE(engine->wait_idle(5s));
  const EngineStats st = settled_stats(*engine);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST_F(EngineLoopTest, CancelEndsTheRequestAndFreesItsBlocks) {
  auto engine = make_engine({});
  observer_.step_sleep_ms = 2;  // steps slow enough that the cancel lands mid-generation
  SubmitResult s = engine->submit_generate(greedy(prompt_of(1), 200));
  ASSERT_EQ(s.error, SubmitError::kNone);
  std::optional<StreamEvent> first;
  while (!first) first = s.stream->next(1s);
  ASSERT_FALSE(first->final);
  for (int i = 0; i < 100 && engine->stats().kv_blocks_used == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_GT(engine->stats().kv_blocks_used, 0);
  s.stream->cancel();
  s.stream->cancel();  // idempotent
  const Collected rest = collect(*s.stream, 5s);
  EXPECT_EQ(rest.final_event.finish_reason, RequestFinishReason::kCancelled);
  EXPECT_LT(rest.final_event.completion_tokens, 200);
  ASSERT_TRUE(engine->wait_idle(2s));
  const EngineStats st = settled_stats(*engine);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.kv_cache_usage, 0.0);
  EXPECT_EQ(st.running, 0);
}

TEST_F(EngineLoopTest, CancelsAmongManyRequestsEachEndOnceAndFreeEverything) {
  EngineOptions options;
  options.config.kv_block_size = 4;
  options.config.kv_num_blocks = 64;  // tight enough that preemptions mix with the cancels
  options.config.max_batch_tokens = 64;
  auto engine = make_engine(options);
  observer_.step_sleep_ms = 1;
  constexpr int kRequests = 32;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<int32_t> prompt = prompt_of(i);
    prompt.resize(std::min<size_t>(prompt.size(), 20));
    SubmitResult s = engine->submit_generate(greedy(prompt, 40));
    ASSERT_EQ(s.error, SubmitError::kNone) << s.message;
    streams.push_back(s.stream);
  }
  // Every third request is cancelled at once (some still queued), every third after its first token:
  // each of those has a reader of its own, so that its cancel follows its first token closely
  // (a shared reader busy with another stream could come back after all 40 tokens).
  for (int i = 0; i < kRequests; i += 3) streams[static_cast<size_t>(i)]->cancel();
  std::vector<std::thread> readers;
  std::vector<Collected> results(kRequests);
  for (int i = 1; i < kRequests; i += 3) {
    readers.emplace_back([&, i] {
      RequestStream& stream = *streams[static_cast<size_t>(i)];
      std::optional<StreamEvent> first;
      while (!first) first = stream.next(1s);
      stream.cancel();
      if (first->final) {  // (cannot happen with 40 tokens, but stays correct if it does)
        results[static_cast<size_t>(i)].finals = 1;
        results[static_cast<size_t>(i)].final_event = *first;
        return;
      }
      results[static_cast<size_t>(i)] = collect(stream);
    });
  }
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (int i = t; i < kRequests; i += 4) {
        if (i % 3 != 1) results[static_cast<size_t>(i)] = collect(*streams[static_cast<size_t>(i)]);
      }
    });
  }
  for (auto& r : readers) r.join();
  for (int i = 0; i < kRequests; ++i) {
    const Collected& c = results[static_cast<size_t>(i)];
    EXPECT_EQ(c.finals, 1) << i;
    if (i % 3 == 2) {
      EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kLength) << i;
      EXPECT_EQ(c.final_event.completion_tokens, 40);
    } else {
      EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kCancelled) << i;
    }
  }
  ASSERT_TRUE(engine->wait_idle(5s));
  const EngineStats st = settled_stats(*engine);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.running + st.waiting, 0);
  EXPECT_EQ(st.requests_finished, kRequests);
}

TEST_F(EngineLoopTest, DeadlinesInTheQueueAndWhileRunning) {
  auto engine = make_engine({});
  GenerateRequest expired = greedy(prompt_of(2), 8);
  expired.deadline = Clock::now() - 1ms;
  SubmitResult a = engine->submit_generate(expired);
  ASSERT_EQ(a.error, SubmitError::kNone);
  const Collected ca = collect(*a.stream, 5s);
  EXPECT_EQ(ca.final_event.finish_reason, RequestFinishReason::kDeadline);
  EXPECT_EQ(ca.final_event.completion_tokens, 0);

  observer_.step_sleep_ms = 3;
  GenerateRequest slow = greedy(prompt_of(3), 200);
  slow.deadline = Clock::now() + 60ms;
  SubmitResult b = engine->submit_generate(slow);
  ASSERT_EQ(b.error, SubmitError::kNone);
  const Collected cb = collect(*b.stream, 5s);
  EXPECT_EQ(cb.final_event.finish_reason, RequestFinishReason::kDeadline);
  EXPECT_GT(cb.final_event.completion_tokens, 0);
  EXPECT_LT(cb.final_event.completion_tokens, 200);
  ASSERT_TRUE(engine->wait_idle(2s));
  EXPECT_EQ(settled_stats(*engine).kv_blocks_used, 0);
}

TEST_F(EngineLoopTest, QueueFullThenTheQueuedOnesComplete) {
  EngineOptions options;
  options.config.max_queue_size = 2;
  auto engine = make_engine(options, /*start=*/false);
  SubmitResult a = engine->submit_generate(greedy(prompt_of(4), 3));
  SubmitResult b = engine->submit_generate(greedy(prompt_of(5), 3));
  SubmitResult c = engine->submit_generate(greedy(prompt_of(6), 3));
  ASSERT_EQ(a.error, SubmitError::kNone);
  ASSERT_EQ(b.error, SubmitError::kNone);
  EXPECT_EQ(c.error, SubmitError::kQueueFull);
  EXPECT_EQ(c.stream, nullptr);
  EXPECT_NE(c.message.find("queue is full"), std::string::npos) << c.message;
  EXPECT_FALSE(engine->ready());
  engine->start();
  EXPECT_EQ(collect(*a.stream).final_event.completion_tokens, 3);
  EXPECT_EQ(collect(*b.stream).final_event.completion_tokens, 3);
  EXPECT_TRUE(engine->ready());
  SubmitResult d = engine->submit_generate(greedy(prompt_of(6), 3));
  EXPECT_EQ(d.error, SubmitError::kNone) << "the bound counts waiting requests only";
  collect(*d.stream);
}

TEST_F(EngineLoopTest, DrainingRefusesNewWorkAndFinishesInFlight) {
  auto engine = make_engine({});
  observer_.step_sleep_ms = 1;
  SubmitResult a = engine->submit_generate(greedy(prompt_of(7), 30));
  ASSERT_EQ(a.error, SubmitError::kNone);
  engine->stop_accepting();
  EXPECT_FALSE(engine->accepting());
  SubmitResult b = engine->submit_generate(greedy(prompt_of(8), 3));
  EXPECT_EQ(b.error, SubmitError::kDraining);
  const Collected ca = collect(*a.stream);
  EXPECT_EQ(ca.final_event.finish_reason, RequestFinishReason::kLength);
  EXPECT_EQ(ca.final_event.completion_tokens, 30);
  EXPECT_TRUE(engine->wait_idle(2s));
}

TEST_F(EngineLoopTest, ShutdownEndsPendingRequestsWithAnError) {
  auto engine = make_engine({}, /*start=*/false);
  SubmitResult a = engine->submit_generate(greedy(prompt_of(9), 5));
  ASSERT_EQ(a.error, SubmitError::kNone);
  engine.reset();
  const Collected c = collect(*a.stream, 1s);
  EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kError);
  EXPECT_EQ(c.final_event.error, "server shutting down");

  auto running = make_engine({});
  observer_.step_sleep_ms = 2;
  SubmitResult b = running->submit_generate(greedy(prompt_of(10), 200));
  ASSERT_EQ(b.error, SubmitError::kNone);
  ASSERT_TRUE(b.stream->next(2s).has_value());
  running.reset();
  const Collected cb = collect(*b.stream, 1s);
  EXPECT_EQ(cb.final_event.finish_reason, RequestFinishReason::kError);
}

TEST_F(EngineLoopTest, AForwardErrorFailsItsBatchAndTheLoopKeepsServing) {
  EngineOptions options;
  options.poison = 77;
  auto engine = make_engine(options);
  SubmitResult bad = engine->submit_generate(greedy({5, 77, 9}, 4));
  ASSERT_EQ(bad.error, SubmitError::kNone);
  const Collected cb = collect(*bad.stream);
  EXPECT_EQ(cb.final_event.finish_reason, RequestFinishReason::kError);
  EXPECT_NE(cb.final_event.error.find("poisoned"), std::string::npos) << cb.final_event.error;
  GenerateRequest good = greedy({5, 6, 9}, 4);
  good.sampling.stop_token_ids = {77};  // a sampled 77 would poison the next step
  const Collected cg = run_alone(*engine, good);
  EXPECT_NE(cg.final_event.finish_reason, RequestFinishReason::kError) << cg.final_event.error;
  ASSERT_TRUE(engine->wait_idle(2s));
  EXPECT_EQ(settled_stats(*engine).kv_blocks_used, 0);
}

TEST_F(EngineLoopTest, HealthSeesAStalledStepAndRecovers) {
  EngineOptions options;
  options.config.stall_timeout_s = 0.2;
  options.config.faults.step_delay_ms = 600;
  auto engine = make_engine(options);
  const EngineHealth idle = engine->health(Clock::now());
  EXPECT_TRUE(idle.healthy()) << idle.reason();
  EXPECT_FALSE(idle.has_work());
  EXPECT_TRUE(engine->health(Clock::now() + 10s).healthy()) << "no work: a quiet engine is not stalled";
  SubmitResult a = engine->submit_generate(greedy(prompt_of(1), 2));
  ASSERT_EQ(a.error, SubmitError::kNone);
  std::this_thread::sleep_for(400ms);  // inside the first 600 ms step
  const EngineHealth stalled = engine->health(Clock::now());
  EXPECT_TRUE(stalled.stalled);
  EXPECT_FALSE(stalled.healthy());
  EXPECT_EQ(stalled.pending, 1);
  EXPECT_NE(stalled.reason().find("engine stalled: no step finished for 0."), std::string::npos) << stalled.reason();
  EXPECT_NE(stalled.reason().find("with 1 request waiting or running"), std::string::npos) << stalled.reason();
  const Collected c = collect(*a.stream);
  EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kLength);
  ASSERT_TRUE(engine->wait_idle(2s));
  const EngineHealth after = engine->health(Clock::now());
  EXPECT_TRUE(after.healthy()) << after.reason();
}

TEST_F(EngineLoopTest, AnInjectedStepFailureEndsTheEngineAndHealthSaysWhy) {
  EngineOptions options;
  options.config.faults.fail_step = 3;
  auto engine = make_engine(options);
  SubmitResult a = engine->submit_generate(greedy(prompt_of(2), 50));
  ASSERT_EQ(a.error, SubmitError::kNone);
  const Collected c = collect(*a.stream);
  EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kError);
  EXPECT_NE(c.final_event.error.find("debug.fail_step: step 3"), std::string::npos) << c.final_event.error;
  for (int i = 0; i < 200 && engine->health(Clock::now()).thread_alive; ++i) std::this_thread::sleep_for(10ms);
  const EngineHealth h = engine->health(Clock::now());
  EXPECT_FALSE(h.thread_alive);
  EXPECT_FALSE(h.healthy());
  EXPECT_NE(h.reason().find("engine failed: debug.fail_step: step 3"), std::string::npos) << h.reason();
  EXPECT_FALSE(engine->ready());
  EXPECT_EQ(engine->submit_generate(greedy(prompt_of(3), 2)).error, SubmitError::kDraining);
}

TEST_F(EngineLoopTest, StopStringsCutTheTextAndStopTheRequest) {
  auto engine = make_engine({});
  const Collected full = run_alone(*engine, greedy(prompt_of(11), 24));
  ASSERT_GE(full.text.size(), 12u);
  // The first occurrence of a two-letter string from the middle of the output.
  const std::string stop = full.text.substr(6, 2);
  const size_t at = full.text.find(stop);
  GenerateRequest r = greedy(prompt_of(11), 24);
  r.sampling.stop = {stop};
  const Collected cut = run_alone(*engine, r);
  EXPECT_EQ(cut.final_event.finish_reason, RequestFinishReason::kStop);
  EXPECT_EQ(cut.text, full.text.substr(0, at));
  EXPECT_EQ(cut.final_event.completion_tokens, static_cast<int64_t>(at + 2));
}

TEST_F(EngineLoopTest, SubmitValidatesAgainstTheModelAndThePool) {
  EngineOptions options;
  options.config.max_model_len = 64;
  options.config.kv_block_size = 4;
  options.config.kv_num_blocks = 10;  // 40 tokens
  auto engine = make_engine(options);
  SubmitResult r = engine->submit_generate(greedy(std::vector<int32_t>(50, 5), 20));
  EXPECT_EQ(r.error, SubmitError::kInvalid);
  EXPECT_EQ(r.message,
            "This model's maximum context length is 64 tokens. However, you requested 70 tokens (50 in the "
            "messages, 20 in the completion). Please reduce the length of the messages or completion.");
  r = engine->submit_generate(greedy(std::vector<int32_t>(30, 5), 20));
  EXPECT_EQ(r.error, SubmitError::kInvalid);
  EXPECT_NE(r.message.find("needs 13 KV cache blocks"), std::string::npos) << r.message;
  r = engine->submit_generate(greedy({}, 4));
  EXPECT_EQ(r.error, SubmitError::kInvalid);
  r = engine->submit_generate(greedy({1, 500}, 4));
  EXPECT_EQ(r.error, SubmitError::kInvalid);
  EXPECT_NE(r.message.find("token id 500 at index 1"), std::string::npos) << r.message;
  GenerateRequest unknown = greedy({1, 2}, 4);
  unknown.model = "nope";
  r = engine->submit_generate(unknown);
  EXPECT_EQ(r.error, SubmitError::kUnknownModel);
  EXPECT_NE(r.message.find("tiny-llama"), std::string::npos);
  GenerateRequest bad_policy = greedy({1, 2, 3}, 4);
  bad_policy.attention = MaskPolicy::segments({2, 5});
  r = engine->submit_generate(bad_policy);
  EXPECT_EQ(r.error, SubmitError::kInvalid);
  EXPECT_FALSE(r.message.empty());
  GenerateRequest bad_sampling = greedy({1, 2, 3}, 4);
  bad_sampling.sampling.top_p = 1.5f;
  r = engine->submit_generate(bad_sampling);
  EXPECT_EQ(r.error, SubmitError::kInvalid);
  EXPECT_NE(r.message.find("top_p"), std::string::npos) << r.message;
  // A window policy is accepted, and its name reaches the observer.
  GenerateRequest windowed = greedy(prompt_of(12), 6);
  windowed.attention = MaskPolicy::sliding_window(8, 2);
  const Collected c = run_alone(*engine, windowed);
  EXPECT_EQ(c.final_event.completion_tokens, 6);
  std::lock_guard<std::mutex> lock(observer_.mutex);
  EXPECT_EQ(observer_.policies.back(), "sliding_window");
}

TEST_F(EngineLoopTest, SeededSamplingIsReproducibleInABatch) {
  auto engine = make_engine({});
  GenerateRequest r = greedy(prompt_of(13), 12);
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 1234;
  const Collected alone = run_alone(*engine, r);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    streams.push_back(engine->submit_generate(i == 3 ? r : greedy(prompt_of(20 + i), 12)).stream);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Collected c = collect(*streams[i]);
    if (i == 3) {
      EXPECT_EQ(c.tokens, alone.tokens) << "a seeded request changed when batched";
    }
  }
}

TEST_F(EngineLoopTest, EmbeddingsAreBatchedAndNeverTruncatedSilently) {
  EngineOptions options;
  options.with_encoder = true;
  auto engine = make_engine(options);
  const std::vector<std::vector<int32_t>> inputs = {{2, 10, 11, 12, 3}, {2, 20, 3}, {2, 30, 31, 32, 33, 34, 35, 3}};
  std::vector<std::vector<float>> alone;
  for (const auto& input : inputs) {
    EmbedResult r = engine->submit_embed(kEncoder, {input}, Clock::time_point::max()).get();
    ASSERT_EQ(r.error, SubmitError::kNone) << r.message;
    alone.push_back(r.embeddings.at(0));
  }
  // Several requests at once: packed into shared forwards.
  std::vector<std::future<EmbedResult>> futures;
  for (int k = 0; k < 4; ++k) futures.push_back(engine->submit_embed(kEncoder, inputs, Clock::time_point::max()));
  for (auto& f : futures) {
    EmbedResult r = f.get();
    ASSERT_EQ(r.error, SubmitError::kNone) << r.message;
    ASSERT_EQ(r.embeddings.size(), inputs.size());
    EXPECT_EQ(r.prompt_tokens, 16);
    for (size_t i = 0; i < inputs.size(); ++i) {
      ASSERT_EQ(r.embeddings[i].size(), alone[i].size());
      for (size_t d = 0; d < alone[i].size(); ++d) EXPECT_NEAR(r.embeddings[i][d], alone[i][d], 1e-5f);
    }
  }
  const ModelConfig* bert = engine->find_config(kEncoder);
  ASSERT_NE(bert, nullptr);
  EXPECT_TRUE(engine->is_embedding_model(kEncoder));
  std::vector<int32_t> too_long(static_cast<size_t>(bert->max_position_embeddings + 1), 5);
  EmbedResult over = engine->submit_embed(kEncoder, {{2, 3}, too_long}, Clock::time_point::max()).get();
  EXPECT_EQ(over.error, SubmitError::kInvalid);
  EXPECT_NE(over.message.find("input[1] has " + std::to_string(too_long.size()) + " tokens"), std::string::npos)
      << over.message;
  EXPECT_EQ(engine->submit_embed("nope", {{2, 3}}, Clock::time_point::max()).get().error, SubmitError::kUnknownModel);
  EXPECT_EQ(engine->submit_embed(kLm, {{2, 3}}, Clock::time_point::max()).get().error, SubmitError::kInvalid);
  EmbedResult late = engine->submit_embed(kEncoder, {{2, 3}}, Clock::now() - 1ms).get();
  EXPECT_TRUE(late.deadline_exceeded);
  // Generation and embeddings served together.
  SubmitResult g = engine->submit_generate(greedy(prompt_of(14), 5));
  std::future<EmbedResult> e = engine->submit_embed(kEncoder, inputs, Clock::time_point::max());
  EXPECT_EQ(collect(*g.stream).final_event.completion_tokens, 5);
  EXPECT_EQ(e.get().error, SubmitError::kNone);
  EXPECT_EQ(engine->model_names(), (std::vector<std::string>{kLm, kEncoder}));
}

TEST_F(EngineLoopTest, AnEmbeddingForwardFailureIsTheServersFaultNotTheRequests) {
  EngineOptions options;
  options.with_encoder = true;
  options.poison = 66;
  auto engine = make_engine(options);
  EmbedResult failed = engine->submit_embed(kEncoder, {{2, 66, 3}}, Clock::time_point::max()).get();
  EXPECT_EQ(failed.error, SubmitError::kFailed);  // a 500 / INTERNAL, not a 400
  EXPECT_NE(failed.message.find("embedding forward failed"), std::string::npos) << failed.message;
  EXPECT_EQ(engine->submit_embed(kEncoder, {{2, 10, 3}}, Clock::time_point::max()).get().error, SubmitError::kNone);
}

TEST_F(EngineLoopTest, IdleEngineDoesNotSpin) {
  auto engine = make_engine({});
  run_alone(*engine, greedy(prompt_of(15), 2));
  std::this_thread::sleep_for(50ms);
  const int64_t steps = observer_.steps.load();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(observer_.steps.load(), steps);
  EXPECT_TRUE(engine->wait_idle(0ms));
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

// The real SmolLM2-135M-Instruct (GGUF, byte-level BPE) when it is present ($TESSERA_MODEL_DIR or
// ~/.cache/tessera/models): batched greedy equals solo greedy, and the streamed text is the
// tokenizer's decode of the streamed tokens.
TEST(EngineLoopSmolLM2Test, BatchedGreedyEqualsSoloOnTheRealModel) {
  ModelFiles files;
  try {
    files = locate_model("smollm2-135m-instruct");
  } catch (const Error& e) {
    GTEST_SKIP() << "SmolLM2 not present (" << e.what() << "); scripts/fetch-models gets it";
  }
  CpuBackend backend(2);
  EngineLoop::ServedLm lm;
  lm.name = "smollm2";
  lm.config = load_model_config(files);
  {
    const WeightStore weights = load_weights(files);
    lm.model = make_causal_lm(lm.config, weights, backend);
  }
  std::shared_ptr<const Tokenizer> tokenizer = load_tokenizer(files);
  lm.tokenizer = tokenizer;
  std::vector<EngineLoop::ServedLm> lms;
  lms.push_back(std::move(lm));
  EngineConfig config;
  config.max_model_len = 256;
  EngineLoop engine(config, backend, std::move(lms), {}, nullptr);
  engine.start();
  const std::vector<std::string> texts = {"The capital of France is", "def fibonacci(n):",
                                          "Once upon a time, in a small village,", "1, 2, 3, 4,",
                                          "The best way to learn a language is"};
  auto request = [&](const std::string& text) {
    GenerateRequest r;
    r.model = "smollm2";
    r.prompt = tokenizer->encode(text, /*add_special=*/true).ids;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 6;
    return r;
  };
  std::vector<Collected> solo;
  for (const std::string& text : texts) {
    SubmitResult s = engine.submit_generate(request(text));
    ASSERT_EQ(s.error, SubmitError::kNone) << s.message;
    solo.push_back(collect(*s.stream));
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const std::string& text : texts) streams.push_back(engine.submit_generate(request(text)).stream);
  for (size_t i = 0; i < texts.size(); ++i) {
    const Collected c = collect(*streams[i]);
    EXPECT_EQ(c.tokens, solo[i].tokens) << "'" << texts[i] << "': batched greedy differs from solo";
    EXPECT_EQ(c.text, solo[i].text);
    std::vector<int32_t> text_tokens = c.tokens;
    if (c.final_event.finish_reason == RequestFinishReason::kStop && !text_tokens.empty()) text_tokens.pop_back();
    EXPECT_EQ(c.text, tokenizer->decode(text_tokens, /*skip_special=*/true));
  }
}

}  // namespace
}  // namespace tessera::test
