// kernels/backend/attention_plan.cpp: building the per-step plan.
#include "kernels/backend/attention_plan.h"

#include <algorithm>

#include "common/error.h"

namespace tessera {

AttentionPlan AttentionPlan::build(std::span<const Sequence> sequences, int32_t block_size) {
  TESSERA_CHECK(!sequences.empty(), "attention plan: the batch has no sequences");
  TESSERA_CHECK(block_size >= 0, "attention plan: block_size must be >= 0, got " << block_size);
  AttentionPlan plan;
  plan.block_size_ = block_size;
  const size_t n = sequences.size();
  plan.segment_ends_.resize(n);  // sized once: masks_ keep pointers into the inner vectors
  plan.masks_.reserve(n);
  plan.kv_lens_.reserve(n);
  for (size_t s = 0; s < n; ++s) {
    const Sequence& seq = sequences[s];
    TESSERA_CHECK(seq.policy != nullptr, "attention plan: sequence " << s << " has no mask policy");
    TESSERA_CHECK(seq.q_len >= 1 && seq.kv_len >= seq.q_len,
                  "attention plan: sequence " << s << " needs 1 <= q_len <= kv_len, got q_len " << seq.q_len
                                              << ", kv_len " << seq.kv_len);
    if (block_size == 0) {
      TESSERA_CHECK(seq.kv_len == seq.q_len, "attention plan: sequence " << s
                                                 << " attends to earlier keys but the plan has no KV cache");
    } else {
      const int64_t needed = (static_cast<int64_t>(seq.kv_len) + block_size - 1) / block_size;
      TESSERA_CHECK(static_cast<int64_t>(seq.block_table.size()) >= needed,
                    "attention plan: sequence " << s << " has " << seq.block_table.size()
                                                << " blocks, needs " << needed << " for " << seq.kv_len << " keys");
      plan.max_blocks_per_seq_ = std::max<int32_t>(plan.max_blocks_per_seq_, static_cast<int32_t>(needed));
    }
    plan.masks_.push_back(seq.policy->lower(plan.segment_ends_[s]));
    plan.kv_lens_.push_back(seq.kv_len);
    plan.cu_seqlens_q_.push_back(plan.cu_seqlens_q_.back() + seq.q_len);
    plan.cu_seqlens_k_.push_back(plan.cu_seqlens_k_.back() + seq.kv_len);
    for (int32_t i = 0; i < seq.q_len; ++i) plan.positions_.push_back(seq.policy->rope_position(seq.kv_len - seq.q_len + i));
  }
  if (block_size > 0) {
    const int32_t width = plan.max_blocks_per_seq_;
    plan.block_tables_.assign(n * static_cast<size_t>(width), -1);
    for (size_t s = 0; s < n; ++s) {
      const Sequence& seq = sequences[s];
      const int32_t blocks = (seq.kv_len + block_size - 1) / block_size;
      std::copy_n(seq.block_table.begin(), blocks, plan.block_tables_.begin() + s * width);
      for (int32_t p = seq.kv_len - seq.q_len; p < seq.kv_len; ++p) {
        const int32_t block = seq.block_table[p / block_size];
        TESSERA_CHECK(block >= 0, "attention plan: sequence " << s << " position " << p
                                                              << " is written this step but its block was evicted");
        plan.slot_mapping_.push_back(block * block_size + p % block_size);
      }
    }
  }
  for (size_t s = 1; s < plan.cu_seqlens_q_.size(); ++s) plan.last_rows_.push_back(plan.cu_seqlens_q_[s] - 1);
  if (block_size > 0) plan.count_step_keys_read(sequences);
  const auto rows = static_cast<int32_t>(n);
  plan.one_request_ = block_size > 0 && plan.total_q() == rows && plan.step_keys_read_ == rows;
  return plan;
}

void AttentionPlan::count_step_keys_read(std::span<const Sequence> sequences) {
  // Only sequences of one query can read each other's new keys (a verify's tokens over one block
  // table): a prompt chunk writes blocks of its own, so its slots are left out of the search.
  auto slot = [&](const Sequence& seq, int32_t p) {
    return seq.block_table[p / block_size_] * block_size_ + p % block_size_;
  };
  std::vector<int32_t> written;
  for (const Sequence& seq : sequences) {
    if (seq.q_len == 1) written.push_back(slot(seq, seq.kv_len - 1));
  }
  std::sort(written.begin(), written.end());
  for (const Sequence& seq : sequences) {
    if (seq.q_len != 1) continue;
    int32_t keys = 0;
    for (int32_t p = seq.kv_len - 1; p >= 0 && std::binary_search(written.begin(), written.end(), slot(seq, p)); --p) {
      ++keys;
    }
    step_keys_read_ = std::max(step_keys_read_, keys);
  }
}

}  // namespace tessera
