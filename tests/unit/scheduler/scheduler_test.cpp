// tests/unit/scheduler/scheduler_test.cpp: the Scheduler alone, with no backend, no threads and a
// fake clock: the test plays the executor, answering each StepPlan with the tokens it chooses.
#include "engine/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "tests/unit/scheduler/letter_tokenizer.h"

namespace tessera {
namespace {

constexpr int64_t kVocab = 64;

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerTest() {
    model_.vocab_size = kVocab;
    model_.max_position_embeddings = 256;
  }

  Scheduler& make(int32_t max_batch_tokens, int32_t num_blocks, int32_t block_size = 4, bool prefix_caching = true,
                  PrefillPolicy prefill = {}, std::unique_ptr<Drafter> drafter = nullptr,
                  int32_t num_speculative_tokens = 0, int32_t speculation_max_running = 0) {
    SchedulerConfig config;
    config.speculation_max_running = speculation_max_running;
    config.max_batch_tokens = max_batch_tokens;
    config.prefill = prefill;
    config.num_speculative_tokens = num_speculative_tokens;
    config.max_running_sequences = 8;
    config.max_model_len = 256;
    config.kv.block_size = block_size;
    config.kv.num_blocks = num_blocks;
    config.kv.prefix_caching = prefix_caching;
    Scheduler::Lifecycle lifecycle;
    lifecycle.admitted = [this](const Sequence&) { ++admitted_; };
    lifecycle.finished = [this](const Sequence&) { ++finished_; };
    scheduler_ = std::make_unique<Scheduler>(config, nullptr, lifecycle, std::move(drafter));
    return *scheduler_;
  }

  // A greedy request of `prompt` that generates max_tokens tokens; its channel is kept to read.
  std::shared_ptr<RequestChannel> add(SeqId id, std::vector<int32_t> prompt, int32_t max_tokens,
                                      MaskPolicy policy = MaskPolicy::causal(),
                                      Clock::time_point deadline = Clock::time_point::max(), float temperature = 0.0f,
                                      std::optional<int32_t> logprobs = std::nullopt, int32_t min_tokens = 0,
                                      float presence_penalty = 0.0f) {
    auto seq = std::make_unique<Sequence>();
    seq->request.prompt = prompt;
    seq->request.sampling.min_tokens = min_tokens;
    seq->request.sampling.presence_penalty = presence_penalty;
    seq->request.sampling.temperature = temperature;
    seq->request.sampling.logprobs = logprobs;
    seq->request.sampling.seed = 1;
    seq->request.sampling.max_tokens = max_tokens;
    seq->request.sampling.ignore_eos = true;
    seq->request.deadline = deadline;
    seq->output = std::make_unique<SequenceOutput>(seq->request.sampling, prompt, model_, tokenizer_);
    seq->kv.id = id;
    seq->kv.policy = std::move(policy);
    seq->kv.tokens = std::move(prompt);
    seq->arrival = now_;
    seq->channel = std::make_shared<RequestChannel>(signal_);
    auto channel = seq->channel;
    scheduler_->add(std::move(seq));
    return channel;
  }

  // Runs the plan as an executor would: each sampling row gets `token`, and a verify row's drafts
  // are answered with `verified` (the model's token after each row but the last).
  void run(const StepPlan& plan, int32_t token = 7, const std::vector<int32_t>& verified = {}) {
    StepResult result;
    result.sampled.resize(plan.rows.size());
    result.scores.resize(plan.rows.size());
    result.verified.resize(plan.rows.size());
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      if (plan.rows[i].sample) result.sampled[i] = SampleOutcome{token, 0.0f, {}};
      const auto drafts = std::min<size_t>(verified.size(), static_cast<size_t>(plan.rows[i].num_draft));
      for (size_t j = 0; j < drafts; ++j) result.verified[i].push_back(SampleOutcome{verified[j], 0.0f, {}});
    }
    scheduler_->update(plan, std::move(result), now_);
  }

  static const StepRow* row_of(const StepPlan& plan, SeqId id) {
    for (const StepRow& row : plan.rows) {
      if (row.seq == id) return &row;
    }
    return nullptr;
  }

