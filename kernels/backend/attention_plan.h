// kernels/backend/attention_plan.h: AttentionPlan, the per-step attention metadata for one packed
// varlen batch (query offsets, key lengths, positions, masks, block tables, KV slots). Built once per
// step and reused by every layer; a backend may attach its own copy (device arrays) via backend_state.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/attention_mask.h"
#include "kernels/backend/mask_policy.h"

namespace tessera {

class AttentionPlan {
 public:
  // One sequence of the batch. Its q_len tokens this step are positions [kv_len - q_len, kv_len).
  struct Sequence {
    int32_t q_len = 0;   // tokens this step, >= 1
    int32_t kv_len = 0;  // keys visible after this step (cached + new); == q_len without a KV cache
    const MaskPolicy* policy = nullptr;       // required; copied, not kept
    std::span<const int32_t> block_table;     // paged only: block ids covering [0, kv_len), kEvictedBlock allowed
  };

  // block_size == 0 plans attention over this step's own packed K/V (no cache: prefill-only models
  // such as BERT); block_size > 0 plans writes into and reads from the paged KV cache.
  // Throws tessera::Error naming the sequence and field on inconsistent input.
  static AttentionPlan build(std::span<const Sequence> sequences, int32_t block_size);

  AttentionPlan(AttentionPlan&&) = default;
  AttentionPlan& operator=(AttentionPlan&&) = default;
  AttentionPlan(const AttentionPlan&) = delete;  // masks point into segment storage owned here
  AttentionPlan& operator=(const AttentionPlan&) = delete;

  int32_t num_seqs() const { return static_cast<int32_t>(kv_lens_.size()); }
  int32_t total_q() const { return cu_seqlens_q_.back(); }
  bool paged() const { return block_size_ > 0; }
  int32_t block_size() const { return block_size_; }
  int32_t max_blocks_per_seq() const { return max_blocks_per_seq_; }

  const std::vector<int32_t>& cu_seqlens_q() const { return cu_seqlens_q_; }  // [num_seqs + 1]
  const std::vector<int32_t>& kv_lens() const { return kv_lens_; }            // [num_seqs]
  const std::vector<int32_t>& cu_seqlens_k() const { return cu_seqlens_k_; }  // [num_seqs + 1], unpaged only
  const std::vector<int32_t>& positions() const { return positions_; }        // [total_q] RoPE / absolute positions
  const std::vector<kernels::MaskParams>& masks() const { return masks_; }    // [num_seqs]
  const std::vector<int32_t>& block_tables() const { return block_tables_; }  // [num_seqs, max_blocks_per_seq]
  const std::vector<int32_t>& slot_mapping() const { return slot_mapping_; }  // [total_q] paged only
  // Packed row of each sequence's last token (where next-token logits are read).
  const std::vector<int32_t>& last_rows() const { return last_rows_; }
  // The most keys written this step that a sequence of one query reads (its newest and those just
  // before it): 1 in a decode step; up to k + 1 where a speculative verify's tokens run as sequences
  // of one query over one block table. A kernel that loads keys before the kernel writing this
  // step's keys has finished must leave these to after it. 0 without a KV cache.
  int32_t step_keys_read() const { return step_keys_read_; }
  // Whether every row is one request's: a single decode row, or a verify's tokens (sequences of one
  // query, the newest reading every row's key). A backend whose decode bits must not depend on the
  // rows beside them needs that only here: at batch 1 a verify gives the bits decoding gives.
  bool one_request() const { return one_request_; }

  // Set by Backend::prepare_plan (device copies of the arrays above); null on the CPU backend.
  std::shared_ptr<void> backend_state;

 private:
  AttentionPlan() = default;

  int32_t block_size_ = 0;
  int32_t max_blocks_per_seq_ = 0;
  std::vector<int32_t> cu_seqlens_q_{0};
  std::vector<int32_t> cu_seqlens_k_{0};
  std::vector<int32_t> kv_lens_;
  std::vector<int32_t> positions_;
  std::vector<kernels::MaskParams> masks_;
  std::vector<std::vector<int32_t>> segment_ends_;  // per sequence; masks_ point into these
  std::vector<int32_t> block_tables_;
  std::vector<int32_t> slot_mapping_;
  std::vector<int32_t> last_rows_;
  int32_t step_keys_read_ = 0;
  bool one_request_ = false;

  void count_step_keys_read(std::span<const Sequence> sequences);
};

}  // namespace tessera
