// kernels/cuda/kv_cache/kv_cache.cuh: KV cache append and gather kernels, then their launchers.
// With a cache in the activation type both only move 2-byte elements, so one instance serves bf16 and
// fp16 (the dtype is validated by the dispatch point, never needed by the kernel); with an fp8 cache
// the append rounds each value to e4m3 and the gather widens it back (kernels/cuda/common/fp8.cuh).
#pragma once

#include <type_traits>

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/fp8.cuh"
#include "kernels/cuda/rope/rope.cuh"

namespace tessera::kernels::cuda {

// A block is (threads_per_row, rows_per_block): each row of threads copies one token's K and V
// rows, and narrow rows (small KV widths) share a block so that it is not mostly idle threads.
struct KvCopyShape {
  dim3 block;
  unsigned grid = 0;
};

inline KvCopyShape kv_copy_shape(int64_t rows, int items_per_row) {
  constexpr int kThreads = 256;
  const int both = 2 * items_per_row;  // K and V
  int per_row = ((both + 31) / 32) * 32;
  per_row = per_row > kThreads ? kThreads : per_row;
  const int rows_per_block = kThreads / per_row;
  KvCopyShape shape;
  shape.block = dim3(per_row, rows_per_block);
  shape.grid = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  return shape;
}

// What a row copy does to each value: a plain copy of 2-byte values (one instance serves bf16 and
// fp16), T -> e4m3 into an fp8 cache (append), or e4m3 -> T out of one (gather).
enum class KvMove { kCopy, kToE4m3, kFromE4m3 };

template <KvMove kMove>
struct KvMoveTypes {
  using Src = std::conditional_t<kMove == KvMove::kFromE4m3, e4m3_t, uint16_t>;
  using Dst = std::conditional_t<kMove == KvMove::kToE4m3, e4m3_t, uint16_t>;
};

// Moves `items` 8-element (kVec: 16 bytes of T, 8 of e4m3) or 1-element chunks of K then V; a null
// source writes zeros (+0.0 in bf16, fp16 and e4m3 alike).
template <KvMove kMove, typename T, bool kVec>
__device__ __forceinline__ void kv_move_row(typename KvMoveTypes<kMove>::Dst* k_dst,
                                            typename KvMoveTypes<kMove>::Dst* v_dst,
                                            const typename KvMoveTypes<kMove>::Src* k_src,
                                            const typename KvMoveTypes<kMove>::Src* v_src, int items) {
  using Src = typename KvMoveTypes<kMove>::Src;
  using Dst = typename KvMoveTypes<kMove>::Dst;
  for (int i = threadIdx.x; i < 2 * items; i += blockDim.x) {
    const bool is_v = i >= items;
    const int c = is_v ? i - items : i;
    const Src* src = is_v ? v_src : k_src;
    Dst* dst = is_v ? v_dst : k_dst;
    if constexpr (kVec && kMove == KvMove::kCopy) {
      reinterpret_cast<uint4*>(dst)[c] =
          src != nullptr ? __ldg(reinterpret_cast<const uint4*>(src) + c) : make_uint4(0, 0, 0, 0);
    } else if constexpr (kVec && kMove == KvMove::kToE4m3) {
      reinterpret_cast<uint2*>(dst)[c] =
          src != nullptr ? e4m3x8_from_vec8<T>(__ldg(reinterpret_cast<const uint4*>(src) + c)) : make_uint2(0, 0);
    } else if constexpr (kVec) {  // kFromE4m3
      reinterpret_cast<uint4*>(dst)[c] =
          src != nullptr ? vec8_from_e4m3x8<T>(__ldg(reinterpret_cast<const uint2*>(src) + c)) : make_uint4(0, 0, 0, 0);
    } else if constexpr (kMove == KvMove::kCopy) {
      dst[c] = src != nullptr ? src[c] : uint16_t{0};
    } else if constexpr (kMove == KvMove::kToE4m3) {
      dst[c] = src != nullptr ? e4m3_from_float(to_float(reinterpret_cast<const T*>(src)[c])) : e4m3_t{0};
    } else {
      reinterpret_cast<T*>(dst)[c] = from_float<T>(src != nullptr ? e4m3_to_float(src[c]) : 0.f);
    }
  }
}

template <KvMove kMove, typename T, bool kVec>
__global__ void kv_cache_append_kernel(typename KvMoveTypes<kMove>::Dst* __restrict__ k_cache,
                                       typename KvMoveTypes<kMove>::Dst* __restrict__ v_cache,
                                       const uint16_t* __restrict__ k, int64_t k_row_stride,
                                       const uint16_t* __restrict__ v, int64_t v_row_stride,
                                       const int32_t* __restrict__ slot_mapping, int tokens, int width,
                                       int64_t num_slots) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= tokens) return;
  // Programmatic dependent launch: slot_mapping (a step input, copied in before the step's first
  // kernel) is read before the wait; k and v, which the projection just before wrote, after it.
  const int32_t slot = slot_mapping[t];
  pdl_wait_previous();
  pdl_launch_dependents();
  if (slot < 0 || slot >= num_slots) return;
  const int64_t dst = static_cast<int64_t>(slot) * width;
  kv_move_row<kMove, T, kVec>(k_cache + dst, v_cache + dst, k + t * k_row_stride, v + t * v_row_stride,
                              kVec ? width / 8 : width);
}

