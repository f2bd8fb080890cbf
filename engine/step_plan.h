// engine/step_plan.h: StepPlan, what one engine step does, as a value: the scheduler plans it, an
// executor runs it (several executors may run the same plan: one per GPU under tensor parallelism),
// and the scheduler applies the StepResult. Nothing in a plan points into an executor; its
// pointers and spans point into the scheduler's records and stay valid until the plan is applied.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/sampler/sampler.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/mask_policy.h"

namespace tessera {

using SeqId = int64_t;
class GrammarMatcher;

// K/V copied between cache slots before the forward: a document whose K/V an earlier prompt
// computed, placed at its position in this one. K is re-rotated by rotate_by RoPE positions.
struct KvCopy {
  SeqId seq = 0;                    // the sequence whose positions it fills
  std::vector<int32_t> src_slots;
  std::vector<int32_t> dst_slots;
  std::vector<int32_t> rotate_by;   // per slot
  std::vector<int32_t> src_blocks;  // cached blocks the copy reads: the scheduler holds them until the step ran
};

// Prompt logprobs of a row: row `first_row + i` of its tokens predicts targets[i].
struct RowScores {
  int32_t first_row = 0;
  std::vector<int32_t> targets;
  int32_t top_n = 0;  // alternatives to return beside each target
};

// A sampling row's penalty lists (SampleSpec::penalty_tokens and penalty_counts), owned.
struct PenaltyLists {
  std::vector<int32_t> tokens;
  std::vector<int32_t> counts;
};

// One sequence's work in a step.
struct StepRow {
  SeqId seq = 0;
  // The tokens computed this step, at positions [start, start + tokens.size()). A decoding sequence
  // has one; a prompt chunk or a speculative verify has several. start may lie below what the
  // sequence held before (a rejected draft dropped): the positions from start on are overwritten.
  std::vector<int32_t> tokens;
  int64_t start = 0;
  std::vector<int32_t> block_table;  // the sequence's blocks, covering start + tokens.size() positions
  const MaskPolicy* policy = nullptr;
  // Logits come back for the last row always; for every row when all_logits (prompt logprobs, or
  // the k tokens of a speculative verify).
  bool all_logits = false;
  // Sample a token from the last row's logits with these settings (spans into the sequence's
  // sampler, valid until the plan is applied).
  std::optional<SampleSpec> sample;
  // Constrained decoding: the sample is one of the tokens this matcher allows (the sequence's,
  // owned by the scheduler; an executor only asks it for the allowed tokens).
  GrammarMatcher* grammar = nullptr;
  std::optional<RowScores> scores;
  // A speculative verify: the last num_draft tokens are a drafter's guesses (all_logits is set). The
  // token sampled at each row before the last (with the row's settings) comes back in
  // StepResult::verified, the last row's in sampled, so the scheduler keeps the drafts that match.
  int32_t num_draft = 0;
  // A sampled verify: the RNG draw for each row before the last (the last row's is sample's own),
  // so every position is sampled with the request's settings and a fresh draw.
  std::vector<double> draft_uniforms;
  // A verify with penalties: the lists for each row from the last token on, row j's counting the
  // drafts before it as generated (a draft is kept only when every one before it was), so the
  // last row's are also sample's. Empty for a request without penalties.
  std::vector<PenaltyLists> draft_penalties;

  int32_t q_len() const { return static_cast<int32_t>(tokens.size()); }
  int64_t end() const { return start + static_cast<int64_t>(tokens.size()); }
};

struct StepPlan {
  // Rows of one token and verify rows come first: a GPU backend runs their tokens through its
  // decode kernel.
  std::vector<StepRow> rows;
  std::vector<KvCopy> copies;        // run before the forward
  std::vector<SeqId> preempted;      // gave their blocks back this step; recomputed later
  std::vector<SeqId> freed;          // ended since the last plan (finished, cancelled, expired)

  bool empty() const { return rows.empty(); }
};

// What running a plan gives back, one entry per row.
struct StepResult {
  std::vector<std::optional<SampleOutcome>> sampled;       // where the row asked for a sample
  std::vector<std::vector<StreamTokenLogprob>> scores;     // where the row asked for prompt logprobs
  // Per verify row: the token sampled after each of its first num_draft tokens (row r's logits
  // predict the token after row r), with its logprobs when the row's settings ask for them. Empty
  // for other rows.
  std::vector<std::vector<SampleOutcome>> verified;
  double grammar_mask_seconds = -1.0;  // time the step's grammar masks took to fill; < 0: none
};

}  // namespace tessera