  static std::vector<int32_t> iota(int32_t n, int32_t first = 1) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), first);
    return v;
  }

  // Every event of a finished request, merged: its tokens and the final event's reason.
  static StreamEvent drain(RequestChannel& channel, std::vector<int32_t>* tokens = nullptr) {
    while (true) {
      std::optional<StreamEvent> event = channel.next(std::chrono::milliseconds(0));
      if (!event) ADD_FAILURE() << "the request did not end";
      if (!event || event->final) return event.value_or(StreamEvent{});
      if (tokens) tokens->insert(tokens->end(), event->tokens.begin(), event->tokens.end());
    }
  }

  ModelConfig model_;
  test::LetterTokenizer tokenizer_{kVocab};
  std::shared_ptr<EngineSignal> signal_ = std::make_shared<EngineSignal>();
  std::unique_ptr<Scheduler> scheduler_;
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  int admitted_ = 0;
  int finished_ = 0;
};

// Proposes the same guesses every time (at most what it is asked for), and records what ended.
class FixedDrafter : public Drafter {
 public:
  explicit FixedDrafter(std::vector<int32_t> guesses, std::vector<int64_t>* finished = nullptr)
      : guesses_(std::move(guesses)), finished_(finished) {}
  std::vector<int32_t> propose(int64_t, std::span<const int32_t>, int32_t max_tokens) override {
    return {guesses_.begin(), guesses_.begin() + std::min<size_t>(guesses_.size(), static_cast<size_t>(max_tokens))};
  }
  void finished(int64_t seq, std::span<const int32_t>, int64_t) override {
    if (finished_) finished_->push_back(seq);
  }

 private:
  std::vector<int32_t> guesses_;
  std::vector<int64_t>* finished_;
};

TEST_F(SchedulerTest, AVerifyRowKeepsTheDraftsTheModelAgreesWithAndDropsTheRest) {
  std::vector<int64_t> ended;
  Scheduler& s = make(/*max_batch_tokens=*/64, /*num_blocks=*/16, 4, true, {},
                      std::make_unique<FixedDrafter>(std::vector<int32_t>{7, 7, 9}, &ended), 3);
  s.set_step_costs(StepCosts(0.0));  // rows cost nothing: every draft pays
  auto channel = add(1, iota(6), 10);
  run(s.schedule(now_));  // the prompt, then its first token (7)
  const int32_t free_before = s.pool().blocks_free();

  const StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].num_draft, 3);
  EXPECT_TRUE(p.rows[0].all_logits);
  EXPECT_EQ(p.rows[0].tokens, (std::vector<int32_t>{7, 7, 7, 9}));  // its last token, then the drafts
  EXPECT_EQ(p.rows[0].start, 6);
  // The model agrees with the first two drafts and then says 8 where the drafter guessed 9.
  run(p, /*token=*/5, /*verified=*/{7, 7, 8});
  EXPECT_EQ(s.counters().spec_draft_tokens, 3);
  EXPECT_EQ(s.counters().spec_accepted_tokens, 2);
  // Positions 6..8 keep their K/V (the last token and two drafts); position 9 (the draft 9) went
  // with its block, and 8 is the next token to compute.
  EXPECT_EQ(s.pool().blocks_free(), free_before - 1);  // 9 positions: 3 blocks of 4
  const StepPlan next = s.schedule(now_);
  ASSERT_EQ(next.rows.size(), 1u);
  EXPECT_EQ(next.rows[0].start, 9);
  EXPECT_EQ(next.rows[0].tokens.front(), 8);
  run(next, 5, {7, 7, 9});  // every draft kept, and the last row's 5 comes free

  std::vector<int32_t> tokens;
  for (int step = 0; step < 8 && s.has_work(); ++step) run(s.schedule(now_), 5, {7, 7, 9});
  const StreamEvent last = drain(*channel, &tokens);
  // max_tokens 10 leaves room for one draft in the last verify: 7 kept, then 5.
  EXPECT_EQ(tokens, (std::vector<int32_t>{7, 7, 7, 8, 7, 7, 9, 5, 7, 5}));
  EXPECT_EQ(last.finish_reason, RequestFinishReason::kLength);
  EXPECT_EQ(ended, (std::vector<int64_t>{1}));
  EXPECT_EQ(s.pool().blocks_free(), 16);
}

