// tests/gpu/reference.h: fp32/fp64 CPU references for the GPU kernel tests (the oracle until the
// kernels/cpu backend provides its own). Inputs are the rounded values the GPU sees.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_mask.h"

namespace tessera::gpu_test {

// Varlen prefill attention. q: [total_q, num_heads, head_dim] (row stride q_stride), k/v likewise with
// num_kv_heads; masks[s].segment_ends are host pointers. Output [total_q, num_heads, head_dim].
std::vector<float> reference_prefill(const std::vector<float>& q, int64_t q_stride, const std::vector<float>& k,
                                     int64_t k_stride, const std::vector<float>& v, int64_t v_stride,
                                     const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                                     const std::vector<kernels::MaskParams>& masks, int num_heads, int num_kv_heads,
                                     int head_dim, float scale);

// Paged decode attention for one query per sequence at position context_len - 1.
std::vector<float> reference_decode(const std::vector<float>& q, const std::vector<float>& k_cache,
                                    const std::vector<float>& v_cache, const std::vector<int32_t>& block_tables,
                                    const std::vector<int32_t>& context_lens,
                                    const std::vector<kernels::MaskParams>* masks, int num_heads, int num_kv_heads,
                                    int head_dim, int block_size, int max_blocks_per_seq, float scale);

}  // namespace tessera::gpu_test
