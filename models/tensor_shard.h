// models/tensor_shard.h: TensorShard, which part of a model one rank of a tensor-parallel group holds
// (Megatron-style: attention heads and FFN columns split evenly over the ranks), and the weight
// slices a graph loads for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend/backend.h"
#include "kernels/backend/weight_view.h"

namespace tessera {

struct TensorShard {
  int32_t rank = 0;
  int32_t size = 1;

  // The shard a graph loaded on `backend` holds (the backend's rank in its group).
  static TensorShard of(const Backend& backend) {
    return {backend.tensor_parallel_rank(), backend.tensor_parallel_size()};
  }
  bool split() const { return size > 1; }
  // This rank's part of `total` units that split evenly (heads, FFN columns).
  int64_t part(int64_t total) const { return total / size; }
  int64_t first(int64_t total) const { return rank * part(total); }
};

// Rows [begin, begin + count) of a [rows, cols] or 1-D weight: a view of the same bytes.
WeightView weight_rows(const WeightView& weight, int64_t begin, int64_t count);

// Columns [begin, begin + count) of a [rows, cols] weight, copied into `storage` (the view points
// into it). A block-quantized weight needs the columns to fall on whole blocks; throws naming the
// weight otherwise.
WeightView weight_columns(const WeightView& weight, int64_t begin, int64_t count, std::vector<std::byte>& storage);

}  // namespace tessera
