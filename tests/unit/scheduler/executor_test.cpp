// tests/unit/scheduler/executor_test.cpp: the Executor on the CPU backend, with plans built by hand
// as a scheduler would: one plan run by two executors gives one result (tensor parallelism runs a
// plan on N), a decoding row of several tokens with logits for each (a speculative verify) matches
// decoding them one at a time and samples each row with its own penalty lists, and a row that
// starts below what its sequence held (a rejected draft dropped) sees only the positions before it;
// and the draft-model drafter following the target's tokens through a rejection and drafting a
// batch as it drafts each sequence alone.
#include "engine/executor.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "engine/draft_model_drafter.h"
#include "engine/generation.h"
#include "engine/kv_cache/kv_cache_manager.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "models/model_files.h"
#include "models/model_loader.h"

namespace tessera {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kBlocks = 64;

struct TinyLlama {
  TinyLlama() {
    const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
    config = load_model_config(files);
    model = make_causal_lm(config, load_weights(files), backend);
  }
  ModelConfig config;
  CpuBackend backend;
  std::unique_ptr<CausalLm> model;
};

std::vector<int32_t> tokens_from(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

SequenceKv sequence(SeqId id) {
  SequenceKv seq;
  seq.id = id;
  return seq;
}

// The row computing seq's positions [start, start + tokens.size()).
StepRow row_for(KvCacheManager& kv, SequenceKv& seq, int64_t start, std::vector<int32_t> tokens) {
  StepRow row;
  row.seq = seq.id;
  row.start = start;
  const int64_t grow = start + static_cast<int64_t>(tokens.size()) - seq.num_computed;
  if (grow > 0) {
    seq.tokens.insert(seq.tokens.end(), tokens.end() - grow, tokens.end());
    kv.allocate(seq, grow);
  }
  const auto table = kv.block_table(seq);
  row.block_table.assign(table.begin(), table.end());
  row.tokens = std::move(tokens);
  row.policy = &seq.policy;
  return row;
}

std::vector<float> host_rows(Backend& backend, const Tensor& logits) { return backend.download(logits); }

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(Executor, TwoExecutorsRunOnePlanAlike) {
  TinyLlama first, second;
  KvCacheManager kv({kBlockSize, kBlocks, false});
  SequenceKv decoding = sequence(1), scoring = sequence(2);
  StepPlan plan;
  plan.rows.push_back(row_for(kv, decoding, 0, tokens_from(3, 9)));
  plan.rows.back().sample = SampleSpec{};  // greedy
  plan.rows.push_back(row_for(kv, scoring, 0, tokens_from(20, 6)));
  plan.rows.back().all_logits = true;
  plan.rows.back().scores = RowScores{0, tokens_from(21, 5), 3};

  Executor a(*first.model, first.backend, kBlocks, kBlockSize);
  Executor b(*second.model, second.backend, kBlocks, kBlockSize);
  const StepResult ra = a.execute(plan);
  const StepResult rb = b.execute(plan);
  ASSERT_TRUE(ra.sampled[0] && rb.sampled[0]);
  EXPECT_EQ(ra.sampled[0]->token, rb.sampled[0]->token);
  EXPECT_FALSE(ra.sampled[1]);
  ASSERT_EQ(ra.scores[1].size(), 5u);
  ASSERT_EQ(rb.scores[1].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(ra.scores[1][i].token, 21 + static_cast<int32_t>(i));
    EXPECT_EQ(ra.scores[1][i].logprob, rb.scores[1][i].logprob);
    EXPECT_EQ(ra.scores[1][i].top.size(), 3u);
  }
}

TEST(Executor, AVerifyRowGivesLogitsForEveryTokenAsDecodingDoes) {
  TinyLlama model;
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<int32_t> prompt = tokens_from(5, 7), draft = {11, 12, 13};
  // One token at a time.
  Generator one(*model.model, model.backend, GeneratorConfig{kBlockSize, kBlocks, 0, false});
  const Generator::SequenceInput in{1, prompt, &causal};
  one.step(std::span(&in, 1));
  std::vector<float> expected;
  for (const int32_t token : draft) {
    const Generator::SequenceInput step{1, std::span<const int32_t>(&token, 1), &causal};
    const std::vector<float> logits = one.step(std::span(&step, 1))[0];
    expected.insert(expected.end(), logits.begin(), logits.end());
  }
  // The three as one row, logits for each.
  Generator verify(*model.model, model.backend, GeneratorConfig{kBlockSize, kBlocks, 0, false});
  verify.step(std::span(&in, 1));
  const Generator::SequenceInput rows{1, draft, &causal, /*all_logits=*/true};
  Tensor earlier;
  const std::vector<float> last = verify.step(std::span(&rows, 1), &earlier)[0];
  std::vector<float> got = host_rows(model.backend, earlier);
  got.insert(got.end(), last.begin(), last.end());
  EXPECT_LE(max_abs_diff(got, expected), 1e-4f);
}

// Each row of a verify is sampled with its own penalty lists (the scheduler's draft_penalties), the
// last row with sample's: a list that bans the row's unpenalised pick must change that row's token.
TEST(Executor, AVerifyRowSamplesEachRowWithItsOwnPenaltyLists) {
  TinyLlama model;
  KvCacheManager kv({kBlockSize, kBlocks, false});
  SequenceKv seq = sequence(1);
  Executor executor(*model.model, model.backend, kBlocks, kBlockSize);
  StepPlan prompt;
  prompt.rows.push_back(row_for(kv, seq, 0, tokens_from(5, 7)));
  executor.execute(prompt);
  auto picks = [&](std::vector<PenaltyLists> lists) {
    StepPlan plan;
    plan.rows.push_back(row_for(kv, seq, 7, {30, 11, 12}));  // the last token, then two drafts
    StepRow& row = plan.rows.back();
    row.num_draft = 2;
    row.all_logits = true;
    row.sample = SampleSpec{};
    row.sample->frequency_penalty = 1000.0f;  // a listed token is never the argmax
    row.draft_penalties = std::move(lists);
    if (!row.draft_penalties.empty()) {
      row.sample->penalty_tokens = row.draft_penalties.back().tokens;
      row.sample->penalty_counts = row.draft_penalties.back().counts;
    }
    const StepResult result = executor.execute(plan);
    std::vector<int32_t> tokens;
    for (const SampleOutcome& verified : result.verified[0]) tokens.push_back(verified.token);
    if (result.sampled[0]) tokens.push_back(result.sampled[0]->token);
    return tokens;
  };
  const std::vector<int32_t> plain = picks({});
  ASSERT_EQ(plain.size(), 3u);
  std::vector<PenaltyLists> bans;
  for (const int32_t token : plain) bans.push_back({{token}, {1}});
  const std::vector<int32_t> banned = picks(bans);
  ASSERT_EQ(banned.size(), 3u);
  for (size_t j = 0; j < 3; ++j) EXPECT_NE(banned[j], plain[j]) << "row " << j << " ignored its own list";
}

TEST(Executor, ARowStartingBelowWhatItsSequenceHeldSeesOnlyThePositionsBefore) {
  TinyLlama model;
  Executor executor(*model.model, model.backend, kBlocks, kBlockSize);
  KvCacheManager kv({kBlockSize, kBlocks, false});
  SequenceKv seq = sequence(1);
  // Positions 0..9, of which the last three (a draft) are then rejected and 2 others take 7..8.
  StepPlan prefill;
  prefill.rows.push_back(row_for(kv, seq, 0, tokens_from(5, 10)));
  executor.forward(prefill);
  StepPlan redo;
  redo.rows.push_back(row_for(kv, seq, 7, {30, 31}));
  const std::vector<float> got = host_rows(model.backend, executor.forward(redo));

  Executor fresh(*model.model, model.backend, kBlocks, kBlockSize);
  KvCacheManager kv_fresh({kBlockSize, kBlocks, false});
  SequenceKv clean = sequence(1);
  std::vector<int32_t> kept = tokens_from(5, 7);
  kept.insert(kept.end(), {30, 31});
  StepPlan whole;
  whole.rows.push_back(row_for(kv_fresh, clean, 0, kept));
  const std::vector<float> expected = host_rows(model.backend, fresh.forward(whole));
  EXPECT_LE(max_abs_diff(got, expected), 1e-4f);
}

// The draft model follows the target's tokens: after a rejection its KV is truncated back, and it
// drafts what a drafter that saw only the kept tokens drafts.
TEST(DraftModelDrafter, FollowsTheTokensTheTargetKeptAfterARejection) {
  TinyLlama model;
  DraftModelDrafter drafter(*model.model, model.backend, 1024);
  std::vector<int32_t> tokens = tokens_from(5, 9);
  const std::vector<int32_t> first = drafter.propose(1, tokens, 3);
  ASSERT_EQ(first.size(), 3u);
  // The target kept the first draft and then sampled a token the draft model did not guess.
  tokens.push_back(first[0]);
  tokens.push_back(first[1] == 7 ? 8 : 7);
  const std::vector<int32_t> next = drafter.propose(1, tokens, 4);
  DraftModelDrafter fresh(*model.model, model.backend, 1024);
  EXPECT_EQ(next, fresh.propose(2, tokens, 4));
  drafter.finished(1, tokens, 9);
  // A pool too small for the sequence: no drafts, and no error.
  DraftModelDrafter small(*model.model, model.backend, 16);
  EXPECT_TRUE(small.propose(3, tokens_from(5, 40), 2).empty());
}

// Drafting several sequences in one forward a round gives each the drafts it gets alone, whatever
// their lengths and draft counts; an ask the context cannot hold gets none.
TEST(DraftModelDrafter, DraftsABatchAsItDraftsEachSequenceAlone) {
  TinyLlama model;
  const std::vector<int32_t> a = tokens_from(5, 9), b = tokens_from(30, 3), c = tokens_from(11, 20);
  const std::vector<int32_t> too_long = tokens_from(1, static_cast<int32_t>(model.config.max_position_embeddings));
  const std::vector<DraftAsk> asks{{1, a, 3}, {2, b, 1}, {3, too_long, 2}, {4, c, 4}};
  DraftModelDrafter batched(*model.model, model.backend, 1024);
  const std::vector<std::vector<int32_t>> together = batched.propose_all(asks);
  ASSERT_EQ(together.size(), asks.size());
  for (size_t i = 0; i < asks.size(); ++i) {
    DraftModelDrafter alone(*model.model, model.backend, 1024);
    EXPECT_EQ(together[i], alone.propose(asks[i].seq, asks[i].tokens, asks[i].max_tokens)) << "ask " << i;
  }
  EXPECT_EQ(together[0].size(), 3u);
  EXPECT_EQ(together[1].size(), 1u);
  EXPECT_TRUE(together[2].empty());
  EXPECT_EQ(together[3].size(), 4u);
}

}  // namespace
}  // namespace tessera