TEST_F(SchedulerTest, SampledAndLogprobRequestsSpeculateAndDraftsNeverPassMaxTokens) {
  Scheduler& s = make(64, 32, 4, true, {}, std::make_unique<FixedDrafter>(std::vector<int32_t>{1, 2, 3, 4}), 4);
  s.set_step_costs(StepCosts(0.0));  // rows cost nothing: every draft pays
  const auto forever = Clock::time_point::max();
  add(1, iota(4), 3);  // greedy, room for 2 more tokens after the first
  add(2, iota(4, 10), 8);
  add(3, iota(4, 20), 8, MaskPolicy::causal(), forever, /*temperature=*/0.8f);
  add(4, iota(4, 30), 8, MaskPolicy::causal(), forever, 0.0f, /*logprobs=*/0);
  run(s.schedule(now_));
  const StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.rows.size(), 4u);
  EXPECT_EQ(row_of(p, 1)->num_draft, 1);  // max_tokens 3, one out: a draft and the token after it
  EXPECT_EQ(row_of(p, 2)->num_draft, 4);
  EXPECT_TRUE(row_of(p, 2)->draft_uniforms.empty());  // greedy: nothing to draw
  EXPECT_EQ(row_of(p, 3)->num_draft, 4);              // sampled: a draw for each draft position
  EXPECT_EQ(row_of(p, 3)->draft_uniforms.size(), 4u);
  EXPECT_EQ(row_of(p, 4)->num_draft, 4);  // logprobs come back for each verified token
}

// Row j of a verify is sampled as if drafts 0..j-1 were generated (they were, when it counts), so a
// penalised request speculates with a penalty list per row, the last row's being sample's own.
TEST_F(SchedulerTest, APenalisedVerifyCountsTheDraftsBeforeEachRow) {
  Scheduler& s = make(64, 32, 4, true, {}, std::make_unique<FixedDrafter>(std::vector<int32_t>{5, 5, 9}), 3);
  s.set_step_costs(StepCosts(0.0));  // rows cost nothing: every draft pays
  add(1, iota(4), 12, MaskPolicy::causal(), Clock::time_point::max(), 0.0f, std::nullopt, 0,
      /*presence_penalty=*/0.5f);
  run(s.schedule(now_));  // the prompt, then 7
  const StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.rows.size(), 1u);
  const StepRow& row = p.rows[0];
  ASSERT_EQ(row.num_draft, 3);
  ASSERT_EQ(row.draft_penalties.size(), 4u);
  auto counts = [](const PenaltyLists& lists) {
    std::map<int32_t, int32_t> by_token;
    for (size_t i = 0; i < lists.tokens.size(); ++i) by_token[lists.tokens[i]] = lists.counts[i];
    return by_token;
  };
  const std::map<int32_t, int32_t> before{{7, 1}};  // a presence penalty lists generated tokens only
  EXPECT_EQ(counts(row.draft_penalties[0]), before);
  std::map<int32_t, int32_t> want = before;
  want[5] = 1;
  EXPECT_EQ(counts(row.draft_penalties[1]), want);
  want[5] = 2;
  EXPECT_EQ(counts(row.draft_penalties[2]), want);
  want[9] = 1;
  EXPECT_EQ(counts(row.draft_penalties[3]), want);
  ASSERT_TRUE(row.sample.has_value());
  EXPECT_EQ(row.sample->penalty_tokens.data(), row.draft_penalties[3].tokens.data());
  EXPECT_EQ(row.sample->penalty_counts.data(), row.draft_penalties[3].counts.data());
}

TEST_F(SchedulerTest, AMinTokensRequestSpeculatesOnceItHasGeneratedThem) {
  Scheduler& s = make(64, 32, 4, true, {}, std::make_unique<FixedDrafter>(std::vector<int32_t>{1, 2}), 2);
  add(1, iota(4), 12, MaskPolicy::causal(), Clock::time_point::max(), 0.0f, std::nullopt, /*min_tokens=*/3);
  run(s.schedule(now_));  // the prompt and the first token
  for (int generated = 1; generated < 3; ++generated) {
    const StepPlan p = s.schedule(now_);
    ASSERT_EQ(p.rows.size(), 1u);
    EXPECT_EQ(p.rows[0].num_draft, 0) << generated << " generated";
    run(p);
  }
  EXPECT_EQ(s.schedule(now_).rows[0].num_draft, 2);  // 3 generated: nothing is masked any more
}

