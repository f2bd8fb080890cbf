// tests/unit/scheduler/prompt_logprobs_test.cpp: the engine's per-request options that the OpenAI
// surface needs beyond plain sampling, on the CPU backend: prompt logprobs (every prompt row's
// logits, across prefill chunks, beside other requests, never from cached blocks), max_tokens 0
// (score the prompt, generate nothing), min_tokens (stop ids masked until then) and ignore_eos over
// a request's own EOS ids.
#include <gtest/gtest.h>

#include "engine/generation.h"
#include "engine/scheduler/sequence_output.h"
#include "engine_test_util.h"

namespace tessera::test {
namespace {

constexpr const char* kLm = "tiny-llama";

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int t = 0; t < len; ++t) p.push_back(static_cast<int32_t>(3 + (salt * 31 + t * 17) % 120));
  return p;
}

GenerateRequest scoring(std::vector<int32_t> prompt, int32_t max_tokens, int32_t top) {
  GenerateRequest r;
  r.model = kLm;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.prompt_logprobs = top;
  return r;
}

class PromptLogprobsTest : public ::testing::Test {
 protected:
  // Teacher-forced reference: the logits after each prefix of the prompt, from a Generator of its
  // own, scored at the prompt's next token.
  std::vector<StreamTokenLogprob> reference(const std::vector<int32_t>& prompt, int32_t top) {
    const ModelFiles files = locate_model(fixture_dir("tiny-llama"));
    const ModelConfig config = load_model_config(files);
    auto model = make_causal_lm(config, load_weights(files), backend_);
    Generator g(*model, backend_, GeneratorConfig{});
    std::vector<StreamTokenLogprob> out;
    for (size_t i = 1; i < prompt.size(); ++i) {
      const Generator::SequenceInput in{static_cast<SeqId>(i), std::span<const int32_t>(prompt).first(i),
                                        &policy_};
      std::vector<float> logits = g.step(std::span<const Generator::SequenceInput>(&in, 1))[0];
      out.push_back(score_token(logits, prompt[i], top));
      g.release(static_cast<SeqId>(i));
    }
    return out;
  }

  static void expect_near(const std::vector<StreamTokenLogprob>& got, const std::vector<StreamTokenLogprob>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token, want[i].token) << "prompt token " << i + 1;
      EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-4f) << "prompt token " << i + 1;
      ASSERT_EQ(got[i].top.size(), want[i].top.size());
      for (size_t k = 0; k < got[i].top.size(); ++k) {
        EXPECT_NEAR(got[i].top[k].second, want[i].top[k].second, 1e-4f) << "prompt token " << i + 1;
      }
    }
  }

  CpuBackend backend_{2};
  RecordingObserver observer_;
  MaskPolicy policy_ = MaskPolicy::causal();
};

TEST_F(PromptLogprobsTest, MaxTokensZeroScoresEveryPromptTokenAfterTheFirstAndGeneratesNothing) {
  EngineConfig config;
  auto engine = make_tiny_llama_engine(backend_, &observer_, config);
  const std::vector<int32_t> prompt = prompt_of(37, 1);
  SubmitResult s = engine->submit_generate(scoring(prompt, 0, 2));
  ASSERT_EQ(s.error, SubmitError::kNone) << s.message;
  const Collected c = collect(*s.stream);
  EXPECT_EQ(c.deltas, 0);
  EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kLength);
  EXPECT_EQ(c.final_event.completion_tokens, 0);
  EXPECT_EQ(c.final_event.prompt_tokens, 37);
  expect_near(c.prompt_logprobs, reference(prompt, 2));
  EXPECT_TRUE(engine->wait_idle(std::chrono::seconds(10)));
}

