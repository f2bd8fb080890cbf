// engine/executor.h: Executor, which runs a StepPlan on a Backend: the plan's K/V copies, one
// packed varlen forward through the paged KV cache (each row a "document" with its own mask
// policy), then the tokens the plan asks to sample and the prompt logprobs it asks to score. It owns
// the KV tensors and what makes steps fast on a device (the padding block, the decode batch sizes
// whose CUDA graphs warm_up captured) and no scheduling state: which blocks a sequence holds is the
// plan's to say.
//
// Thread safety: none. One thread owns an Executor.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/follower_ranks.h"
#include "engine/grammar_masks.h"
#include "engine/step_plan.h"
#include "kernels/backend/attention_plan.h"
#include "kernels/backend/backend.h"
#include "models/model.h"

namespace tessera {

// What the largest step of a serving engine can be (Executor::warm_up).
struct WarmUpConfig {
  int32_t max_batch_tokens = 2048;  // tokens in one step
  int32_t max_batch_seqs = 128;     // sequences in one step
  int64_t max_context = 0;          // tokens of the longest sequence; 0: the model's max_position_embeddings
  // Also capture each decode shape as a speculative verify runs it (rows that read keys the step
  // writes, AttentionPlan::step_keys_read > 1), so that verify steps replay graphs from the start,
  // and put every batch size up to 8 on the decode ladder, so that a verify is not padded.
  bool verify_shapes = false;

  void validate() const;  // throws naming the field
};

struct WarmUpReport {
  double seconds = 0.0;
  int32_t decode_shapes = 0;  // (batch size, block-table width, rows) run twice: eager, then captured
  std::vector<int32_t> decode_batches;  // the ladder decode steps are padded to (empty: no padding)
  // With verify_shapes: a decode step's time at each decode_batches size, measured on its captured
  // graph, which says what a step's drafts cost.
  std::vector<double> decode_step_seconds;
};

class Executor {
 public:
  // A KV cache of num_blocks blocks of block_size tokens (the pool's), plus one padding block.
  // `followers`: for a tensor-parallel model, the shards of ranks 1, 2, ... (model and backend being
  // rank 0's); each forward then runs on every rank at once (FollowerRanks), and only this executor
  // samples.
  Executor(CausalLm& model, Backend& backend, int32_t num_blocks, int32_t block_size,
           std::span<const RankShard> followers = {});

  // Copies, forward, samples and scores. Rows with a grammar sample among the tokens it allows; the
  // masks are computed on worker threads during the forward. Throws when the forward fails (the
  // plan's K/V is then unusable).
  StepResult execute(const StepPlan& plan);
  // The copies and the forward alone: the logits of each row's last token, [rows, vocab], on the
  // backend and valid until the next step. With all_logits rows of more than one token, `earlier`
  // (required then) receives those rows' logits before their last, in row order.
  Tensor forward(const StepPlan& plan, Tensor* earlier = nullptr);

  // Before serving, on a backend that asks for it: runs the largest step once, so that the step
  // workspace is sized now and not under load, then each decode batch size of the backend's ladder
  // at each block-table width twice, so that their CUDA graphs are captured before the first
  // request. Later decode-only steps are padded up to the ladder's next size. The warm-up steps use
  // only the padding block, never the pool's blocks. A no-op on other backends.
  WarmUpReport warm_up(const WarmUpConfig& config);

  Backend& backend() { return backend_; }
  const CausalLm& model() const { return model_; }

 private:
  // How a plan's rows become the forward's attention sequences (see lay_out).
  struct StepLayout {
    std::vector<AttentionPlan::Sequence> seqs;
    std::vector<int32_t> packed;      // the token ids, in seqs' order
    std::vector<int32_t> logit_rows;  // packed rows: each row's last, then the all_logits rows' earlier ones
  };
  StepLayout lay_out(const StepPlan& plan) const;
  // Makes the K/V copies, plans attention for `seqs`, whose tokens are `packed`, and runs the
  // forward, on every rank. Logits come back for `logit_rows` (packed row indices; empty: each
  // sequence's last row).
  Tensor run(std::span<const KvCopy> copies, std::span<const AttentionPlan::Sequence> seqs,
             std::span<const int32_t> packed, std::span<const int32_t> logit_rows = {});
  // The same on this executor's rank alone.
  Tensor run_here(std::span<const KvCopy> copies, std::span<const AttentionPlan::Sequence> seqs,
                  std::span<const int32_t> packed, std::span<const int32_t> logit_rows);
  // A sequence outside the pool that reads and writes only the padding block.
  AttentionPlan::Sequence padding_sequence(int32_t q_len, int32_t kv_len) const;
  // The rows of a warm-up decode step, each a shape with graphs of its own: decodes of separate
  // requests, verifies of several requests, or one request's verify (AttentionPlan::one_request).
  enum class WarmUpRows { kDecodes, kVerifies, kOneRequestVerify };
  // A decode step of `batch` padding rows, the first over a table of `width` blocks.
  Tensor warm_up_decode_step(int32_t batch, int32_t width, WarmUpRows rows);
  // The seconds of a decode step at each decode_ladder_ size.
  std::vector<double> time_decode_steps();
  // Starts the grammar masks of the plan's constrained rows on the mask workers; false when none.
  bool start_grammar_masks(const StepPlan& plan);
  // forward() before it splits the logits: each row's last token, then the all_logits rows' earlier
  // ones, [rows + earlier rows, vocab].
  Tensor forward_all(const StepPlan& plan);
  // Each row's sample, and the tokens sampled behind each verify row's drafts (from the rows before
  // its last), from forward_all's logits.
  void sample(const StepPlan& plan, const Tensor& all, bool masked, StepResult& result);
  std::vector<SampleOutcome> sample_rows(const Tensor& rows, std::span<const SampleSpec> specs);
  void score(const StepPlan& plan, const Tensor& logits, const Tensor& earlier, StepResult& result);
  std::vector<SampleSpec> verify_specs(const StepPlan& plan, size_t earlier_rows, bool masked) const;

  CausalLm& model_;
  Backend& backend_;
  int32_t block_size_ = 0;
  // The cache has one block more than the pool: the padding block, which warm-up and padding
  // sequences write to and read from, so that they never touch a request's KV.
  KvCacheStorage cache_;
  int32_t padding_block_ = 0;
  MaskPolicy padding_policy_ = MaskPolicy::causal();
  std::vector<int32_t> padding_table_;  // padding_block_, repeated for the longest context
  std::vector<int32_t> decode_ladder_;  // set by warm_up
  // Made at the first constrained step. Two threads: a step's masks take a fraction of its forward
  // (tens of microseconds a row), and the host also launches the forward.
  static constexpr int32_t kGrammarMaskThreads = 2;
  std::unique_ptr<GrammarMasks> grammar_masks_;
  std::unique_ptr<FollowerRanks> followers_;  // null unless the model is tensor-parallel
};

}  // namespace tessera