TEST_F(SchedulerTest, DraftLengthShrinksWhileDraftsMissAndGrowsBackWhenTheyLand) {
  Scheduler& s = make(64, 32, 4, true, {}, std::make_unique<FixedDrafter>(std::vector<int32_t>{1, 2, 3, 4}), 4);
  s.set_step_costs(StepCosts({1, 2, 3, 4, 5}, {1.0, 1.09, 1.135, 1.18, 1.225}));  // the H100's SmolLM2 verifies
  add(1, iota(4), 40);
  run(s.schedule(now_));
  StepPlan p = s.schedule(now_);
  EXPECT_EQ(p.rows[0].num_draft, 4);  // a new sequence is expected to keep most drafts
  std::vector<int32_t> lengths;
  for (int miss = 0; miss < 3; ++miss) {
    run(p, 5, std::vector<int32_t>(static_cast<size_t>(p.rows[0].num_draft), 9));  // the first draft rejected
    p = s.schedule(now_);
    lengths.push_back(p.rows[0].num_draft);
  }
  EXPECT_EQ(lengths, (std::vector<int32_t>{2, 1, 1}));
  lengths.clear();
  for (int land = 0; land < 2; ++land) {
    run(p, 5, std::vector<int32_t>(p.rows[0].tokens.begin() + 1, p.rows[0].tokens.end()));  // every draft kept
    p = s.schedule(now_);
    lengths.push_back(p.rows[0].num_draft);
  }
  EXPECT_EQ(lengths, (std::vector<int32_t>{3, 4}));
}

TEST_F(SchedulerTest, NoSpeculationWithMoreRunningSequencesThanTheLimit) {
  Scheduler& s = make(64, 32, 4, true, {}, std::make_unique<FixedDrafter>(std::vector<int32_t>{1, 2}), 2,
                      /*speculation_max_running=*/1);
  add(1, iota(4), 8);
  add(2, iota(4, 10), 8);
  run(s.schedule(now_));
  const StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[0].num_draft + p.rows[1].num_draft, 0);
}

TEST_F(SchedulerTest, PrefillChunksAreCappedAndLeaveEveryDecodeItsToken) {
  Scheduler& s = make(/*max_batch_tokens=*/10, /*num_blocks=*/64, 4, true, PrefillPolicy{/*chunk_tokens=*/4, 0});
  add(1, iota(20), 2);
  add(2, iota(3, 30), 2);
  add(3, iota(30, 40), 2);

  StepPlan p1 = s.schedule(now_);
  ASSERT_EQ(p1.rows.size(), 3u);  // every prompt takes at most a chunk: all three start
  EXPECT_EQ(row_of(p1, 1)->q_len(), 4);
  EXPECT_EQ(row_of(p1, 2)->q_len(), 3);
  EXPECT_EQ(row_of(p1, 3)->q_len(), 3);  // what is left of the budget
  run(p1);

  // Sequence 2 now decodes behind sequence 1's prompt: its token is kept out of the prefills' share.
  StepPlan p2 = s.schedule(now_);
  ASSERT_EQ(p2.rows.size(), 3u);
  EXPECT_EQ(p2.rows[0].seq, 2);
  EXPECT_EQ(p2.rows[0].q_len(), 1);
  EXPECT_EQ(row_of(p2, 1)->q_len(), 4);
  EXPECT_EQ(row_of(p2, 3)->q_len(), 4);
  run(p2);
}

TEST_F(SchedulerTest, ADecodeBehindAPromptGetsItsTokenEveryStep) {
  Scheduler& s = make(/*max_batch_tokens=*/8, /*num_blocks=*/64, 4, true, PrefillPolicy{/*chunk_tokens=*/3, 0});
  add(1, iota(30), 4);
  add(2, iota(2, 40), 4);
  run(s.schedule(now_));  // 1 takes a chunk of 3, 2 its whole prompt of 2
  for (int step = 0; step < 3; ++step) {  // 2 decodes behind 1's prompt, a token each step
    const StepPlan p = s.schedule(now_);
    ASSERT_EQ(p.rows.size(), 2u);
    EXPECT_EQ(row_of(p, 2)->q_len(), 1);
    EXPECT_EQ(row_of(p, 1)->q_len(), 3);
    run(p);
  }
}

TEST_F(SchedulerTest, MaxPrefillsPerStepBoundsThePromptsOfAStep) {
  Scheduler& s = make(/*max_batch_tokens=*/64, /*num_blocks=*/64, 4, true, PrefillPolicy{0, /*max_per_step=*/1});
  add(1, iota(5), 2);
  add(2, iota(5, 20), 2);
  StepPlan p1 = s.schedule(now_);
  ASSERT_EQ(p1.rows.size(), 1u);  // the budget had room for both prompts; the policy takes one
  EXPECT_EQ(p1.rows[0].seq, 1);
  run(p1);
  StepPlan p2 = s.schedule(now_);
  ASSERT_EQ(p2.rows.size(), 2u);  // 1's decode does not count as a prefill
  EXPECT_EQ(row_of(p2, 1)->q_len(), 1);
  EXPECT_EQ(row_of(p2, 2)->q_len(), 5);
}

