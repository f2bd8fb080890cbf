// kernels/cuda/kv_cache/kv_cache.cuh: KV cache append and gather kernels, then their launchers.
// Both only move 2-byte elements, so one instance serves bf16 and fp16 (the dtype is validated by
// the dispatch point, never needed by the kernel).
#pragma once

#include "kernels/cuda/common/device.cuh"
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

// Copies `items` 8-element (kVec) or 1-element chunks of K then V; a null source writes zeros.
template <bool kVec>
__device__ __forceinline__ void kv_copy_row(uint16_t* k_dst, uint16_t* v_dst, const uint16_t* k_src,
                                            const uint16_t* v_src, int items) {
  for (int i = threadIdx.x; i < 2 * items; i += blockDim.x) {
    const bool is_v = i >= items;
    const int c = is_v ? i - items : i;
    const uint16_t* src = is_v ? v_src : k_src;
    uint16_t* dst = is_v ? v_dst : k_dst;
    if constexpr (kVec) {
      reinterpret_cast<uint4*>(dst)[c] =
          src != nullptr ? __ldg(reinterpret_cast<const uint4*>(src) + c) : make_uint4(0, 0, 0, 0);
    } else {
      dst[c] = src != nullptr ? src[c] : uint16_t{0};  // +0.0 in bf16 and fp16
    }
  }
}

template <bool kVec>
__global__ void kv_cache_append_kernel(uint16_t* __restrict__ k_cache, uint16_t* __restrict__ v_cache,
                                       const uint16_t* __restrict__ k, int64_t k_row_stride,
                                       const uint16_t* __restrict__ v, int64_t v_row_stride,
                                       const int32_t* __restrict__ slot_mapping, int tokens, int width,
                                       int64_t num_slots) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= tokens) return;
  const int32_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const int64_t dst = static_cast<int64_t>(slot) * width;
  kv_copy_row<kVec>(k_cache + dst, v_cache + dst, k + t * k_row_stride, v + t * v_row_stride,
                    kVec ? width / 8 : width);
}

template <bool kVec>
__global__ void kv_cache_gather_kernel(uint16_t* __restrict__ k_out, uint16_t* __restrict__ v_out,
                                       const uint16_t* __restrict__ k_cache, const uint16_t* __restrict__ v_cache,
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
  kv_copy_row<kVec>(k_out + dst, v_out + dst, src >= 0 ? k_cache + src * width : nullptr,
                    src >= 0 ? v_cache + src * width : nullptr, kVec ? width / 8 : width);
}

inline cudaError_t launch_kv_cache_append(uint16_t* k_cache, uint16_t* v_cache, const uint16_t* k,
                                          int64_t k_row_stride, const uint16_t* v, int64_t v_row_stride,
                                          const int32_t* slot_mapping, int tokens, int width, int64_t num_slots,
                                          cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && k_row_stride % 8 == 0 && v_row_stride % 8 == 0 && is_aligned16(k_cache) &&
                   is_aligned16(v_cache) && is_aligned16(k) && is_aligned16(v);
  const KvCopyShape shape = kv_copy_shape(tokens, vec ? width / 8 : width);
  if (vec) {
    kv_cache_append_kernel<true><<<shape.grid, shape.block, 0, stream>>>(k_cache, v_cache, k, k_row_stride, v,
                                                                        v_row_stride, slot_mapping, tokens, width,
                                                                        num_slots);
  } else {
    kv_cache_append_kernel<false><<<shape.grid, shape.block, 0, stream>>>(k_cache, v_cache, k, k_row_stride, v,
                                                                         v_row_stride, slot_mapping, tokens, width,
                                                                         num_slots);
  }
  return cudaGetLastError();
}

