// kernels/cuda/attention_generic/attention_generic.h: a simple, any-head_dim attention kernel, the
// fallback for shapes the fast prefill/decode kernels do not take (head_dim 16, 80, 96, ...). It reads
// keys either contiguous per sequence (varlen prefill layout) or from the paged KV cache, with any
// number of query rows per sequence (prefill, chunked prefill, decode). Stateless and thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/attention_mask.h"
#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// Sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]); its q_len queries are the last
// q_len of its kv_len key positions (query i at position kv_len - q_len + i, MaskParams' convention).
// Query head h reads KV head h / (num_heads / num_kv_heads). A query that sees no key gets 0.
// Keys are either
//  - contiguous (block_tables == nullptr): k/v rows [cu_seqlens_k[s], cu_seqlens_k[s+1]), rows
//    *_row_stride elements apart; or
//  - paged (block_tables != nullptr): k/v are caches [num_blocks, block_size, num_kv_heads, head_dim];
//    key position p of sequence s is in block block_tables[s * max_blocks_per_seq + p / block_size],
//    slot p % block_size, and kv_lens[s] keys exist. A negative block entry (evicted) is skipped: the
//    mask must already hide such keys. k_row_stride, v_row_stride and cu_seqlens_k are unused.
// head_dim: even, 8..256. Strides: even, >= heads * head_dim. Pointers: 4-byte aligned.
struct GenericAttentionArgs {
  void* out = nullptr;      // [total_q, out_row_stride]: num_heads * head_dim used
  const void* q = nullptr;  // [total_q, q_row_stride]
  const void* k = nullptr;  // contiguous: [total_k, k_row_stride]; paged: the K cache
  const void* v = nullptr;  // contiguous: [total_k, v_row_stride]; paged: the V cache
  int64_t k_row_stride = 0, v_row_stride = 0;
  const int32_t* cu_seqlens_k = nullptr;  // [num_seqs + 1], device (contiguous only)
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], device (paged only)
  int32_t max_blocks_per_seq = 0, block_size = 0;
  const int32_t* kv_lens = nullptr;        // [num_seqs], device (paged only): keys per sequence
  const int32_t* cu_seqlens_q = nullptr;   // [num_seqs + 1], device
  const MaskParams* masks = nullptr;       // [num_seqs], device, or null (all causal); segment_ends on device
  int32_t num_seqs = 0, total_q = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t q_row_stride = 0, out_row_stride = 0;
  float softmax_scale = 0.f;
  // The paged caches' element type: the activation dtype, or e4m3 (bf16 activations, paged keys
  // only), widened to fp32 as it is read.
  KvDType kv_dtype = KvDType::kActivation;
};

cudaError_t generic_attention(DType dtype, const GenericAttentionArgs& args, cudaStream_t stream);

// Names the first unsupported value, or "".
std::string generic_attention_unsupported(DType dtype, const GenericAttentionArgs& args);

}  // namespace tessera::kernels::cuda