TEST_F(SchedulerTest, ChunksPromptsUnderTheTokenBudgetThenDecodesFirst) {
  Scheduler& s = make(/*max_batch_tokens=*/8, /*num_blocks=*/32);
  add(1, iota(12), 2);
  add(2, iota(5, 20), 2);

  StepPlan p1 = s.schedule(now_);
  ASSERT_EQ(p1.rows.size(), 1u);  // the budget goes to the oldest prompt
  EXPECT_EQ(p1.rows[0].start, 0);
  EXPECT_EQ(p1.rows[0].q_len(), 8);
  EXPECT_FALSE(p1.rows[0].sample);  // its prompt is not done: nothing to sample
  EXPECT_EQ(p1.rows[0].block_table.size(), 2u);
  run(p1);
  EXPECT_EQ(admitted_, 1);

  StepPlan p2 = s.schedule(now_);
  ASSERT_EQ(p2.rows.size(), 2u);
  EXPECT_EQ(row_of(p2, 1)->start, 8);
  EXPECT_EQ(row_of(p2, 1)->q_len(), 4);
  EXPECT_TRUE(row_of(p2, 1)->sample);
  EXPECT_EQ(row_of(p2, 2)->q_len(), 4);  // what is left of the budget
  run(p2, /*token=*/9);

  // Sequence 1 decodes the token it was given; its row comes first (single-token rows lead).
  StepPlan p3 = s.schedule(now_);
  ASSERT_EQ(p3.rows.size(), 2u);
  EXPECT_EQ(p3.rows[0].seq, 1);
  EXPECT_EQ(p3.rows[0].tokens, std::vector<int32_t>{9});
  EXPECT_EQ(p3.rows[0].start, 12);
  EXPECT_EQ(p3.rows[1].seq, 2);
  EXPECT_EQ(p3.rows[1].start, 4);
}

TEST_F(SchedulerTest, FinishesAtMaxTokensAndFreesTheBlocks) {
  Scheduler& s = make(64, 16);
  auto channel = add(1, iota(6), 3);
  for (int step = 0; step < 3; ++step) run(s.schedule(now_), 11 + step);
  EXPECT_FALSE(s.has_work());
  std::vector<int32_t> tokens;
  const StreamEvent last = drain(*channel, &tokens);
  EXPECT_EQ(last.finish_reason, RequestFinishReason::kLength);
  EXPECT_EQ(tokens, (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(last.completion_tokens, 3);
  EXPECT_EQ(s.pool().blocks_used(), 0);
  EXPECT_EQ(finished_, 1);
  EXPECT_EQ(s.schedule(now_).freed, std::vector<SeqId>{1});
}

TEST_F(SchedulerTest, PreemptsTheNewestRunningSequenceWhenBlocksRunOut) {
  // 5 blocks of 4 tokens: a 7-token and a 3-token prompt take 2 + 1. Each decodes into a new block
  // at positions 8 and 4 (none left), and at position 12 the older one needs a block that only
  // the newer one's can give.
  Scheduler& s = make(64, 5);
  add(1, iota(7), 16);
  add(2, iota(3, 30), 16);
  StepPlan first = s.schedule(now_);
  ASSERT_EQ(first.rows.size(), 2u);
  run(first);
  StepPlan plan;
  for (int i = 0; i < 10 && plan.preempted.empty(); ++i) {
    plan = s.schedule(now_);
    run(plan);
  }
  EXPECT_EQ(plan.preempted, std::vector<SeqId>{2});
  ASSERT_EQ(plan.rows.size(), 1u);
  EXPECT_EQ(plan.rows[0].seq, 1);
  EXPECT_EQ(plan.rows[0].start, 12);
  EXPECT_EQ(s.counters().preemptions, 1);
  EXPECT_EQ(s.num_waiting(), 1);  // at the queue's front, to be recomputed when blocks free up
  EXPECT_EQ(s.num_running(), 1);
}

TEST_F(SchedulerTest, AttachesCachedPrefixBlocksInsteadOfComputingThem) {
  Scheduler& s = make(64, 32);
  auto first = add(1, iota(10), 1);
  run(s.schedule(now_));
  drain(*first);
  auto second = add(2, iota(10), 1);  // 2 full blocks of 4 cached; the last token is computed
  StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].start, 8);
  EXPECT_EQ(p.rows[0].q_len(), 2);
  EXPECT_EQ(s.counters().prefix_hits, 8);
  run(p);
  EXPECT_EQ(drain(*second).cached_prompt_tokens, 8);
}