inline cudaError_t launch_kv_cache_gather(uint16_t* k_out, uint16_t* v_out, const uint16_t* k_cache,
                                          const uint16_t* v_cache, const int32_t* block_tables,
                                          int max_blocks_per_seq, const int32_t* cu_seqlens_k, int num_seqs,
                                          int total_k, int block_size, int width, int num_blocks,
                                          cudaStream_t stream) {
  if (total_k == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && is_aligned16(k_out) && is_aligned16(v_out) && is_aligned16(k_cache) &&
                   is_aligned16(v_cache);
  const KvCopyShape shape = kv_copy_shape(total_k, vec ? width / 8 : width);
  if (vec) {
    kv_cache_gather_kernel<true><<<shape.grid, shape.block, 0, stream>>>(
        k_out, v_out, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens_k, num_seqs, total_k,
        block_size, width, num_blocks);
  } else {
    kv_cache_gather_kernel<false><<<shape.grid, shape.block, 0, stream>>>(
        k_out, v_out, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_seqlens_k, num_seqs, total_k,
        block_size, width, num_blocks);
  }
  return cudaGetLastError();
}

// One block per row: V is copied as is; K is rotated by rotate_by[row] RoPE positions in the
// rotate_half convention (pair i with i + head_dim / 2), the angle formed in fp32 as rope_inplace
// forms it, and rounded back to T once. rotate_by 0 copies K unchanged (no rounding).
template <typename T>
__global__ void kv_cache_copy_rotate_kernel(T* k_cache, T* v_cache, const int32_t* src_rows, const int32_t* dst_rows,
                                            const int32_t* rotate_by, int heads, int head_dim, const float* inv_freq) {
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
    const float x1 = to_float(k_cache[src + a]);
    const float x2 = to_float(k_cache[src + a + half]);
    k_cache[dst + a] = from_float<T>(x1 * c - x2 * s);
    k_cache[dst + a + half] = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T>
cudaError_t launch_kv_cache_copy_rotate(T* k_cache, T* v_cache, const int32_t* src_rows, const int32_t* dst_rows,
                                        const int32_t* rotate_by, int rows, int heads, int head_dim,
                                        const float* inv_freq, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int width = heads * head_dim;
  const int threads = width >= 256 ? 256 : ((width + 31) / 32) * 32;
  kv_cache_copy_rotate_kernel<T><<<rows, threads, 0, stream>>>(k_cache, v_cache, src_rows, dst_rows, rotate_by, heads,
                                                              head_dim, inv_freq);
  return cudaGetLastError();
}

// A block per (token, head): blocks y < num_heads rotate that q head in place; the others rotate
// K head y - num_heads into the cache and copy its V head. A thread per rotated pair (i, i + half),
// its angle formed and applied as rope_kernel does (rope/rope.cuh: rope_rotate), so the results are
// bit-identical.
template <typename T>
__global__ void kv_cache_append_rope_kernel(T* __restrict__ k_cache, T* __restrict__ v_cache, T* __restrict__ q,
                                            int64_t q_row_stride, const T* __restrict__ k, int64_t k_row_stride,
                                            const T* __restrict__ v, int64_t v_row_stride,
                                            const int32_t* __restrict__ positions,
                                            const int32_t* __restrict__ slot_mapping, int num_heads, int head_dim,
                                            int64_t num_slots, int kv_width, const float* __restrict__ inv_freq) {
  const int64_t t = blockIdx.x;
  const int head = blockIdx.y;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  const bool is_q = head < num_heads;
  T* dst = nullptr;  // the rotated head's destination
  const T* src = nullptr;
  if (is_q) {
    dst = q + t * q_row_stride + static_cast<int64_t>(head) * head_dim;
    src = dst;
  } else {
    const int32_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots) return;
    const int64_t offset = static_cast<int64_t>(head - num_heads) * head_dim;
    dst = k_cache + static_cast<int64_t>(slot) * kv_width + offset;
    src = k + t * k_row_stride + offset;
    const T* v_src = v + t * v_row_stride + offset;
    T* v_dst = v_cache + static_cast<int64_t>(slot) * kv_width + offset;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v_dst[i] = v_src[i];
  }
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    const float x1 = to_float(src[i]);
    const float x2 = to_float(src[i + half]);
    const float2 r = rope_rotate(x1, x2, c, s);
    dst[i] = from_float<T>(r.x);
    dst[i + half] = from_float<T>(r.y);
  }
}

template <typename T>
cudaError_t launch_kv_cache_append_rope(T* k_cache, T* v_cache, T* q, int64_t q_row_stride, const T* k,
                                        int64_t k_row_stride, const T* v, int64_t v_row_stride,
                                        const int32_t* positions, const int32_t* slot_mapping, int tokens,
                                        int num_heads, int num_kv_heads, int head_dim, int64_t num_slots,
                                        const float* inv_freq, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int half = head_dim / 2;
  const int threads = half >= 128 ? 128 : ((half + 31) / 32) * 32;
  kv_cache_append_rope_kernel<T><<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(num_heads + num_kv_heads)),
                                   threads, 0, stream>>>(k_cache, v_cache, q, q_row_stride, k, k_row_stride, v,
                                                         v_row_stride, positions, slot_mapping, num_heads, head_dim,
                                                         num_slots, num_kv_heads * head_dim, inv_freq);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
