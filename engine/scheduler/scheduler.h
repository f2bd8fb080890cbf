// engine/scheduler/scheduler.h: Scheduler, the continuous-batching policy of one served LM, and
// Sequence, the one record of each generate request inside the engine. The scheduler owns every
// sequence (waiting and running) and the KV bookkeeping (block pool, prefix cache, segment index).
// schedule() plans a step as a value, an executor runs it, update() applies what it sampled. It has
// no threads and no backend, and takes the time as an argument, so tests drive it with a fake clock.
//
// Thread safety: none. The engine thread owns a Scheduler.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/scheduler/engine_config.h"
#include "engine/scheduler/request.h"
#include "engine/scheduler/request_channel.h"
#include "engine/scheduler/sequence_output.h"
#include "engine/speculative/draft_budget.h"
#include "engine/speculative/drafter.h"
#include "engine/step_plan.h"

namespace tessera {

class Tokenizer;

// One generate request inside the engine, from submit to its final event.
struct Sequence {
  GenerateRequest request;
  std::shared_ptr<RequestChannel> channel;
  std::shared_ptr<const Tokenizer> tokenizer;  // keeps output's tokenizer alive
  std::unique_ptr<SequenceOutput> output;
  SequenceKv kv;                  // id, mask policy, the prompt then every generated token, its blocks
  // Constrained decoding: the generated tokens walked through the request's grammar. It outlives
  // preemption, so a recomputed sequence resumes where its output stands.
  std::unique_ptr<GrammarMatcher> grammar;
  size_t lm = 0;                  // index of its served LM
  int64_t cached_prompt_tokens = 0;  // reused from the prefix cache or the segment index, first admission
  // Prompt logprobs (sampling.prompt_logprobs): prompt tokens scored so far (token 1 onwards), and
  // the scores not yet sent, which go out with the request's first event.
  int64_t prompt_scored = 0;
  std::vector<StreamTokenLogprob> prompt_logprobs;
  // Speculative decoding: how often its drafts were kept lately, which says how likely its next
  // ones are to land (draft_budget.h).
  DraftAcceptance draft_acceptance;
  bool admitted_once = false;     // counted out of the queue bound at first admission
  bool done = false;              // final event sent; swept from the lists after the step
  Clock::time_point arrival;
  Clock::time_point last_token_time;

  SeqId id() const { return kv.id; }
  int64_t prompt_size() const { return static_cast<int64_t>(request.prompt.size()); }
  // Prompt tokens still to score: such a sequence computes every prompt row's logits and attaches
  // no cached blocks.
  bool scoring_prompt() const {
    return request.sampling.prompt_logprobs.has_value() && prompt_scored + 1 < prompt_size();
  }
};

struct SchedulerConfig {
  int32_t max_batch_tokens = 2048;      // tokens per step (decodes + prefill chunks)
  int32_t max_running_sequences = 128;  // decoding at once
  PrefillPolicy prefill;
  // Speculative decoding: draft tokens a decoding sequence may have verified in one step (0: off;
  // needs a drafter). Requests without prompt logprobs speculate, once they have generated their
  // min_tokens: a greedy one's output is the same token for token, a sampled one's has the same
  // distribution (penalties count the drafts before each position as generated).
  int32_t num_speculative_tokens = 0;
  int32_t speculation_max_running = 0;  // no speculation with more running sequences (0: no limit)
  double untimed_row_cost = StepCosts::kUntimedRowShare;  // a draft row's price until set_step_costs
  int64_t max_model_len = 0;            // the context a sequence may fill, >= 2
  KvCacheManagerConfig kv;
  void validate() const;                // throws naming the field
};

// Counters since the scheduler was made (EngineStats adds them up over the served LMs).
struct SchedulerCounters {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t finished = 0;                 // final events sent, any reason
  int64_t prefix_queries = 0;           // tokens looked up at admissions
  int64_t prefix_hits = 0;              // of those, tokens found cached
  int64_t prompt_tokens_computed = 0;   // prompt positions run through a forward
  int64_t segment_reused_tokens = 0;    // document tokens whose K/V was copied from the segment index
  int64_t spec_drafts = 0;              // verify rows planned
  int64_t spec_draft_tokens = 0;        // draft tokens in them
  int64_t spec_accepted_tokens = 0;     // of those, kept
};

class Scheduler {
 public:
  // What the engine loop learns of its requests' lives (the queue bound, wait_idle). Either may be
  // empty.
  struct Lifecycle {
    std::function<void(const Sequence&)> admitted;  // first admission
    std::function<void(const Sequence&)> finished;  // its final event went out
  };
  // observer may be null and must outlive the scheduler otherwise. drafter may be null (no
  // speculation).
  Scheduler(const SchedulerConfig& config, EngineObserver* observer, Lifecycle lifecycle = {},
            std::unique_ptr<Drafter> drafter = nullptr);

