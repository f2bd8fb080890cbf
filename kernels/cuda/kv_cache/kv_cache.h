// kernels/cuda/kv_cache/kv_cache.h: the paged KV cache's data movement: appending new tokens' K/V
// rows into their slots, and gathering a sequence's paged K/V back into contiguous rows (so the
// prefill kernel, which wants contiguous K/V per sequence, can serve chunked prefill over the cache).
// With a cache in the activation dtype both are plain copies; with an fp8 cache (kv_dtype kFp8E4M3,
// bf16 activations only) the append rounds each value to e4m3 (saturating, scale 1.0:
// kernels/cuda/common/fp8.cuh says why) and every read widens it back to bf16. Stateless and
// thread-safe. The appends (plain and with RoPE) launch with programmatic dependent launch: before
// waiting for the kernel ahead of them they read only the step's slot_mapping and positions (copied
// in before the step's first kernel), so K, V and q are read once it has finished. The gather and
// the rotating copy launch plainly, after every earlier kernel in the stream has completed.
//
// Cache layout: [num_blocks, block_size, num_kv_heads, head_dim], i.e. [num_slots, num_kv_heads *
// head_dim] with slot = block * block_size + offset (DecodeArgs' k_cache / v_cache), in elements of
// the KV dtype (2 bytes, or 1 for e4m3). Sources and gathered outputs are always the activation dtype.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// k_cache[slot_mapping[t], :] <- k[t, :] and likewise for V, with rows of num_kv_heads * head_dim
// elements. Source rows are *_row_stride elements apart, so K and V may be views into a fused QKV
// buffer. A slot < 0 (padding, or a token the scheduler drops) or >= num_slots is skipped. 16-byte
// copies when the row width, strides and pointers allow, 2-byte copies otherwise.
cudaError_t kv_cache_append(DType dtype,
                            void* k_cache,                 // [num_slots, num_kv_heads * head_dim]
                            void* v_cache,                 // [num_slots, num_kv_heads * head_dim]
                            const void* k,                 // [tokens, k_row_stride]
                            int64_t k_row_stride,
                            const void* v,                 // [tokens, v_row_stride]
                            int64_t v_row_stride,
                            const int32_t* slot_mapping,   // [tokens], device
                            int tokens, int num_kv_heads, int head_dim, int64_t num_slots, cudaStream_t stream,
                            KvDType kv_dtype = KvDType::kActivation);

// Names the first invalid value ("k_row_stride must be >= num_kv_heads * head_dim (512), got 256"),
// or "" when the call is valid.
std::string kv_cache_append_unsupported(DType dtype, int tokens, int num_kv_heads, int head_dim,
                                        int64_t k_row_stride, int64_t v_row_stride, int64_t num_slots,
                                        KvDType kv_dtype = KvDType::kActivation);

// RoPE and the KV append in one kernel (GraphOptions::rope_in_kv_write): q[t] is rotated in place
// and k[t] rotated on its way to k_cache[slot_mapping[t]], by positions[t] · inv_freq[i] in the
// rotate_half convention, with rope_inplace's fp32 arithmetic (rope/rope.h), so q and the cache
// hold exactly what rope_inplace then kv_cache_append would leave; k itself is not written. v[t]
// is copied to v_cache[slot]. A slot < 0 or >= num_slots skips the K/V write (q is still rotated).
cudaError_t kv_cache_append_rope(DType dtype,
                                 void* k_cache,                 // [num_slots, num_kv_heads * head_dim]
                                 void* v_cache,                 // [num_slots, num_kv_heads * head_dim]
                                 void* q,                       // [tokens, q_row_stride], rotated in place
                                 int64_t q_row_stride,
                                 const void* k,                 // [tokens, k_row_stride]
                                 int64_t k_row_stride,
                                 const void* v,                 // [tokens, v_row_stride]
                                 int64_t v_row_stride,
                                 const int32_t* positions,      // [tokens], device
                                 const int32_t* slot_mapping,   // [tokens], device
                                 int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t num_slots,
                                 const float* inv_freq,         // [head_dim / 2], device
                                 cudaStream_t stream, KvDType kv_dtype = KvDType::kActivation);

std::string kv_cache_append_rope_unsupported(DType dtype, int tokens, int num_heads, int num_kv_heads, int head_dim,
                                             int64_t q_row_stride, int64_t k_row_stride, int64_t v_row_stride,
                                             int64_t num_slots, KvDType kv_dtype = KvDType::kActivation);

// For each sequence s and position pos in [0, cu_seqlens_k[s+1] - cu_seqlens_k[s]): row
// cu_seqlens_k[s] + pos of k_out / v_out <- the cache row of slot pos % block_size in block
// block_tables[s * max_blocks_per_seq + pos / block_size]. A table entry < 0 (an evicted block, -1)
// or >= num_blocks, a position past max_blocks_per_seq * block_size, and an output row not covered
// by cu_seqlens_k (rows >= cu_seqlens_k[num_seqs]) are written as zeros, so every one of the
// total_k rows is written. k_out / v_out are in the activation dtype whatever the cache's.
cudaError_t kv_cache_gather(DType dtype,
                            void* k_out,                   // [total_k, num_kv_heads * head_dim]
                            void* v_out,                   // [total_k, num_kv_heads * head_dim]
                            const void* k_cache,           // [num_blocks, block_size, num_kv_heads, head_dim]
                            const void* v_cache,           // [num_blocks, block_size, num_kv_heads, head_dim]
                            const int32_t* block_tables,   // [num_seqs, max_blocks_per_seq], device
                            int max_blocks_per_seq,
                            const int32_t* cu_seqlens_k,   // [num_seqs + 1], device, ascending from 0
                            int num_seqs, int total_k, int block_size, int num_kv_heads, int head_dim,
                            int num_blocks, cudaStream_t stream, KvDType kv_dtype = KvDType::kActivation);

std::string kv_cache_gather_unsupported(DType dtype, int max_blocks_per_seq, int num_seqs, int total_k,
                                        int block_size, int num_kv_heads, int head_dim, int num_blocks,
                                        KvDType kv_dtype = KvDType::kActivation);

// For each r < rows, in one layer's cache: the V row dst_rows[r] <- the V row src_rows[r], and the K
// row likewise, rotated by rotate_by[r] RoPE positions (rotate_half convention, angle
// rotate_by[r] * inv_freq[i] in fp32; 0: copied unchanged). Moves a document's cached K/V to another
// position. Rows are slots ([num_slots, num_kv_heads * head_dim]); source and destination rows must
// be disjoint.
cudaError_t kv_cache_copy_rotate(DType dtype, void* k_cache, void* v_cache,
                                 const int32_t* src_rows,   // [rows], device
                                 const int32_t* dst_rows,   // [rows], device
                                 const int32_t* rotate_by,  // [rows], device
                                 int rows, int num_kv_heads, int head_dim,
                                 const float* inv_freq,     // [head_dim / 2], device
                                 cudaStream_t stream, KvDType kv_dtype = KvDType::kActivation);

std::string kv_cache_copy_rotate_unsupported(DType dtype, int rows, int num_kv_heads, int head_dim,
                                             KvDType kv_dtype = KvDType::kActivation);

}  // namespace tessera::kernels::cuda
