// kernels/cuda/attention_generic/attention_generic.cuh: the generic attention kernel, then its
// launcher. One warp per (query row, head); the warp is split into 32 / kLanesPerKey lane groups that
// each take every (32 / kLanesPerKey)-th visible key, so small heads still keep the warp busy. Lane i
// of a group holds the dim pairs 2 * (i + kLanesPerKey * j), j < kPairs. Each group runs an fp32
// online softmax over its keys; the groups merge at the end.
#pragma once

#include <cmath>

#include "kernels/cuda/attention_generic/attention_generic.h"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/fp8.cuh"

namespace tessera::kernels::cuda {

inline constexpr int kGenericWarpsPerBlock = 4;

// T: the activation type (q, out, contiguous K/V); KvT: the paged caches' storage type (T, or e4m3_t).
template <typename T, typename KvT, int kLanesPerKey, int kPairs>
__global__ void __launch_bounds__(kGenericWarpsPerBlock * 32)
    generic_attention_kernel(const GenericAttentionArgs args) {
  using Pair = typename DTypeTraits<T>::pair;
  constexpr int kGroups = 32 / kLanesPerKey;
  constexpr unsigned kFull = 0xffffffffu;

  // Launched without PDL, so the wait is a no-op; kept so the kernel stays correct if it ever is.
  pdl_wait_previous();
  pdl_launch_dependents();

  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kGenericWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= static_cast<int64_t>(args.total_q) * args.num_heads) return;  // warp-uniform
  const int row = static_cast<int>(item / args.num_heads);
  const int head = static_cast<int>(item % args.num_heads);
  const int kv_head = head / (args.num_heads / args.num_kv_heads);
  const int D = args.head_dim;

  // The sequence holding this row: the last s with cu_seqlens_q[s] <= row (skips empty sequences).
  int lo = 0, hi = args.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (args.cu_seqlens_q[mid] <= row) lo = mid; else hi = mid - 1;
  }
  const int s = lo;
  const bool paged = args.block_tables != nullptr;
  const int q_start = args.cu_seqlens_q[s];
  const int q_len = args.cu_seqlens_q[s + 1] - q_start;
  const int k_start = paged ? 0 : args.cu_seqlens_k[s];
  const int kv_len = paged ? args.kv_lens[s] : args.cu_seqlens_k[s + 1] - k_start;
  const int q_pos = kv_len - q_len + (row - q_start);
  const MaskParams mask = args.masks != nullptr ? args.masks[s] : MaskParams{};

  // Visible keys: [0, lead) then [first, last] (MaskParams' lowest_key / leading_keys contract).
  const int last = mask.kind == MaskKind::kBidirectional ? kv_len - 1 : min(q_pos, kv_len - 1);
  const int first = mask.kind == MaskKind::kBidirectional ? 0 : max(mask.lowest_key(q_pos), 0);
  const int lead = max(min(min(mask.leading_keys(), first), last + 1), 0);
  const int n_main = max(last - first + 1, 0);
  const int n = lead + n_main;

  const int group = lane / kLanesPerKey;
  const int sub = lane % kLanesPerKey;
  const float scale = args.softmax_scale * 1.4426950408889634f;  // scores in log2 units

  float q[2 * kPairs], acc[2 * kPairs];
  {
    const T* q_row = static_cast<const T*>(args.q) + static_cast<int64_t>(row) * args.q_row_stride +
                     static_cast<int64_t>(head) * D;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int d = 2 * (sub + kLanesPerKey * j);
      float2 f = make_float2(0.f, 0.f);
      if (d < D) f = DTypeTraits<T>::to_float2(*reinterpret_cast<const Pair*>(q_row + d));
      q[2 * j] = f.x * scale;
      q[2 * j + 1] = f.y * scale;
      acc[2 * j] = acc[2 * j + 1] = 0.f;
    }
  }
  float m = -INFINITY, l = 0.f;

  const KvT* k_base = static_cast<const KvT*>(args.k);
  const KvT* v_base = static_cast<const KvT*>(args.v);
  for (int base = 0; base < n; base += kGroups) {  // uniform over the warp: every lane shuffles
    const int idx = base + group;
    const int key = idx < lead ? idx : first + (idx - lead);
    bool valid = idx < n;
    int64_t k_off = 0, v_off = 0;
    if (valid) {
      if (paged) {
        const int bi = key / args.block_size;
        const int64_t block = bi < args.max_blocks_per_seq
                                  ? args.block_tables[static_cast<int64_t>(s) * args.max_blocks_per_seq + bi]
                                  : -1;
        valid = block >= 0;
        k_off = v_off = ((block * args.block_size + key % args.block_size) * args.num_kv_heads + kv_head) * D;
      } else {
        k_off = static_cast<int64_t>(k_start + key) * args.k_row_stride + static_cast<int64_t>(kv_head) * D;
        v_off = static_cast<int64_t>(k_start + key) * args.v_row_stride + static_cast<int64_t>(kv_head) * D;
      }
    }
    float dot = 0.f;
    if (valid) {
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int d = 2 * (sub + kLanesPerKey * j);
        if (d < D) {
          const float2 f = kv_pair_to_float2(k_base + k_off + d);
          dot += q[2 * j] * f.x + q[2 * j + 1] * f.y;
        }
      }
    }