template <KvMove kMove, typename T, bool kVec>
__global__ void kv_cache_gather_kernel(uint16_t* __restrict__ k_out, uint16_t* __restrict__ v_out,
                                       const typename KvMoveTypes<kMove>::Src* __restrict__ k_cache,
                                       const typename KvMoveTypes<kMove>::Src* __restrict__ v_cache,
                                       const int32_t* __restrict__ block_tables, int max_blocks_per_seq,
                                       const int32_t* __restrict__ cu_seqlens_k, int num_seqs, int total_k,
                                       int block_size, int width, int num_blocks) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= total_k) return;
  // The row's sequence: the last s in [0, num_seqs] with cu_seqlens_k[s] <= row (num_seqs: past the
  // batch). Every thread of the row searches; the few loads hit L1.
  int lo = 0, hi = num_seqs;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens_k[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int s = lo;
  int64_t src = -1;
  if (s < num_seqs && row >= cu_seqlens_k[s]) {
    const int pos = static_cast<int>(row - cu_seqlens_k[s]);
    const int blk = pos / block_size;
    if (blk < max_blocks_per_seq) {
      const int32_t b = block_tables[static_cast<int64_t>(s) * max_blocks_per_seq + blk];
      if (b >= 0 && b < num_blocks) src = static_cast<int64_t>(b) * block_size + pos % block_size;
    }
  }
  const int64_t dst = row * width;
  kv_move_row<kMove, T, kVec>(k_out + dst, v_out + dst, src >= 0 ? k_cache + src * width : nullptr,
                              src >= 0 ? v_cache + src * width : nullptr, kVec ? width / 8 : width);
}

// kMove kCopy or kToE4m3 (the cache's type); T is the activation type (any 2-byte type for kCopy).
template <KvMove kMove, typename T>
cudaError_t launch_kv_cache_append(typename KvMoveTypes<kMove>::Dst* k_cache,
                                   typename KvMoveTypes<kMove>::Dst* v_cache, const uint16_t* k,
                                   int64_t k_row_stride, const uint16_t* v, int64_t v_row_stride,
                                   const int32_t* slot_mapping, int tokens, int width, int64_t num_slots,
                                   cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && k_row_stride % 8 == 0 && v_row_stride % 8 == 0 && is_aligned16(k_cache) &&
                   is_aligned16(v_cache) && is_aligned16(k) && is_aligned16(v);
  const KvCopyShape shape = kv_copy_shape(tokens, vec ? width / 8 : width);
  // Launched with programmatic dependent launch: at decode sizes its launch is most of its cost.
  if (vec) {
    return launch_with_pdl(kv_cache_append_kernel<kMove, T, true>, shape.grid, shape.block, 0, stream, k_cache,
                           v_cache, k, k_row_stride, v, v_row_stride, slot_mapping, tokens, width, num_slots);
  }
  return launch_with_pdl(kv_cache_append_kernel<kMove, T, false>, shape.grid, shape.block, 0, stream, k_cache, v_cache,
                         k, k_row_stride, v, v_row_stride, slot_mapping, tokens, width, num_slots);
}

