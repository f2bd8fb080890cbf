// kernels/cuda/attention/mask_policy.cuh: the device mask-policy functor the attention kernels
// tile with. The semantics are MaskParams' (kernels/attention_mask.h); this adds what a tiled kernel
// needs: per-row key bounds, the key-tile range of a query tile, and tile_full().
#pragma once

#include <type_traits>

#include "kernels/attention_mask.h"

namespace tessera::kernels::cuda {

// For every kind, visible(q, k) == k <= row_hi(q) && (k >= row_lo(q) || k < lead), with
//   row_hi(q) = q (causal kinds) or kv_len - 1 (bidirectional), row_lo(q) = MaskParams::lowest_key(q),
//   lead = MaskParams::leading_keys(). Positions are bottom-right aligned: query i of a sequence sits at
// kv_len - q_len + i, so a query at a negative position sees nothing and its output is 0.
template <MaskKind kKind>
struct MaskPolicy {
  MaskParams params;
  int32_t kv_len;

  __device__ __forceinline__ int32_t row_hi(int32_t q) const {
    if constexpr (kKind == MaskKind::kBidirectional) {
      return kv_len - 1;
    } else {
      return q < kv_len - 1 ? q : kv_len - 1;
    }
  }
  __device__ __forceinline__ int32_t row_lo(int32_t q) const {
    if constexpr (kKind == MaskKind::kSlidingWindow) {
      return q - params.window + 1 > 0 ? q - params.window + 1 : 0;
    } else if constexpr (kKind == MaskKind::kSegments) {
      return params.lowest_key(q);
    } else {
      return 0;
    }
  }
  __device__ __forceinline__ int32_t lead() const {
    if constexpr (kKind == MaskKind::kSlidingWindow || kKind == MaskKind::kSegments) {
      const int32_t l = params.leading_keys();
      return l < kv_len ? l : kv_len;
    } else {
      return 0;
    }
  }
  __device__ __forceinline__ bool visible(int32_t q, int32_t k) const {
    return k <= row_hi(q) && (k >= row_lo(q) || k < lead());
  }

  // Keys the query rows [q_first, q_last] may see: [0, lead) and [lo, hi]. hi < lo: none in range.
  __device__ __forceinline__ void key_range(int32_t q_first, int32_t q_last, int32_t& lo, int32_t& hi) const {
    hi = row_hi(q_last);
    if constexpr (kKind == MaskKind::kSegments) {
      // row_lo is 0 on the prefix and the tail and non-decreasing in between, so the minimum over
      // the rows sits at one of the two ends.
      const int32_t a = row_lo(q_first), b = row_lo(q_last);
      lo = a < b ? a : b;
    } else {
      lo = row_lo(q_first);  // non-decreasing in q for every other kind
    }
  }

  // Largest row_lo over the rows [q_first, q_last].
  __device__ __forceinline__ int32_t max_row_lo(int32_t q_first, int32_t q_last) const {
    if constexpr (kKind == MaskKind::kSegments) {
      const int32_t seg_end = params.segments_end();
      const int32_t last_in_segments = q_last < seg_end - 1 ? q_last : seg_end - 1;
      if (last_in_segments < q_first) return 0;  // all rows in the tail
      return row_lo(last_in_segments);
    } else {
      return row_lo(q_last);
    }
  }

  // True when every (q, k) with q in [q_first, q_last], k in [k_first, k_last] is visible: the tile
  // needs no element mask.
  __device__ __forceinline__ bool tile_full(int32_t q_first, int32_t q_last, int32_t k_first, int32_t k_last) const {
    if (k_last > row_hi(q_first)) return false;  // row_hi is non-decreasing
    if constexpr (kKind == MaskKind::kCausal || kKind == MaskKind::kBidirectional) {
      return true;
    } else {
      return k_last < lead() || k_first >= max_row_lo(q_first, q_last);
    }
  }
};

// Calls fn(std::integral_constant<MaskKind, K>{}) for a sequence's runtime policy kind: the one
// place the prefill kernels turn it into a template instance.
template <typename Fn>
__device__ __forceinline__ void with_mask_kind(MaskKind kind, Fn&& fn) {
  switch (kind) {
    case MaskKind::kCausal: fn(std::integral_constant<MaskKind, MaskKind::kCausal>{}); break;
    case MaskKind::kBidirectional: fn(std::integral_constant<MaskKind, MaskKind::kBidirectional>{}); break;
    case MaskKind::kSlidingWindow: fn(std::integral_constant<MaskKind, MaskKind::kSlidingWindow>{}); break;
    case MaskKind::kSegments: fn(std::integral_constant<MaskKind, MaskKind::kSegments>{}); break;
  }
}

}  // namespace tessera::kernels::cuda