#pragma unroll
    for (int offset = kLanesPerKey / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(kFull, dot, offset);
    if (valid) {
      const float m_new = fmaxf(m, dot);
      const float corr = exp2f(m - m_new);  // 0 on the group's first key (m = -inf)
      const float p = exp2f(dot - m_new);
      l = l * corr + p;
      m = m_new;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int d = 2 * (sub + kLanesPerKey * j);
        float2 f = make_float2(0.f, 0.f);
        if (d < D) f = kv_pair_to_float2(v_base + v_off + d);
        acc[2 * j] = acc[2 * j] * corr + p * f.x;
        acc[2 * j + 1] = acc[2 * j + 1] * corr + p * f.y;
      }
    }
  }

  // Merge the lane groups' softmax states (lane i of each group holds the same dims).
#pragma unroll
  for (int offset = kLanesPerKey; offset < 32; offset <<= 1) {
    const float m_other = __shfl_xor_sync(kFull, m, offset);
    const float l_other = __shfl_xor_sync(kFull, l, offset);
    const float m_new = fmaxf(m, m_other);
    const float c_self = m_new == -INFINITY ? 0.f : exp2f(m - m_new);
    const float c_other = m_new == -INFINITY ? 0.f : exp2f(m_other - m_new);
    l = l * c_self + l_other * c_other;
#pragma unroll
    for (int i = 0; i < 2 * kPairs; ++i) {
      const float a_other = __shfl_xor_sync(kFull, acc[i], offset);
      acc[i] = acc[i] * c_self + a_other * c_other;
    }
    m = m_new;
  }

  if (group != 0) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  T* out_row = static_cast<T*>(args.out) + static_cast<int64_t>(row) * args.out_row_stride +
               static_cast<int64_t>(head) * D;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int d = 2 * (sub + kLanesPerKey * j);
    if (d < D)
      *reinterpret_cast<Pair*>(out_row + d) = DTypeTraits<T>::from_float2(acc[2 * j] * inv, acc[2 * j + 1] * inv);
  }
}

template <typename T, typename KvT, int kLanesPerKey, int kPairs>
cudaError_t launch_generic_attention_instance(const GenericAttentionArgs& args, cudaStream_t stream) {
  const int64_t items = static_cast<int64_t>(args.total_q) * args.num_heads;
  const int64_t blocks = (items + kGenericWarpsPerBlock - 1) / kGenericWarpsPerBlock;
  generic_attention_kernel<T, KvT, kLanesPerKey, kPairs>
      <<<static_cast<unsigned>(blocks), kGenericWarpsPerBlock * 32, 0, stream>>>(args);
  return cudaGetLastError();
}

// head_dim -> (lanes per key, dim pairs per lane): 2 * lanes * pairs >= head_dim.
template <typename T, typename KvT = T>
cudaError_t launch_generic_attention(const GenericAttentionArgs& args, cudaStream_t stream) {
  const int d = args.head_dim;
  if (d <= 16) return launch_generic_attention_instance<T, KvT, 8, 1>(args, stream);
  if (d <= 32) return launch_generic_attention_instance<T, KvT, 16, 1>(args, stream);
  if (d <= 64) return launch_generic_attention_instance<T, KvT, 32, 1>(args, stream);
  if (d <= 128) return launch_generic_attention_instance<T, KvT, 32, 2>(args, stream);
  if (d <= 192) return launch_generic_attention_instance<T, KvT, 32, 3>(args, stream);
  return launch_generic_attention_instance<T, KvT, 32, 4>(args, stream);
}

}  // namespace tessera::kernels::cuda