// kMove kCopy or kFromE4m3 (the cache's type); the output is always T.
template <KvMove kMove, typename T>
cudaError_t launch_kv_cache_gather(uint16_t* k_out, uint16_t* v_out, const typename KvMoveTypes<kMove>::Src* k_cache,
                                   const typename KvMoveTypes<kMove>::Src* v_cache, const int32_t* block_tables,
                                   int max_blocks_per_seq, const int32_t* cu_seqlens_k, int num_seqs, int total_k,
                                   int block_size, int width, int num_blocks, cudaStream_t stream) {
  if (total_k == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && is_aligned16(k_out) && is_aligned16(v_out) && is_aligned16(k_cache) &&
                   is_aligned16(v_cache);
  const KvCopyShape shape = kv_copy_shape(total_k, vec ? width / 8 : width);
  if (vec) {
    kv_cache_gather_kernel<kMove, T, true><<<shape.grid, shape.block, 0, stream>>>(
        k_out, v_out, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens_k, num_seqs, total_k,
        block_size, width, num_blocks);
  } else {
    kv_cache_gather_kernel<kMove, T, false><<<shape.grid, shape.block, 0, stream>>>(
        k_out, v_out, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens_k, num_seqs, total_k,
        block_size, width, num_blocks);
  }
  return cudaGetLastError();
}

// One block per row: V is copied as is; K is rotated by rotate_by[row] RoPE positions in the
// rotate_half convention (pair i with i + head_dim / 2), the angle formed in fp32 as rope_inplace
// forms it, and stored back once (kv_from_float: to T, then to e4m3 for an fp8 cache, as an append
// of the rotated row would store it). rotate_by 0 copies K unchanged (no rounding). KvT is the
// cache's storage type: T, or e4m3_t.
template <typename T, typename KvT>
__global__ void kv_cache_copy_rotate_kernel(KvT* k_cache, KvT* v_cache, const int32_t* src_rows,
                                            const int32_t* dst_rows, const int32_t* rotate_by, int heads,
                                            int head_dim, const float* inv_freq) {
  const int row = blockIdx.x;
  const int64_t width = static_cast<int64_t>(heads) * head_dim;
  const int64_t src = static_cast<int64_t>(src_rows[row]) * width;
  const int64_t dst = static_cast<int64_t>(dst_rows[row]) * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) v_cache[dst + i] = v_cache[src + i];
  const int shift = rotate_by[row];
  const int half = head_dim / 2;
  for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
    const int h = p / half;
    const int i = p % half;
    const int64_t a = static_cast<int64_t>(h) * head_dim + i;
    if (shift == 0) {
      k_cache[dst + a] = k_cache[src + a];
      k_cache[dst + a + half] = k_cache[src + a + half];
      continue;
    }
    float s, c;
    sincosf(static_cast<float>(shift) * inv_freq[i], &s, &c);
    const float x1 = kv_to_float(k_cache[src + a]);
    const float x2 = kv_to_float(k_cache[src + a + half]);
    k_cache[dst + a] = kv_from_float<T, KvT>(x1 * c - x2 * s);
    k_cache[dst + a + half] = kv_from_float<T, KvT>(x2 * c + x1 * s);
  }
}

template <typename T, typename KvT>
cudaError_t launch_kv_cache_copy_rotate(KvT* k_cache, KvT* v_cache, const int32_t* src_rows, const int32_t* dst_rows,
                                        const int32_t* rotate_by, int rows, int heads, int head_dim,
                                        const float* inv_freq, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int width = heads * head_dim;
  const int threads = width >= 256 ? 256 : ((width + 31) / 32) * 32;
  kv_cache_copy_rotate_kernel<T, KvT><<<rows, threads, 0, stream>>>(k_cache, v_cache, src_rows, dst_rows, rotate_by,
                                                                   heads, head_dim, inv_freq);
  return cudaGetLastError();
}

