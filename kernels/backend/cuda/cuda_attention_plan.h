// kernels/backend/cuda/cuda_attention_plan.h: AttentionMetadata, a step's attention metadata as the
// CUDA kernels read it, planned on the host from the step's AttentionPlan and laid out for one
// host-to-device copy. The plan is made once per step; every layer's attention reads the device copy
// (the kernel calls are in cuda_ops.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend/attention_plan.h"
#include "kernels/backend/cuda/cuda_backend_impl.h"

namespace tessera::cuda_backend_detail {

class AttentionMetadata {
 public:
  // Derives what the kernels need beyond the plan's own arrays, and sets `step`'s sizes (max_q_len,
  // max_kv_len, total_k, decode_rows, tail_total_k, table_width) and host_last_rows. `plan`,
  // `token_ids` and `step` must outlive this object.
  AttentionMetadata(const AttentionPlan& plan, std::span<const int32_t> token_ids, StepState& step);
  AttentionMetadata(const AttentionMetadata&) = delete;
  AttentionMetadata& operator=(const AttentionMetadata&) = delete;

  // The bytes of the staging layout.
  size_t bytes() const { return total_bytes_; }
  // Copies every array into `host` (bytes() long), with the masks' segment ends pointing into
  // `device`, where `host` will be copied.
  void write(char* host, const char* device) const;
  // Points `step`'s arrays at their copies in `device`; returns the copy of the token ids.
  int32_t* bind(StepState& step, char* device) const;

 private:
  struct Slice {
    const void* src;
    size_t bytes;
    size_t offset = 0;
  };
  // The slices in staging order, each on a kAlign boundary: the variable-length ones last, so a
  // decode step's layout depends only on its batch size and table width.
  enum { kIds, kCuQ, kCuK, kCuKTail, kKvLens, kPositions, kSlots, kLastRows, kMasks, kTables, kSegments, kSlices };

  void derive(StepState& step);

  const AttentionPlan& plan_;
  // Derived on the host: cumulative key counts (of every sequence, and of those after the leading
  // decode rows), the block tables padded to the step's table width, and every mask's segment ends
  // in one array.
  std::vector<int32_t> cu_seqlens_k_;
  std::vector<int32_t> cu_seqlens_k_tail_;
  std::vector<int32_t> block_tables_;
  std::vector<int32_t> segment_ends_;
  std::vector<Slice> slices_;
  size_t total_bytes_ = 0;
};

}  // namespace tessera::cuda_backend_detail
