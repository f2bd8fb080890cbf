// kernels/cpu/ops.h: fp32 reference kernels for everything but attention: GEMM, embedding gather,
// norms, RoPE, activations, softmax, pooling. Raw pointers and shapes in, a Status out. Rows are
// contiguous unless a row stride (in elements) is given. Multi-threaded over rows with OpenMP.
#pragma once

#include <cstdint>

#include "kernels/cpu/status.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/rope_frequencies.h"

namespace tessera::kernels::cpu {

// Sets the kernels' thread count (<= 0: all cores; see thread_pool.h) and makes OpenBLAS
// single-threaded: GEMMs are split over output columns on our pool, so two thread pools never fight
// over the cores.
void configure_threads(int num_threads);

// y = x · wᵀ (+ bias): a linear layer with PyTorch's weight layout.
Status gemm_xwt(const float* x,     // [m, k]
                const float* w,     // [n, k]
                const float* bias,  // [n] or nullptr
                float* y,           // [m, n]
                int64_t m, int64_t n, int64_t k);

// out[i] = table[ids[i]] (or out[i] += table[ids[i]] when accumulate).
Status embedding_gather(const int32_t* ids,   // [count]
                        const float* table,   // [vocab, dim]
                        float* out,           // [count, dim]
                        int64_t count, int64_t vocab, int64_t dim, bool accumulate);

// out = x / rms(x) * weight, per row.
Status rms_norm(const float* x,       // [rows, dim]
                const float* weight,  // [dim]
                float* out,           // [rows, dim]
                int64_t rows, int64_t dim, float eps);

// The fused decoder-layer step, in place: residual <- x + residual; x <- rmsnorm(residual) * weight.
Status add_rms_norm(float* x,             // [rows, dim]
                    float* residual,      // [rows, dim]
                    const float* weight,  // [dim]
                    int64_t rows, int64_t dim, float eps);

// In place: x <- layernorm(x + residual) * weight + bias (residual may be nullptr). BERT's post-LN.
Status layer_norm(float* x,               // [rows, dim]
                  const float* residual,  // [rows, dim] or nullptr
                  const float* weight,    // [dim]
                  const float* bias,      // [dim]
                  int64_t rows, int64_t dim, float eps);

// RoPE inverse frequencies, fp32 as transformers computes them: theta^(-2i/head_dim).
// With llama3 scaling (factor > 0 and llama3 true), applies Llama 3.1's frequency smoothing. The
// parameters and the arithmetic are kernels/rope_frequencies.h's, shared with the CUDA backend.
using RopeFrequencyParams = ::tessera::kernels::RopeFrequencyParams;
Status rope_inv_freq(const RopeFrequencyParams& params,
                     float* inv_freq);  // [head_dim / 2]

// Rotary embedding in place, HF rotate_half convention: pairs (i, i + head_dim/2) of each head are
// rotated by position * inv_freq[i]. Rows may be strided (q and k inside a fused QKV row).
Status rope_rotate_half(float* x,                 // [rows, heads, head_dim] at row_stride
                        int64_t row_stride,       // elements between rows (>= heads * head_dim)
                        const int32_t* positions, // [rows]
                        const float* inv_freq,    // [head_dim / 2]
                        int64_t rows, int32_t heads, int32_t head_dim);

// Copies K and V cache rows src_rows[r] -> dst_rows[r] (rows of heads * head_dim), rotating the K
// row by rotate_by[r] RoPE positions (rotate_half convention, angle rotate_by * inv_freq[i] in fp32;
// 0 copies it unchanged). Moves a document's cached K/V to another position. Source and destination
// rows must be disjoint.
Status kv_copy_rotate(float* k, float* v,          // [num_rows, heads * head_dim] each
                      const int32_t* src_rows, const int32_t* dst_rows, const int32_t* rotate_by,  // [rows]
                      int64_t rows, int32_t heads, int32_t head_dim, const float* inv_freq);

// out = silu(gate) * up, reading gate and up from one fused row [gate | up].
Status silu_mul(const float* gate_up,  // [rows, 2 * dim]
                float* out,            // [rows, dim]
                int64_t rows, int64_t dim);

// In place: x <- 0.5 x (1 + erf(x / sqrt 2)) (exact GELU, as BERT's "gelu").
Status gelu_erf(float* x, int64_t count);

// Row-wise softmax in place.
Status softmax(float* x,  // [rows, cols]
               int64_t rows, int64_t cols);

// Pools packed sequences: mean over each sequence's rows, or its first row (CLS).
enum class PoolKind : int32_t { kMean = 0, kFirst = 1 };
Status pool_sequences(const float* x,          // [total_rows, dim]
                      const int32_t* cu_rows,  // [num_seqs + 1]
                      float* out,              // [num_seqs, dim]
                      int32_t num_seqs, int64_t dim, PoolKind kind);

// Row-wise L2 normalisation in place (x / max(||x||, 1e-12), as torch.nn.functional.normalize).
Status l2_normalize(float* x,  // [rows, dim]
                    int64_t rows, int64_t dim);

}  // namespace tessera::kernels::cpu
