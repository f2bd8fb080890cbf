// kernels/cuda/attention/prefill_tile.cuh: the work of one (sequence, head, query tile) in a varlen
// prefill, shared by both prefill kernel families: where its rows live, and which key tiles it
// visits (the leading sink/prefix tiles, then one contiguous main range). Masked-out key tiles are
// never in that list, so they are never loaded.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/mask_policy.cuh"

namespace tessera::kernels::cuda {

template <typename T, int kHeadDim, MaskKind kKind, int kBM, int kBN>
struct PrefillTile {
  int q_len, kv_len;
  int row0;        // first query row of the tile within its sequence
  int q_row;       // the same row within the packed q
  int k_row;       // the sequence's first key row within the packed k and v
  int kv_head;     // the KV head this query head reads
  int valid_rows;  // rows of the tile inside the sequence (<= kBM)
  int q_first, q_last;  // absolute positions of the first and last valid row (bottom-right aligned)
  const T* q_base;  // [valid_rows, q_row_stride] at this head
  const T* k_base;  // [kv_len, k_row_stride] at this head's KV head
  const T* v_base;  // [kv_len, v_row_stride]
  T* o_base;        // [valid_rows, out_row_stride] at this head
  MaskPolicy<kKind> policy;
  int lead;        // keys [0, lead) every later query sees (sinks / shared prefix)
  int n_lead;      // leading key tiles visited before the main range
  int main_first;  // first key tile of the main range
  int n_tiles;     // n_lead + tiles in the main range; 0 when no row sees any key

  __device__ __forceinline__ PrefillTile(const PrefillArgs& args, const MaskParams& mask, int seq, int head,
                                         int q_tile)
      : policy{mask, 0} {
    const int q_begin = args.cu_seqlens_q[seq], k_begin = args.cu_seqlens_k[seq];
    q_len = args.cu_seqlens_q[seq + 1] - q_begin;
    kv_len = args.cu_seqlens_k[seq + 1] - k_begin;
    kv_head = head / (args.num_heads / args.num_kv_heads);
    row0 = q_tile * kBM;
    q_row = q_begin + row0;
    k_row = k_begin;
    valid_rows = q_len - row0 < kBM ? q_len - row0 : kBM;
    q_first = kv_len - q_len + row0;
    q_last = q_first + valid_rows - 1;
    q_base = static_cast<const T*>(args.q) + static_cast<int64_t>(q_begin + row0) * args.q_row_stride + head * kHeadDim;
    k_base = static_cast<const T*>(args.k) + static_cast<int64_t>(k_begin) * args.k_row_stride + kv_head * kHeadDim;
    v_base = static_cast<const T*>(args.v) + static_cast<int64_t>(k_begin) * args.v_row_stride + kv_head * kHeadDim;
    o_base = static_cast<T*>(args.out) + static_cast<int64_t>(q_begin + row0) * args.out_row_stride + head * kHeadDim;

    policy = MaskPolicy<kKind>{mask, kv_len};
    int lo = 0, hi = -1;
    if (kv_len > 0) policy.key_range(q_first, q_last, lo, hi);
    lead = policy.lead();
    int n_main = 0;
    n_lead = 0;
    main_first = 0;
    if (hi >= 0 && hi >= lo) {
      main_first = lo / kBN;
      n_main = hi / kBN - main_first + 1;
      const int lead_tiles = (lead + kBN - 1) / kBN;
      n_lead = lead_tiles < main_first ? lead_tiles : main_first;
    }
    n_tiles = n_lead + n_main;
  }

  // The i-th key tile visited (0 <= i < n_tiles).
  __device__ __forceinline__ int tile_at(int i) const { return i < n_lead ? i : main_first + (i - n_lead); }
};

}  // namespace tessera::kernels::cuda