// A block per (token, head): blocks y < num_heads rotate that q head in place; the others rotate
// K head y - num_heads into the cache and copy its V head. A thread per rotated pair (i, i + half),
// its angle formed and applied as rope_kernel does (rope/rope.cuh: rope_rotate), so the results are
// bit-identical to rope then kv_cache_append: q and a T cache exactly, and an e4m3 cache (KvT
// e4m3_t) holds the e4m3 rounding of the T value the unfused path would append (kv_from_float).
template <typename T, typename KvT>
__global__ void kv_cache_append_rope_kernel(KvT* __restrict__ k_cache, KvT* __restrict__ v_cache, T* __restrict__ q,
                                            int64_t q_row_stride, const T* __restrict__ k, int64_t k_row_stride,
                                            const T* __restrict__ v, int64_t v_row_stride,
                                            const int32_t* __restrict__ positions,
                                            const int32_t* __restrict__ slot_mapping, int num_heads, int head_dim,
                                            int64_t num_slots, int kv_width, const float* __restrict__ inv_freq) {
  const int64_t t = blockIdx.x;
  const int head = blockIdx.y;
  const int half = head_dim / 2;
  // Programmatic dependent launch: positions and slot_mapping (step inputs, copied in before the
  // step's first kernel) are read before the wait; q, k and v, which the projection just before
  // wrote, after it.
  const float pos = static_cast<float>(positions[t]);
  const int32_t slot = head < num_heads ? 0 : slot_mapping[t];
  pdl_wait_previous();
  pdl_launch_dependents();
  if (head < num_heads) {
    T* row = q + t * q_row_stride + static_cast<int64_t>(head) * head_dim;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float s, c;
      sincosf(pos * inv_freq[i], &s, &c);
      const float2 r = rope_rotate(to_float(row[i]), to_float(row[i + half]), c, s);
      row[i] = from_float<T>(r.x);
      row[i + half] = from_float<T>(r.y);
    }
    return;
  }
  if (slot < 0 || slot >= num_slots) return;
  const int64_t offset = static_cast<int64_t>(head - num_heads) * head_dim;
  KvT* dst = k_cache + static_cast<int64_t>(slot) * kv_width + offset;
  const T* src = k + t * k_row_stride + offset;
  const T* v_src = v + t * v_row_stride + offset;
  KvT* v_dst = v_cache + static_cast<int64_t>(slot) * kv_width + offset;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    if constexpr (std::is_same_v<KvT, T>) {
      v_dst[i] = v_src[i];
    } else {
      v_dst[i] = e4m3_from_float(to_float(v_src[i]));
    }
  }
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    const float2 r = rope_rotate(to_float(src[i]), to_float(src[i + half]), c, s);
    dst[i] = kv_from_float<T, KvT>(r.x);
    dst[i + half] = kv_from_float<T, KvT>(r.y);
  }
}

template <typename T, typename KvT>
cudaError_t launch_kv_cache_append_rope(KvT* k_cache, KvT* v_cache, T* q, int64_t q_row_stride, const T* k,
                                        int64_t k_row_stride, const T* v, int64_t v_row_stride,
                                        const int32_t* positions, const int32_t* slot_mapping, int tokens,
                                        int num_heads, int num_kv_heads, int head_dim, int64_t num_slots,
                                        const float* inv_freq, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int half = head_dim / 2;
  const int threads = half >= 128 ? 128 : ((half + 31) / 32) * 32;
  return launch_with_pdl(kv_cache_append_rope_kernel<T, KvT>,
                         dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(num_heads + num_kv_heads)),
                         dim3(static_cast<unsigned>(threads)), 0, stream, k_cache, v_cache, q, q_row_stride, k,
                         k_row_stride, v, v_row_stride, positions, slot_mapping, num_heads, head_dim, num_slots,
                         num_kv_heads * head_dim, inv_freq);
}

}  // namespace tessera::kernels::cuda