TEST_F(PromptLogprobsTest, ChunkedPrefillBesideOtherRequestsGivesTheSameScores) {
  EngineConfig config;
  config.max_batch_tokens = 8;  // chunks of at most 8 rows: scores cross chunk boundaries
  auto engine = make_tiny_llama_engine(backend_, &observer_, config);
  const std::vector<int32_t> prompt = prompt_of(29, 2);
  std::vector<std::shared_ptr<RequestStream>> others;
  for (int i = 0; i < 3; ++i) {
    GenerateRequest r = scoring(prompt_of(10 + i, 7 + i), 6, 0);
    r.sampling.prompt_logprobs.reset();
    others.push_back(engine->submit_generate(std::move(r)).stream);
  }
  SubmitResult s = engine->submit_generate(scoring(prompt, 3, 1));
  ASSERT_EQ(s.error, SubmitError::kNone) << s.message;
  const Collected c = collect(*s.stream);
  for (auto& o : others) EXPECT_EQ(collect(*o).final_event.completion_tokens, 6);
  EXPECT_EQ(c.tokens.size(), 3u);
  expect_near(c.prompt_logprobs, reference(prompt, 1));

  // The generated tokens are those of the same request without prompt logprobs.
  GenerateRequest plain = scoring(prompt, 3, 0);
  plain.sampling.prompt_logprobs.reset();
  const Collected p = collect(*engine->submit_generate(std::move(plain)).stream);
  EXPECT_EQ(p.tokens, c.tokens);
  EXPECT_TRUE(p.prompt_logprobs.empty());
}

TEST_F(PromptLogprobsTest, CachedPromptBlocksAreNotUsedWhenThePromptIsScored) {
  EngineConfig config;
  config.kv_block_size = 4;
  auto engine = make_tiny_llama_engine(backend_, &observer_, config);
  const std::vector<int32_t> prompt = prompt_of(21, 3);
  GenerateRequest warm = scoring(prompt, 2, 0);
  warm.sampling.prompt_logprobs.reset();
  collect(*engine->submit_generate(std::move(warm)).stream);  // fills the prefix cache
  const Collected c = collect(*engine->submit_generate(scoring(prompt, 0, 0)).stream);
  EXPECT_EQ(c.final_event.cached_prompt_tokens, 0);
  expect_near(c.prompt_logprobs, reference(prompt, 0));
}

TEST_F(PromptLogprobsTest, AOneTokenPromptHasNothingToScore) {
  auto engine = make_tiny_llama_engine(backend_, &observer_, EngineConfig{});
  const Collected c = collect(*engine->submit_generate(scoring({5}, 0, 1)).stream);
  EXPECT_TRUE(c.prompt_logprobs.empty());
  EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kLength);
}

TEST_F(PromptLogprobsTest, MinTokensMasksEveryStopIdAndIgnoreEosCoversTheRequestsEosIds) {
  auto engine = make_tiny_llama_engine(backend_, &observer_, EngineConfig{});
  const std::vector<int32_t> prompt = prompt_of(12, 4);
  GenerateRequest free_run = scoring(prompt, 8, 0);
  free_run.sampling.prompt_logprobs.reset();
  const Collected base = collect(*engine->submit_generate(free_run).stream);
  ASSERT_EQ(base.tokens.size(), 8u);
  const int32_t first = base.tokens[0];

  // The greedy first token as a stop id: without min_tokens the request stops at once.
  GenerateRequest stop = free_run;
  stop.sampling.stop_token_ids = {first};
  stop.sampling.ignore_eos = false;
  EXPECT_EQ(collect(*engine->submit_generate(stop).stream).tokens.size(), 1u);
  // min_tokens 3 keeps it (and the model's EOS ids) out of the first three tokens.
  stop.sampling.min_tokens = 3;
  const Collected held = collect(*engine->submit_generate(stop).stream);
  ASSERT_GE(held.tokens.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(held.tokens[i], first) << "token " << i;

  // A request's own EOS id stops it; ignore_eos ignores it, and the run is as long as asked.
  GenerateRequest eos = free_run;
  eos.sampling.eos_token_ids = {first};
  eos.sampling.ignore_eos = false;
  const Collected stopped = collect(*engine->submit_generate(eos).stream);
  EXPECT_EQ(stopped.tokens.size(), 1u);
  EXPECT_EQ(stopped.final_event.finish_reason, RequestFinishReason::kStop);
  eos.sampling.ignore_eos = true;
  const Collected ignored = collect(*engine->submit_generate(eos).stream);
  EXPECT_EQ(ignored.tokens, base.tokens);
  EXPECT_EQ(ignored.final_event.finish_reason, RequestFinishReason::kLength);
}

}  // namespace
}  // namespace tessera::test
