// tests/gpu/backend/test_cuda_request_options.cpp: the per-request options of the OpenAI surface on
// the CUDA engine, against the CPU engine on the same tiny-llama weights: prompt logprobs (every
// prompt row's logits, in chunks and beside decode rows, next to captured decode graphs), max_tokens
// 0, and min_tokens, whose stop ids CudaBackend::sample masks in the logits before its kernel reads
// them; and speculative decoding, whose verify steps run as captured decode graphs. Skips itself
// without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/scheduler/engine_loop.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "tests/unit/scheduler/engine_test_util.h"
#include "tests/gpu/backend/backend_test_util.h"

namespace tessera {
namespace {

// bf16 logits of the tiny fixture against fp32 (H100, 2026-11-23): prompt logprobs differ by 0.034
// on average and 0.111 at most, as the sampled tokens' logprobs do (0.109 at most). A row scored
// against the wrong position differs by O(1) on average.
constexpr float kLogprobTolerance = 0.05f;       // mean over the prompt
constexpr float kWorstLogprobTolerance = 0.25f;  // any one token

std::unique_ptr<EngineLoop> tiny_engine(Backend& backend, const EngineConfig& ec) {
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  ModelConfig config = load_model_config(files);
  std::vector<EngineLoop::ServedLm> lms;
  lms.push_back({"tiny", config, make_causal_lm(config, load_weights(files), backend),
                 std::make_shared<test::LetterTokenizer>(config.vocab_size), nullptr, {}});
  auto loop = std::make_unique<EngineLoop>(ec, backend, std::move(lms), std::vector<EngineLoop::ServedEncoder>{},
                                           nullptr);
  loop->warm_up();
  loop->start();
  return loop;
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int t = 0; t < len; ++t) p.push_back(static_cast<int32_t>(3 + (salt * 31 + t * 17) % 120));
  return p;
}

GenerateRequest request(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerateRequest r;
  r.model = "tiny";
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

test::Collected run(EngineLoop& loop, GenerateRequest r) {
  SubmitResult s = loop.submit_generate(std::move(r));
  EXPECT_EQ(s.error, SubmitError::kNone) << s.message;
  return test::collect(*s.stream);
}

TEST(CudaRequestOptions, PromptLogprobsMatchTheCpuEngineInChunksBesideDecodes) {
  REQUIRE_GPU();
  EngineConfig ec;
  ec.max_batch_tokens = 16;  // the scored prompt runs in chunks, each beside the decode rows
  ec.kv_num_blocks = 256;
  CudaBackend gpu;
  CpuBackend cpu{2};
  auto gpu_loop = tiny_engine(gpu, ec);
  auto cpu_loop = tiny_engine(cpu, ec);
  const std::vector<int32_t> prompt = prompt_of(45, 1);
  for (int32_t max_tokens : {0, 4}) {
    GenerateRequest r = request(prompt, max_tokens);
    r.sampling.prompt_logprobs = 2;
    // Decoding neighbours: steps mix their single rows with the scored chunk.
    std::vector<std::shared_ptr<RequestStream>> others;
    for (int i = 0; i < 3; ++i) others.push_back(gpu_loop->submit_generate(request(prompt_of(6, 9 + i), 30)).stream);
    const test::Collected got = run(*gpu_loop, r);
    const test::Collected want = run(*cpu_loop, r);
    for (auto& o : others) EXPECT_EQ(test::collect(*o).final_event.completion_tokens, 30);
    EXPECT_EQ(got.final_event.completion_tokens, max_tokens);
    ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - 1);
    ASSERT_EQ(want.prompt_logprobs.size(), prompt.size() - 1);
    float worst = 0.0f;
    double sum = 0.0;
    for (size_t i = 0; i < got.prompt_logprobs.size(); ++i) {
      EXPECT_EQ(got.prompt_logprobs[i].token, prompt[i + 1]);
      const float err = std::fabs(got.prompt_logprobs[i].logprob - want.prompt_logprobs[i].logprob);
      worst = std::max(worst, err);
      sum += err;
      ASSERT_EQ(got.prompt_logprobs[i].top.size(), 2u);
    }
    // The same request's sampled tokens' logprobs (the engine's ordinary last-row path) on each
    // backend: the bf16 noise the prompt rows are held to.
    GenerateRequest sampled = request(prompt, 8);
    sampled.sampling.logprobs = 0;
    const test::Collected gs = run(*gpu_loop, sampled);
    const test::Collected cs = run(*cpu_loop, sampled);
    float sampled_worst = 0.0f;
    for (size_t i = 0; i < std::min(gs.logprobs.size(), cs.logprobs.size()); ++i) {
      sampled_worst = std::max(sampled_worst, std::fabs(gs.logprobs[i] - cs.logprobs[i]));
    }
    const double mean = sum / static_cast<double>(got.prompt_logprobs.size());
    std::printf("[cuda-options] max_tokens %d: %zu prompt logprobs, |gpu - cpu| mean %.4f largest %.4f; "
                "sampled tokens' largest %.4f\n",
                max_tokens, got.prompt_logprobs.size(), mean, worst, sampled_worst);
    EXPECT_LE(mean, kLogprobTolerance);
    EXPECT_LE(worst, kWorstLogprobTolerance);
  }
  EXPECT_TRUE(gpu_loop->wait_idle(std::chrono::seconds(10)));
}

TEST(CudaRequestOptions, MinTokensMasksStopIdsInTheDeviceSampler) {
  REQUIRE_GPU();
  EngineConfig ec;
  ec.kv_num_blocks = 256;
  CudaBackend gpu;
  auto loop = tiny_engine(gpu, ec);
  const std::vector<int32_t> prompt = prompt_of(12, 4);
  const test::Collected free_run = run(*loop, request(prompt, 8));
  ASSERT_EQ(free_run.tokens.size(), 8u);
  const int32_t first = free_run.tokens[0];

  GenerateRequest stop = request(prompt, 8);
  stop.sampling.ignore_eos = false;
  stop.sampling.stop_token_ids = {first};
  EXPECT_EQ(run(*loop, stop).tokens.size(), 1u);
  stop.sampling.min_tokens = 3;
  stop.sampling.logprobs = 3;
  SubmitResult s = loop->submit_generate(stop);
  ASSERT_EQ(s.error, SubmitError::kNone) << s.message;
  std::vector<StreamTokenLogprob> lps;
  std::vector<int32_t> tokens;
  for (;;) {
    std::optional<StreamEvent> e = s.stream->next(std::chrono::milliseconds(100));
    if (!e) continue;
    tokens.insert(tokens.end(), e->tokens.begin(), e->tokens.end());
    lps.insert(lps.end(), e->logprobs.begin(), e->logprobs.end());
    if (e->final) break;
  }
  ASSERT_GE(tokens.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(tokens[i], first) << "token " << i;
    // Masked before the logprobs: the stop id is not among the alternatives either.
    for (const auto& [id, lp] : lps[i].top) EXPECT_NE(id, first) << "token " << i;
  }

  // ignore_eos over a request's own EOS ids: exactly max_tokens.
  GenerateRequest eos = request(prompt, 8);
  eos.sampling.eos_token_ids = {first};
  EXPECT_EQ(run(*loop, eos).tokens, free_run.tokens);
  eos.sampling.ignore_eos = false;
  EXPECT_EQ(run(*loop, eos).tokens.size(), 1u);
}

TEST(CudaRequestOptions, SpeculationKeepsGreedyOutputAndReplaysVerifyStepsFromGraphs) {
  REQUIRE_GPU();
  EngineConfig plain;
  plain.kv_num_blocks = 256;
  EngineConfig speculative = plain;
  speculative.speculative.method = "ngram";
  speculative.speculative.num_speculative_tokens = 4;
  speculative.speculative.ngram = NgramDrafterConfig{1, 3};
  CudaBackend off_gpu;
  CudaBackendConfig invariant;
  invariant.batch_invariant_decode = true;  // as a speculating server's
  CudaBackend on_gpu(invariant);
  auto off = tiny_engine(off_gpu, plain);
  auto on = tiny_engine(on_gpu, speculative);
  // Prompts that repeat themselves (the drafter's best case) beside varied ones, decoded together.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(prompt_of(10 + 7 * i, i));
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 24 + 5 * i; ++t) p.push_back(static_cast<int32_t>(10 + (t % (3 + i))));
    prompts.push_back(p);
  }
  const int64_t replays_before = on_gpu.graph_replays();
  const int64_t steps_before = on->stats().steps;
  std::vector<std::shared_ptr<RequestStream>> off_streams, on_streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto max_tokens = static_cast<int32_t>(16 + 3 * i);
    off_streams.push_back(off->submit_generate(request(prompts[i], max_tokens)).stream);
    on_streams.push_back(on->submit_generate(request(prompts[i], max_tokens)).stream);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const test::Collected want = test::collect(*off_streams[i]);
    const test::Collected got = test::collect(*on_streams[i]);
    EXPECT_EQ(got.tokens, want.tokens) << "request " << i << ": speculation changed the greedy output";
  }
  ASSERT_TRUE(on->wait_idle(std::chrono::seconds(10)));
  const EngineStats st = on->stats();
  std::printf("[cuda-speculation] %lld drafts, %lld of %lld draft tokens kept, %lld graph replays\n",
              static_cast<long long>(st.spec_drafts), static_cast<long long>(st.spec_accepted_tokens),
              static_cast<long long>(st.spec_draft_tokens),
              static_cast<long long>(on_gpu.graph_replays() - replays_before));
  EXPECT_GT(st.spec_accepted_tokens, 0) << "no draft was kept: the test does not exercise acceptance";
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens) << "no draft was rejected: rollback is not exercised";
  // A verify step is a decode step of one row per token, replayed from a graph warm-up captured:
  // only the steps that carry a prompt (one each at most) run eagerly.
  const auto prompt_steps = static_cast<int64_t>(prompts.size());
  EXPECT_GE(on_gpu.graph_replays() - replays_before, st.steps - steps_before - prompt_steps);
}

}  // namespace
}  // namespace tessera