  // Queues a new sequence (its kv.id, kv.policy and kv.tokens set) behind the waiting ones.
  void add(std::unique_ptr<Sequence> seq);
  // Ends cancelled sequences and those past their deadline, queued or running.
  void expire(Clock::time_point now);
  // The next step: running sequences first, oldest first (a decode token each, or the next prefill
  // chunk), then waiting ones while the token budget, the sequence cap and the free blocks allow.
  // Prefill chunks follow config.prefill and leave a token of the budget to each decode after them.
  // When the pool is short a prefill chunk shrinks to what fits; otherwise the newest running
  // sequence is preempted (recomputed later). Slots are allocated as rows are planned. Empty when
  // nothing can run.
  StepPlan schedule(Clock::time_point now);
  // Applies a plan's results: the K/V it wrote enters the prefix cache, prompt scores and sampled
  // tokens go to their requests, finished sequences end.
  void update(const StepPlan& plan, StepResult result, Clock::time_point now);
  // The plan's forward failed: its sequences' K/V is unusable. They end with `message`.
  void fail_step(const StepPlan& plan, const std::string& message);
  // Every sequence ends with `message` (shutdown, a device failure).
  void fail_all(const std::string& message);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const KvBlockPool& pool() const { return kv_.pool(); }
  const SchedulerCounters& counters() const { return counters_; }
  const SchedulerConfig& config() const { return config_; }
  // What decode steps cost on this backend by their rows (Executor::warm_up measures them), which
  // sets how many drafts a step verifies; unset, StepCosts' default.
  void set_step_costs(StepCosts costs) { step_costs_ = std::move(costs); }
  // The plan's step took `seconds` from planning to its results: a step of decodes and verifies
  // updates the step costs.
  void observe_step(const StepPlan& plan, double seconds);

