// kernels/backend/cuda/cuda_attention_plan.cpp: AttentionMetadata, the host side of planning a
// step's attention: the key counts, the leading decode rows of a mixed step, the padded block tables
// and the staging layout. No CUDA call: the caller copies the layout up (CudaBackend::prepare_step).
#include "kernels/backend/cuda/cuda_attention_plan.h"

#include <algorithm>
#include <cstring>

namespace tessera::cuda_backend_detail {

AttentionMetadata::AttentionMetadata(const AttentionPlan& plan, std::span<const int32_t> token_ids, StepState& step)
    : plan_(plan) {
  step.host_last_rows = plan.last_rows();
  derive(step);
  slices_ = {
      {token_ids.data(), static_cast<size_t>(plan.total_q()) * 4},
      {plan.cu_seqlens_q().data(), plan.cu_seqlens_q().size() * 4},
      {cu_seqlens_k_.data(), cu_seqlens_k_.size() * 4},
      {cu_seqlens_k_tail_.data(), cu_seqlens_k_tail_.size() * 4},
      {plan.kv_lens().data(), plan.kv_lens().size() * 4},
      {plan.positions().data(), plan.positions().size() * 4},
      {plan.slot_mapping().data(), plan.slot_mapping().size() * 4},
      {step.host_last_rows.data(), step.host_last_rows.size() * 4},
      {plan.masks().data(), plan.masks().size() * sizeof(kernels::MaskParams)},
      {block_tables_.data(), block_tables_.size() * 4},
      {segment_ends_.data(), segment_ends_.size() * 4},
  };
  for (Slice& slice : slices_) {
    slice.offset = total_bytes_;
    total_bytes_ += round_up(std::max<size_t>(slice.bytes, 1), kAlign);
  }
}

void AttentionMetadata::derive(StepState& step) {
  const AttentionPlan& plan = plan_;
  const int32_t num_seqs = plan.num_seqs();
  std::vector<int32_t>& cu_k = cu_seqlens_k_;
  cu_k.assign(static_cast<size_t>(num_seqs) + 1, 0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t q_len = plan.cu_seqlens_q()[s + 1] - plan.cu_seqlens_q()[s];
    step.max_q_len = std::max(step.max_q_len, q_len);
    step.max_kv_len = std::max(step.max_kv_len, plan.kv_lens()[s]);
    cu_k[s + 1] = cu_k[s] + plan.kv_lens()[s];
  }
  step.total_k = cu_k.back();
  if (plan.paged()) {
    while (step.decode_rows < num_seqs &&
           plan.cu_seqlens_q()[step.decode_rows + 1] - plan.cu_seqlens_q()[step.decode_rows] == 1) {
      ++step.decode_rows;
    }
  }
  cu_seqlens_k_tail_.assign(cu_k.begin() + step.decode_rows, cu_k.end());
  for (int32_t& k : cu_seqlens_k_tail_) k -= cu_k[static_cast<size_t>(step.decode_rows)];
  step.tail_total_k = cu_seqlens_k_tail_.back();
  // Block tables go up padded to a power-of-two width, so decode steps of one batch size keep one
  // layout (and one captured graph) while their contexts grow within the bucket.
  const int32_t width = std::max<int32_t>(plan.max_blocks_per_seq(), 1);
  int32_t padded = 4;
  while (padded < width) padded *= 2;
  step.table_width = padded;
  block_tables_.assign(static_cast<size_t>(num_seqs) * padded, -1);
  for (int32_t s = 0; s < num_seqs && plan.paged(); ++s) {
    std::copy_n(plan.block_tables().begin() + static_cast<ptrdiff_t>(s) * width, width,
                block_tables_.begin() + static_cast<ptrdiff_t>(s) * padded);
  }
  for (const kernels::MaskParams& mask : plan.masks()) {
    segment_ends_.insert(segment_ends_.end(), mask.segment_ends, mask.segment_ends + mask.num_segments);
  }
}

void AttentionMetadata::write(char* host, const char* device) const {
  for (const Slice& slice : slices_) {
    if (slice.bytes > 0 && slice.src != nullptr) std::memcpy(host + slice.offset, slice.src, slice.bytes);
  }
  // Masks point at their segment ends: rewrite those pointers to the device copy.
  auto* masks = reinterpret_cast<kernels::MaskParams*>(host + slices_[kMasks].offset);
  const auto* device_segments = reinterpret_cast<const int32_t*>(device + slices_[kSegments].offset);
  size_t segment = 0;
  for (int32_t s = 0; s < plan_.num_seqs(); ++s) {
    masks[s].segment_ends = masks[s].num_segments > 0 ? device_segments + segment : nullptr;
    segment += static_cast<size_t>(masks[s].num_segments);
  }
}

int32_t* AttentionMetadata::bind(StepState& step, char* device) const {
  auto at = [&](int i) { return reinterpret_cast<int32_t*>(device + slices_[static_cast<size_t>(i)].offset); };
  step.cu_seqlens_q = at(kCuQ);
  step.cu_seqlens_k = at(kCuK);
  step.cu_seqlens_k_tail = at(kCuKTail);
  step.kv_lens = at(kKvLens);
  step.positions = at(kPositions);
  step.block_tables = at(kTables);
  step.slot_mapping = at(kSlots);
  step.last_rows = at(kLastRows);
  step.masks = reinterpret_cast<const kernels::MaskParams*>(device + slices_[kMasks].offset);
  return at(kIds);
}

}  // namespace tessera::cuda_backend_detail
