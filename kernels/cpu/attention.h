// kernels/cpu/attention.h: fp32 reference attention with per-sequence mask policies
// (kernels/attention_mask.h), GQA, over packed varlen K/V (prefill, encoders) or the paged KV cache
// (decode, chunked prefill). Each query visits only its visible key ranges: [0, leading) for sinks or
// a shared prefix, then [lowest_key(q), last visible key]. No dense mask is ever built.
#pragma once

#include <cstdint>

#include "kernels/attention_mask.h"
#include "kernels/cpu/status.h"

namespace tessera::kernels::cpu {

struct AttentionDims {
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // divides num_heads (GQA: query head h reads kv head h / (num_heads / num_kv_heads))
  int32_t head_dim = 0;
  float scale = 0.0f;        // usually 1 / sqrt(head_dim)
};

// Queries of every sequence are packed: sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]).
// Within a row, head h occupies [h * head_dim, (h + 1) * head_dim). Rows are strided so q, k and v
// can be read straight out of a fused QKV projection.
struct PackedQueries {
  const float* q = nullptr;          // [total_q, num_heads, head_dim] at q_row_stride
  int64_t q_row_stride = 0;
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1]
  int32_t num_seqs = 0;
  const MaskParams* masks = nullptr;      // [num_seqs]
};

// Keys and values packed like the queries (sequence s owns rows [cu_seqlens_k[s], cu_seqlens_k[s+1])).
// A sequence's queries are its last q_len positions (bottom-right aligned).
Status attention_varlen(const PackedQueries& queries,
                        const float* k, int64_t k_row_stride,  // [total_k, num_kv_heads, head_dim]
                        const float* v, int64_t v_row_stride,  // [total_k, num_kv_heads, head_dim]
                        const int32_t* cu_seqlens_k,           // [num_seqs + 1]
                        const AttentionDims& dims,
                        float* out);                           // [total_q, num_heads * head_dim]

// The paged KV layout shared with the CUDA kernels: per layer, K and V caches of shape
// [num_blocks, block_size, num_kv_heads, head_dim]; position p of sequence s lives in block
// block_tables[s * max_blocks_per_seq + p / block_size] at offset p % block_size.
struct PagedKv {
  const float* k_cache = nullptr;        // [num_blocks, block_size, num_kv_heads, head_dim]
  const float* v_cache = nullptr;        // [num_blocks, block_size, num_kv_heads, head_dim]
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  const int32_t* block_tables = nullptr; // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr; // [num_seqs] keys per sequence, this step's tokens included
};

Status attention_paged(const PackedQueries& queries, const PagedKv& kv, const AttentionDims& dims,
                       float* out);  // [total_q, num_heads * head_dim]

// Writes this step's keys and values into the paged caches: row i goes to slot slot_mapping[i]
// (= block * block_size + offset); a negative slot skips the row.
Status kv_cache_write(const float* k, int64_t k_row_stride,  // [rows, num_kv_heads, head_dim]
                      const float* v, int64_t v_row_stride,  // [rows, num_kv_heads, head_dim]
                      const int32_t* slot_mapping,           // [rows]
                      int64_t rows, int32_t num_kv_heads, int32_t head_dim,
                      float* k_cache,                        // [num_blocks, block_size, num_kv_heads, head_dim]
                      float* v_cache,                        // same
                      int64_t num_slots);                    // num_blocks * block_size

}  // namespace tessera::kernels::cpu