TEST_F(SchedulerTest, CopiesACachedDocumentInsteadOfComputingIt) {
  Scheduler& s = make(64, 64);
  // Two 8-token documents then a 3-token question; the second prompt has the documents swapped.
  const std::vector<int32_t> doc_a = iota(8, 1), doc_b = iota(8, 20), question = {40, 41, 42};
  auto prompt_of = [&](const std::vector<int32_t>& x, const std::vector<int32_t>& y) {
    std::vector<int32_t> p = x;
    p.insert(p.end(), y.begin(), y.end());
    p.insert(p.end(), question.begin(), question.end());
    return p;
  };
  auto first = add(1, prompt_of(doc_a, doc_b), 1, MaskPolicy::segments({8, 8}));
  run(s.schedule(now_));
  drain(*first);
  add(2, prompt_of(doc_b, doc_a), 1, MaskPolicy::segments({8, 8}));
  StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.copies.size(), 2u);  // both documents, re-rotated to their new places
  EXPECT_EQ(p.copies[0].dst_slots.size(), 8u);
  EXPECT_EQ(p.copies[0].rotate_by[0], -8);
  EXPECT_EQ(p.copies[1].rotate_by[0], 8);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].start, 16);  // only the question is computed
  EXPECT_EQ(p.rows[0].q_len(), 3);
  EXPECT_EQ(s.counters().segment_reused_tokens, 16);
  run(p);
}

TEST_F(SchedulerTest, EndsRequestsPastTheirDeadlineAndCancelledOnes) {
  Scheduler& s = make(64, 32);
  auto late = add(1, iota(5), 4, MaskPolicy::causal(), now_ + std::chrono::seconds(2));
  auto gone = add(2, iota(5), 4);
  auto kept = add(3, iota(5), 4);
  run(s.schedule(now_));
  EXPECT_GT(s.pool().blocks_used(), 0);
  gone->cancel();
  now_ += std::chrono::seconds(3);
  s.expire(now_);
  EXPECT_EQ(drain(*late).finish_reason, RequestFinishReason::kDeadline);
  EXPECT_EQ(drain(*gone).finish_reason, RequestFinishReason::kCancelled);
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.pool().blocks_used(), 2);  // sequence 3 holds its two
  StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].seq, 3);
  EXPECT_EQ(p.freed, (std::vector<SeqId>{1, 2}));
}

TEST_F(SchedulerTest, AFailedStepEndsItsSequencesWithTheError) {
  Scheduler& s = make(64, 32);
  auto channel = add(1, iota(5), 4);
  const StepPlan p = s.schedule(now_);
  s.fail_step(p, "forward failed: device lost");
  const StreamEvent last = drain(*channel);
  EXPECT_EQ(last.finish_reason, RequestFinishReason::kError);
  EXPECT_EQ(last.error, "forward failed: device lost");
  EXPECT_EQ(s.pool().blocks_used(), 0);
  EXPECT_FALSE(s.has_work());
}

TEST_F(SchedulerTest, PromptLogprobRowsAskForEveryLogitAndTheirTargets) {
  Scheduler& s = make(64, 32);
  auto seq = std::make_unique<Sequence>();
  seq->request.prompt = iota(6);
  seq->request.sampling.max_tokens = 0;
  seq->request.sampling.prompt_logprobs = 2;
  seq->output = std::make_unique<SequenceOutput>(seq->request.sampling, seq->request.prompt, model_, tokenizer_);
  seq->kv.id = 1;
  seq->kv.tokens = seq->request.prompt;
  seq->channel = std::make_shared<RequestChannel>(signal_);
  auto channel = seq->channel;
  s.add(std::move(seq));
  const StepPlan p = s.schedule(now_);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_TRUE(p.rows[0].all_logits);
  ASSERT_TRUE(p.rows[0].scores);
  EXPECT_EQ(p.rows[0].scores->targets, iota(5, 2));  // row r predicts prompt token r + 1
  EXPECT_FALSE(p.rows[0].sample);
  StepResult result;
  result.sampled.resize(1);
  result.scores.resize(1);
  for (int32_t t : p.rows[0].scores->targets) result.scores[0].push_back({t, -1.0f, {}});
  s.update(p, std::move(result), now_);
  const StreamEvent last = drain(*channel);
  EXPECT_EQ(last.finish_reason, RequestFinishReason::kLength);
  EXPECT_EQ(last.prompt_logprobs.size(), 5u);
}

}  // namespace
}  // namespace tessera