 private:
  // What is left of a step's capacity while it is planned.
  struct Budget {
    int64_t tokens = 0;
    int64_t free_blocks = 0;
    // Rows before a sequence's last whose logits the step may still compute (prompt scoring and
    // speculative verifies): bounds the step's logits.
    int64_t logit_rows = 0;
    int64_t prefills = 0;     // prefill chunks the step may still take
    int64_t decodes_ahead = 0;  // decoding sequences not planned yet: a token each is theirs
  };
  // The prompt tokens a prefill chunk may take now: the budget less the decodes' tokens, at most a
  // chunk of the policy's size; 0 when the step takes no more prefills.
  int64_t prefill_budget(const Budget& budget) const;
  bool decoding(const Sequence& seq) const;
  void schedule_running(StepPlan& plan, Budget& budget);
  void admit_waiting(StepPlan& plan, Budget& budget, Clock::time_point now);
  // The prompt tokens `seq` may compute this step for scoring, at most n (0: none this step).
  int64_t limit_scoring(const Sequence& seq, int64_t n, const Budget& budget) const;
  // Shrinks n to what the free blocks take, or preempts the newest running sequence after
  // `running_index` until it fits. False when seq itself had to go.
  bool make_room(size_t running_index, int64_t& n, StepPlan& plan, Budget& budget);
  // Admits the front waiting sequence with the cached prefix it finds; false when it does not fit.
  bool admit_front(Budget& budget, Clock::time_point now);
  // Copies in the cached documents that start at seq's next position, while the free blocks allow.
  void reuse_segments(Sequence& seq, StepPlan& plan, Budget& budget);
  // How many of seq's next tokens to compute, at most `budget`: a chunk stops where the next
  // document the index holds starts, so that the next step copies it in.
  int64_t chunk_size(const Sequence& seq, int64_t budget) const;
  int64_t blocks_needed(const Sequence& seq, int64_t n) const;
  // Allocates seq's next n tokens and the drafts after them, and adds its row to the plan.
  void plan_row(Sequence& seq, int64_t n, StepPlan& plan, Budget& budget, std::span<const int32_t> drafts = {});
  void plan_prompt_scores(const Sequence& seq, StepRow& row, Budget& budget);
  void add_drafts(StepRow& row, std::span<const int32_t> drafts, Budget& budget);
  static void add_draft_penalties(StepRow& row);
  // Whether a decoding seq may speculate without changing its output (or its distribution).
  bool speculates(const Sequence& seq) const;
  // The drafter's guesses for every running sequence that decodes and speculates this step, asked
  // for at once (a draft model batches them), as many as each request allows.
  std::unordered_map<SeqId, std::vector<int32_t>> draft_all();
  // The drafts a sequence may verify: at most its draft length, what the context and max_tokens
  // leave.
  int64_t draft_room(const Sequence& seq) const;
  // A sequence's guesses cut to what the step's budgets leave, under a grammar to what it accepts.
  std::vector<int32_t> trim_drafts(const Sequence& seq, const Budget& budget, std::vector<int32_t> drafts) const;
  static size_t grammar_allowed_prefix(GrammarMatcher& grammar, std::span<const int32_t> drafts);
  // What a verify row's results emit: the samples that matched their drafts, then the sample after
  // the last of them.
  std::vector<SampleOutcome> accepted_tokens(const StepRow& row, const std::vector<SampleOutcome>& verified,
                                             const SampleOutcome& last) const;
  void apply_verify(Sequence& seq, const StepRow& row, const std::vector<SampleOutcome>& verified,
                    const SampleOutcome& last, Clock::time_point now);
  void preempt(size_t running_index, StepPlan& plan);
  // The sequence now fills the context (its next token ends it with "length").
  bool context_full(const Sequence& seq) const;
  void apply_row(Sequence& seq, const StepRow& row, const std::optional<SampleOutcome>& sampled,
                 std::vector<StreamTokenLogprob>& scores, const std::vector<SampleOutcome>& verified,
                 Clock::time_point now);
  // Takes a sampled token into seq's output and grammar and sends it; throws when the grammar
  // refuses it.
  void emit_sampled(Sequence& seq, const SampleOutcome& sampled, Clock::time_point now);
  void emit_token(Sequence& seq, SequenceOutput::Advance advance, Clock::time_point now);
  // Walks the sampled token through seq's grammar: false when the grammar refuses it. A grammar
  // that is complete ends the sequence.
  bool advance_grammar(Sequence& seq, SequenceOutput::Advance& advance);
  void finish(Sequence& seq, RequestFinishReason reason, std::string error = {});
  // The sequence of row `row` of the plan last scheduled (checked against the plan given).
  Sequence& planned(const StepPlan& plan, size_t row);
  void decode_rows_first(StepPlan& plan);
  void release_copies(const StepPlan& plan);
  void sweep();

  SchedulerConfig config_;
  EngineObserver* observer_ = nullptr;
  Lifecycle lifecycle_;
  KvCacheManager kv_;
  std::unique_ptr<Drafter> drafter_;
  StepCosts step_costs_;
  std::deque<std::unique_ptr<Sequence>> waiting_;  // preempted ones at the front, then arrival order
  std::vector<std::unique_ptr<Sequence>> running_; // admission order: the back is the newest
  std::vector<SeqId> freed_;                       // ended since the last plan
  std::vector<Sequence*> planned_;                 // the last plan's sequences, one per row
  SchedulerCounters counters_;
};

}  // namespace tessera
