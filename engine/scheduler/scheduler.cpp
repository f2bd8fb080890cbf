// engine/scheduler/scheduler.cpp: Scheduler (see scheduler.h).
#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <exception>
#include <unordered_map>

#include "common/error.h"
#include "engine/grammar/grammar.h"

namespace tessera {

namespace {

// Rows whose logits one step computes for prompt logprobs and speculative verifies (beside each
// sequence's last row): bounds the step's logits at this many rows of the vocabulary.
constexpr int64_t kEarlierLogitRowsPerStep = 512;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void SchedulerConfig::validate() const {
  TESSERA_CHECK(max_batch_tokens >= 1, "scheduler: max_batch_tokens must be >= 1, got " << max_batch_tokens);
  TESSERA_CHECK(max_running_sequences >= 1,
                "scheduler: max_running_sequences must be >= 1, got " << max_running_sequences);
  TESSERA_CHECK(max_model_len >= 2, "scheduler: max_model_len must be >= 2, got " << max_model_len);
  prefill.validate();
  TESSERA_CHECK(num_speculative_tokens >= 0,
                "scheduler: num_speculative_tokens must be >= 0 (0: off), got " << num_speculative_tokens);
}

Scheduler::Scheduler(const SchedulerConfig& config, EngineObserver* observer, Lifecycle lifecycle,
                     std::unique_ptr<Drafter> drafter)
    : config_(config), observer_(observer), lifecycle_(std::move(lifecycle)), kv_(config.kv),
      drafter_(std::move(drafter)), step_costs_(config.untimed_row_cost) {
  config_.validate();
}

void Scheduler::add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

void Scheduler::expire(Clock::time_point now) {
  auto check = [&](Sequence& seq) {
    if (seq.channel->cancelled()) {
      finish(seq, RequestFinishReason::kCancelled);
    } else if (now >= seq.request.deadline) {
      finish(seq, RequestFinishReason::kDeadline);
    }
  };
  for (auto& seq : running_) check(*seq);
  for (auto& seq : waiting_) check(*seq);
  sweep();
}

// ---- planning ----

StepPlan Scheduler::schedule(Clock::time_point now) {
  StepPlan plan;
  planned_.clear();
  Budget budget{config_.max_batch_tokens, kv_.pool().blocks_free(), kEarlierLogitRowsPerStep};
  budget.prefills = config_.prefill.max_per_step > 0 ? config_.prefill.max_per_step : INT64_MAX;
  budget.decodes_ahead = std::count_if(running_.begin(), running_.end(), [&](const auto& s) { return decoding(*s); });
  schedule_running(plan, budget);
  admit_waiting(plan, budget, now);
  decode_rows_first(plan);
  plan.freed = std::move(freed_);
  freed_.clear();
  return plan;
}

// Single-token and verify rows first: the executor runs each of their tokens as a decode, a GPU
// backend runs that prefix through its decode kernel, reading the keys in place, and gathers keys
// only for the prompt chunks after it. planned_ follows the rows.
void Scheduler::decode_rows_first(StepPlan& plan) {
  std::vector<size_t> order(plan.rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(),
                        [&](size_t i) { return plan.rows[i].q_len() == 1 || plan.rows[i].num_draft > 0; });
  std::vector<StepRow> rows;
  std::vector<Sequence*> seqs;
  rows.reserve(order.size());
  seqs.reserve(order.size());
  for (const size_t i : order) {
    rows.push_back(std::move(plan.rows[i]));
    seqs.push_back(planned_[i]);
  }
  plan.rows = std::move(rows);
  planned_ = std::move(seqs);
}

void Scheduler::schedule_running(StepPlan& plan, Budget& budget) {
  std::unordered_map<SeqId, std::vector<int32_t>> drafts = draft_all();
  for (size_t i = 0; i < running_.size() && budget.tokens > 0;) {
    Sequence& seq = *running_[i];
    const bool decode = decoding(seq);
    if (decode) --budget.decodes_ahead;
    reuse_segments(seq, plan, budget);
    int64_t n = limit_scoring(seq, chunk_size(seq, decode ? budget.tokens : prefill_budget(budget)), budget);
    if (n == 0) {
      ++i;  // its prompt (or its scoring) continues next step
      continue;
    }
    if (!make_room(i, n, plan, budget)) break;
    const auto guesses = drafts.find(seq.id());
    plan_row(seq, n, plan, budget,
             decode && guesses != drafts.end() ? trim_drafts(seq, budget, std::move(guesses->second))
                                                : std::vector<int32_t>());
    if (!decode) --budget.prefills;
    ++i;
  }
}

bool Scheduler::decoding(const Sequence& seq) const {
  return seq.kv.num_computed + 1 == static_cast<int64_t>(seq.kv.tokens.size());
}

int64_t Scheduler::prefill_budget(const Budget& budget) const {
  if (budget.prefills <= 0) return 0;
  int64_t n = budget.tokens - budget.decodes_ahead;
  if (config_.prefill.chunk_tokens > 0) n = std::min<int64_t>(n, config_.prefill.chunk_tokens);
  return std::max<int64_t>(n, 0);
}

int64_t Scheduler::limit_scoring(const Sequence& seq, int64_t n, const Budget& budget) const {
  return seq.scoring_prompt() ? std::min(n, budget.logit_rows) : n;
}

bool Scheduler::make_room(size_t running_index, int64_t& n, StepPlan& plan, Budget& budget) {
  const Sequence& seq = *running_[running_index];
  const int64_t block_size = kv_.block_size();
  while (blocks_needed(seq, n) > budget.free_blocks) {
    const int64_t slack = ceil_div(seq.kv.num_computed, block_size) * block_size - seq.kv.num_computed;
    const int64_t fit = slack + budget.free_blocks * block_size;
    if (fit >= 1 && fit < n) {
      n = fit;
      continue;
    }
    // The oldest always fits: submit checked that every request fits an empty pool.
    const size_t victim = running_.size() - 1 > running_index ? running_.size() - 1 : running_index;
    if (victim != running_index && decoding(*running_[victim])) --budget.decodes_ahead;
    const int32_t before = kv_.pool().blocks_free();
    preempt(victim, plan);
    budget.free_blocks += kv_.pool().blocks_free() - before;
    if (victim == running_index) return false;
  }
  return true;
}

void Scheduler::admit_waiting(StepPlan& plan, Budget& budget, Clock::time_point now) {
  while (prefill_budget(budget) > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < config_.max_running_sequences) {
    if (!admit_front(budget, now)) break;
    Sequence& seq = *running_.back();
    reuse_segments(seq, plan, budget);
    plan_row(seq, limit_scoring(seq, chunk_size(seq, prefill_budget(budget)), budget), plan, budget);
    --budget.prefills;
  }
}

// One is admitted only when its whole prompt (plus generated tokens, after a preemption) and one
// more token fit in the free blocks, so admitting never forces a preemption at once. Leading blocks
// the prefix cache holds are attached instead of computed; cached blocks no sequence holds count as
// free until then, so attaching them uses up free blocks too.
bool Scheduler::admit_front(Budget& budget, Clock::time_point now) {
  Sequence& seq = *waiting_.front();
  if (seq.scoring_prompt() && budget.logit_rows == 0) return false;
  const int64_t total = static_cast<int64_t>(seq.kv.tokens.size());
  // A sequence that scores its prompt needs every prompt row's logits, so it computes them all.
  const PrefixHit hit = seq.scoring_prompt() ? PrefixHit{} : kv_.find_prefix(seq.kv.tokens, seq.kv.policy);
  const int64_t hit_blocks = static_cast<int64_t>(hit.blocks.size());
  if (ceil_div(total + 1, kv_.block_size()) - hit_blocks + hit.unheld > budget.free_blocks) return false;
  kv_.start(seq.kv, hit);
  budget.free_blocks -= hit.unheld;
  if (!seq.admitted_once) seq.cached_prompt_tokens = std::min<int64_t>(hit.tokens, seq.prompt_size());
  counters_.prefix_queries += total;
  counters_.prefix_hits += hit.tokens;
  if (observer_) observer_->on_prefix_cache_query(total, hit.tokens);
  if (!seq.admitted_once) {
    seq.admitted_once = true;
    if (lifecycle_.admitted) lifecycle_.admitted(seq);
    if (observer_) {
      observer_->on_request_started(seq.request, seconds_between(seq.arrival, now), seq.kv.policy.name());
    }
  }
  running_.push_back(std::move(waiting_.front()));
  waiting_.pop_front();
  return true;
}

void Scheduler::reuse_segments(Sequence& seq, StepPlan& plan, Budget& budget) {
  if (seq.scoring_prompt()) return;  // it needs every prompt row's logits
  const int64_t block_size = kv_.block_size();
  int64_t reused = 0;
  while (seq.kv.num_computed < static_cast<int64_t>(seq.kv.tokens.size())) {
    const std::optional<SegmentHit> hit = kv_.find_segment(seq.kv);
    if (!hit) break;
    const int64_t at = seq.kv.num_computed;
    const int64_t new_blocks = ceil_div(at + hit->length, block_size) - ceil_div(at, block_size);
    // The sources stay held until the step ran, so they count against the free blocks until then.
    if (new_blocks + hit->unheld > budget.free_blocks) break;  // computed instead
    plan.copies.push_back(kv_.reuse_segment(seq.kv, *hit));
    budget.free_blocks -= new_blocks + hit->unheld;
    reused += hit->length;
  }
  if (reused > 0) {
    counters_.segment_reused_tokens += reused;
    if (seq.output->num_generated() == 0) seq.cached_prompt_tokens += reused;
  }
}

int64_t Scheduler::chunk_size(const Sequence& seq, int64_t budget) const {
  const int64_t remaining = static_cast<int64_t>(seq.kv.tokens.size()) - seq.kv.num_computed;
  int64_t n = std::min(remaining, budget);
  if (n > 1 && !seq.scoring_prompt()) {
    const int64_t next = kv_.next_reusable_segment(seq.kv);
    if (next > seq.kv.num_computed) n = std::min(n, next - seq.kv.num_computed);
  }
  return n;
}

// New table entries appending n tokens to seq takes (an upper bound: sliding-window eviction only
// gives blocks back).
int64_t Scheduler::blocks_needed(const Sequence& seq, int64_t n) const {
  const int64_t block_size = kv_.block_size();
  return ceil_div(seq.kv.num_computed + n, block_size) - ceil_div(seq.kv.num_computed, block_size);
}

bool Scheduler::speculates(const Sequence& seq) const {
  const SamplingParams& s = seq.request.sampling;
  const bool small_batch = config_.speculation_max_running == 0 ||
                           static_cast<int32_t>(running_.size()) <= config_.speculation_max_running;
  // Until min_tokens are out, a step masks the stop ids by how many are out before it, which a verify
  // row's later drafts would need moved on; from then on nothing is masked.
  const bool past_min_tokens = s.min_tokens == 0 || seq.output->num_generated() >= s.min_tokens;
  return drafter_ && config_.num_speculative_tokens > 0 && small_batch && past_min_tokens && !s.prompt_logprobs;
}

// A verify row writes its drafts' K/V and emits up to all of them plus one token: each must fit the
// context and the request's max_tokens.
int64_t Scheduler::draft_room(const Sequence& seq) const {
  const auto tokens = static_cast<int64_t>(seq.kv.tokens.size());
  return std::min({static_cast<int64_t>(config_.num_speculative_tokens), config_.max_model_len - tokens - 1,
                   static_cast<int64_t>(seq.request.sampling.max_tokens - seq.output->num_generated() - 1)});
}

void Scheduler::observe_step(const StepPlan& plan, double seconds) {
  if (!step_costs_.timed()) return;  // not speculating, or a backend that times no steps
  int32_t rows = 0;
  for (const StepRow& row : plan.rows) {
    if (row.q_len() > 1 && row.num_draft == 0) return;  // a prompt chunk's step: not a decode's price
    rows += static_cast<int32_t>(row.q_len());
  }
  step_costs_.observe(rows, seconds);
}

// Every speculating sequence's guesses, cut to what the step's costs pay for (draft_counts).
std::unordered_map<SeqId, std::vector<int32_t>> Scheduler::draft_all() {
  std::vector<DraftAsk> asks;
  std::vector<Sequence*> asking;
  int32_t decodes = 0;
  for (const auto& seq : running_) {
    if (!decoding(*seq)) continue;
    ++decodes;
    const int64_t room = speculates(*seq) ? draft_room(*seq) : 0;
    if (room <= 0) continue;
    asks.push_back({seq->id(), seq->kv.tokens, static_cast<int32_t>(room)});
    asking.push_back(seq.get());
  }
  std::unordered_map<SeqId, std::vector<int32_t>> drafts;
  if (asks.empty()) return drafts;
  std::vector<std::vector<int32_t>> guesses = drafter_->propose_all(asks);
  guesses.resize(asks.size());
  std::vector<DraftOffer> offers;
  for (size_t i = 0; i < asks.size(); ++i) {
    if (guesses[i].size() > static_cast<size_t>(asks[i].max_tokens)) guesses[i].resize(asks[i].max_tokens);
    offers.push_back({static_cast<int32_t>(guesses[i].size()), asking[i]->draft_acceptance.rate()});
  }
  const std::vector<int32_t> counts = draft_counts(offers, decodes, step_costs_);
  for (size_t i = 0; i < asks.size(); ++i) {
    // On timed costs a lone sequence's draft pays down to the prior's floor (the H100 prices a
    // second row at 1.03-1.09x a step's), so a skipped sequence drafts again once it runs alone.
    if (counts[i] == 0 && !guesses[i].empty() && !step_costs_.timed()) asking[i]->draft_acceptance.skip();
    guesses[i].resize(static_cast<size_t>(counts[i]));
    drafts.emplace(asks[i].seq, std::move(guesses[i]));
  }
  return drafts;
}

// The step's share of the drafts (draft_all asked for at most draft_room): their slots must fit the
// free blocks (a draft never preempts anyone), their tokens the budget the decodes after this one
// leave, their logits the step's rows; under a grammar, only those it accepts.
std::vector<int32_t> Scheduler::trim_drafts(const Sequence& seq, const Budget& budget,
                                            std::vector<int32_t> drafts) const {
  const int64_t block_size = kv_.block_size();
  const int64_t slack = ceil_div(seq.kv.num_computed, block_size) * block_size - seq.kv.num_computed;
  const int64_t room = std::min({budget.tokens - 1 - budget.decodes_ahead, slack + budget.free_blocks * block_size - 1,
                                 budget.logit_rows});
  drafts.resize(static_cast<size_t>(std::clamp<int64_t>(room, 0, static_cast<int64_t>(drafts.size()))));
  if (seq.grammar) drafts.resize(grammar_allowed_prefix(*seq.grammar, drafts));
  return drafts;
}

// How many leading drafts the grammar accepts; the matcher is left as it was.
size_t Scheduler::grammar_allowed_prefix(GrammarMatcher& grammar, std::span<const int32_t> drafts) {
  int32_t allowed = 0;
  while (static_cast<size_t>(allowed) < drafts.size() && grammar.accept_token(drafts[static_cast<size_t>(allowed)])) {
    ++allowed;
  }
  grammar.rollback(allowed);
  return static_cast<size_t>(allowed);
}

void Scheduler::plan_row(Sequence& seq, int64_t n, StepPlan& plan, Budget& budget, std::span<const int32_t> drafts) {
  StepRow row;
  row.seq = seq.id();
  row.start = seq.kv.num_computed;
  const auto first = seq.kv.tokens.begin() + row.start;
  row.tokens.assign(first, first + n);
  if (seq.scoring_prompt()) plan_prompt_scores(seq, row, budget);
  add_drafts(row, drafts, budget);
  budget.free_blocks -= blocks_needed(seq, row.q_len());
  budget.tokens -= row.q_len();
  kv_.allocate(seq.kv, row.q_len());
  const std::span<const int32_t> table = kv_.block_table(seq.kv);
  row.block_table.assign(table.begin(), table.end());
  row.policy = &seq.kv.policy;
  const bool emits = row.end() >= static_cast<int64_t>(seq.kv.tokens.size());  // a verify row always does
  if (emits && seq.request.sampling.max_tokens > 0) {
    row.sample = seq.output->spec();
    row.grammar = seq.grammar.get();
    if (!seq.request.sampling.greedy()) {
      for (int32_t j = 0; j < row.num_draft; ++j) row.draft_uniforms.push_back(seq.output->draft_uniform());
    }
    add_draft_penalties(row);
  }
  plan.rows.push_back(std::move(row));
  planned_.push_back(&seq);
}

// A sequence scoring its prompt computes every row's logits. Row r predicts token start + r + 1.
// After a preemption the prompt runs again: tokens already scored are not scored twice.
void Scheduler::plan_prompt_scores(const Sequence& seq, StepRow& row, Budget& budget) {
  budget.logit_rows -= row.q_len();
  row.all_logits = true;
  RowScores scores;
  scores.top_n = *seq.request.sampling.prompt_logprobs;
  scores.first_row = static_cast<int32_t>(std::max<int64_t>(0, seq.prompt_scored - row.start));
  for (int64_t r = scores.first_row; r < row.q_len() && row.start + r + 1 < seq.prompt_size(); ++r) {
    scores.targets.push_back(seq.request.prompt[static_cast<size_t>(row.start + r + 1)]);
  }
  if (!scores.targets.empty()) row.scores = std::move(scores);
}

// A verify of a request with penalties: row j's lists are the sampler's with drafts 0..j-1 counted
// as generated. The lists' buffers move with the row, so sample's spans stay valid.
void Scheduler::add_draft_penalties(StepRow& row) {
  const SampleSpec& spec = *row.sample;
  const bool penalised =
      spec.repetition_penalty != 1.0f || spec.presence_penalty != 0.0f || spec.frequency_penalty != 0.0f;
  if (row.num_draft == 0 || !penalised) return;
  PenaltyLists lists{{spec.penalty_tokens.begin(), spec.penalty_tokens.end()},
                     {spec.penalty_counts.begin(), spec.penalty_counts.end()}};
  std::unordered_map<int32_t, size_t> index;
  for (size_t i = 0; i < lists.tokens.size(); ++i) index.emplace(lists.tokens[i], i);
  row.draft_penalties.push_back(lists);
  for (int32_t j = 0; j < row.num_draft; ++j) {
    const int32_t draft = row.tokens[static_cast<size_t>(row.q_len() - row.num_draft + j)];
    const auto [at, added] = index.emplace(draft, lists.tokens.size());
    if (added) {
      lists.tokens.push_back(draft);
      lists.counts.push_back(0);
    }
    ++lists.counts[at->second];
    row.draft_penalties.push_back(lists);
  }
  row.sample->penalty_tokens = row.draft_penalties.back().tokens;
  row.sample->penalty_counts = row.draft_penalties.back().counts;
}

// The drafts follow the row's own token; every row before the last needs its logits.
void Scheduler::add_drafts(StepRow& row, std::span<const int32_t> drafts, Budget& budget) {
  if (drafts.empty()) return;
  row.tokens.insert(row.tokens.end(), drafts.begin(), drafts.end());
  row.num_draft = static_cast<int32_t>(drafts.size());
  row.all_logits = true;
  budget.logit_rows -= row.num_draft;
  ++counters_.spec_drafts;
  counters_.spec_draft_tokens += row.num_draft;
}

void Scheduler::preempt(size_t running_index, StepPlan& plan) {
  std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  // Documents copied in for it this step would land in blocks it gives back now.
  auto& copies = plan.copies;
  for (auto it = copies.begin(); it != copies.end();) {
    if (it->seq != seq->id()) {
      ++it;
      continue;
    }
    kv_.release_copy_sources(*it);
    it = copies.erase(it);
  }
  kv_.release(seq->kv);  // recompute: prompt + generated tokens are prefilled again on readmission
  plan.preempted.push_back(seq->id());
  waiting_.push_front(std::move(seq));
  ++counters_.preemptions;
  if (observer_) observer_->on_preemption();
}

// ---- applying a step ----

void Scheduler::update(const StepPlan& plan, StepResult result, Clock::time_point now) {
  TESSERA_CHECK(result.sampled.size() == plan.rows.size() && result.scores.size() == plan.rows.size(),
                "scheduler: a step result of " << result.sampled.size() << " rows for a plan of "
                                               << plan.rows.size());
  release_copies(plan);
  ++counters_.steps;
  if (observer_ && result.grammar_mask_seconds >= 0.0) observer_->on_grammar_masks(result.grammar_mask_seconds);
  static const std::vector<SampleOutcome> kNone;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const std::vector<SampleOutcome>& verified = i < result.verified.size() ? result.verified[i] : kNone;
    apply_row(planned(plan, i), plan.rows[i], result.sampled[i], result.scores[i], verified, now);
  }
  sweep();
}

void Scheduler::apply_row(Sequence& seq, const StepRow& row, const std::optional<SampleOutcome>& sampled,
                          std::vector<StreamTokenLogprob>& scores, const std::vector<SampleOutcome>& verified,
                          Clock::time_point now) {
  if (row.num_draft > 0 && !seq.done) {
    if (!sampled || verified.size() != static_cast<size_t>(row.num_draft)) {
      finish(seq, RequestFinishReason::kError, "sampling failed: no verified tokens came back");
      return;
    }
    apply_verify(seq, row, verified, *sampled, now);
    return;
  }
  kv_.commit(seq.kv);
  counters_.prompt_tokens_computed += std::clamp<int64_t>(seq.prompt_size() - row.start, 0, row.q_len());
  seq.prompt_scored += static_cast<int64_t>(scores.size());
  for (StreamTokenLogprob& score : scores) seq.prompt_logprobs.push_back(std::move(score));
  if (row.end() < static_cast<int64_t>(seq.kv.tokens.size()) || seq.done) return;  // prefill not done yet
  if (seq.request.sampling.max_tokens == 0) {  // scores the prompt only
    finish(seq, RequestFinishReason::kLength);
    return;
  }
  try {
    TESSERA_CHECK(sampled.has_value(), "no token came back for sequence " << seq.id());
    emit_sampled(seq, *sampled, now);
  } catch (const std::exception& e) {
    finish(seq, RequestFinishReason::kError, std::string("sampling failed: ") + e.what());
  }
}

std::vector<SampleOutcome> Scheduler::accepted_tokens(const StepRow& row, const std::vector<SampleOutcome>& verified,
                                                      const SampleOutcome& last) const {
  // verified[j] is the model's token after row j; row j + 1 holds draft j.
  std::vector<SampleOutcome> out;
  for (int32_t j = 0; j < row.num_draft; ++j) {
    const SampleOutcome& sampled = verified[static_cast<size_t>(j)];
    out.push_back(sampled);
    if (sampled.token != row.tokens[static_cast<size_t>(j + 1)]) return out;  // it replaces the draft
  }
  out.push_back(last);  // every draft kept: the last row's token comes free
  return out;
}

// The K/V of the kept drafts stays; the rest of the row's positions go before anything is cached.
// Tokens go out one by one, so stop strings, EOS and max_tokens end the sequence where decoding
// them one a step would have.
void Scheduler::apply_verify(Sequence& seq, const StepRow& row, const std::vector<SampleOutcome>& verified,
                             const SampleOutcome& last, Clock::time_point now) {
  const std::vector<SampleOutcome> tokens = accepted_tokens(row, verified, last);
  const auto kept = static_cast<int64_t>(tokens.size()) - 1;  // drafts the model agreed with
  counters_.spec_accepted_tokens += kept;
  seq.draft_acceptance.record(static_cast<int32_t>(kept), row.num_draft);
  if (observer_) observer_->on_speculation(row.num_draft, static_cast<int32_t>(kept));
  kv_.truncate(seq.kv, row.start + 1 + kept);
  try {
    for (const SampleOutcome& outcome : tokens) {
      emit_sampled(seq, outcome, now);
      if (seq.done) return;
    }
  } catch (const std::exception& e) {
    finish(seq, RequestFinishReason::kError, std::string("sampling failed: ") + e.what());
    return;
  }
  kv_.commit(seq.kv);
}

bool Scheduler::context_full(const Sequence& seq) const {
  return static_cast<int64_t>(seq.kv.tokens.size()) + 1 >= config_.max_model_len;
}

bool Scheduler::advance_grammar(Sequence& seq, SequenceOutput::Advance& advance) {
  if (!seq.grammar) return true;
  if (!seq.grammar->accept_token(advance.token)) return false;
  // Only a stop token can follow a complete grammar, and once it is taken nothing may (even under
  // ignore_eos).
  if (seq.grammar->is_terminated() && !advance.finish) advance.finish = RequestFinishReason::kStop;
  return true;
}

void Scheduler::emit_sampled(Sequence& seq, const SampleOutcome& sampled, Clock::time_point now) {
  SequenceOutput::Advance advance = seq.output->advance_sampled(sampled, context_full(seq));
  TESSERA_CHECK(advance_grammar(seq, advance), "token " << advance.token << " is not one the grammar allows");
  emit_token(seq, std::move(advance), now);
}

void Scheduler::emit_token(Sequence& seq, SequenceOutput::Advance advance, Clock::time_point now) {
  seq.kv.tokens.push_back(advance.token);
  if (observer_) {
    if (seq.output->num_generated() == 1) {
      observer_->on_first_token(seq.request, seconds_between(seq.arrival, now));
    } else {
      observer_->on_token_interval(seconds_between(seq.last_token_time, now));
    }
  }
  seq.last_token_time = now;
  advance.delta.prompt_logprobs = std::move(seq.prompt_logprobs);
  seq.prompt_logprobs.clear();
  seq.channel->push(std::move(advance.delta));
  if (advance.finish) finish(seq, *advance.finish);
}

void Scheduler::fail_step(const StepPlan& plan, const std::string& message) {
  release_copies(plan);
  for (size_t i = 0; i < plan.rows.size(); ++i) finish(planned(plan, i), RequestFinishReason::kError, message);
  sweep();
}

void Scheduler::fail_all(const std::string& message) {
  for (auto& seq : running_) finish(*seq, RequestFinishReason::kError, message);
  for (auto& seq : waiting_) finish(*seq, RequestFinishReason::kError, message);
  sweep();
}

void Scheduler::finish(Sequence& seq, RequestFinishReason reason, std::string error) {
  if (seq.done) return;
  seq.done = true;
  if (drafter_) drafter_->finished(seq.id(), seq.kv.tokens, seq.prompt_size());
  kv_.release(seq.kv);
  freed_.push_back(seq.id());
  StreamEvent last;
  last.final = true;
  last.finish_reason = reason;
  last.error = std::move(error);
  last.prompt_tokens = seq.prompt_size();
  last.completion_tokens = seq.output->num_generated();
  last.cached_prompt_tokens = seq.cached_prompt_tokens;
  last.prompt_logprobs = std::move(seq.prompt_logprobs);
  seq.prompt_logprobs.clear();
  seq.channel->push(std::move(last));
  if (observer_) {
    observer_->on_request_finished(seq.request, reason, seq.prompt_size(), seq.output->num_generated(),
                                   seconds_between(seq.arrival, Clock::now()));
  }
  ++counters_.finished;
  if (lifecycle_.finished) lifecycle_.finished(seq);
}

Sequence& Scheduler::planned(const StepPlan& plan, size_t row) {
  TESSERA_CHECK(planned_.size() == plan.rows.size() && planned_[row]->id() == plan.rows[row].seq,
                "scheduler: the plan applied is not the one last scheduled");
  return *planned_[row];
}

void Scheduler::release_copies(const StepPlan& plan) {
  for (const KvCopy& copy : plan.copies) kv_.release_copy_sources(copy);
}

void Scheduler::sweep() {
  auto done = [](const std::unique_ptr<Sequence>& s) { return s->done; };
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
}

}  // namespace tessera
