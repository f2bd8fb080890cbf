// kernels/cuda/rope/rope.h: rotary position embedding, in place on Q and K (HF rotate_half
// convention: dimension i pairs with i + head_dim/2). Stateless and thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// Rotates q[t, h, :] and k[t, h, :] by positions[t] * inv_freq[i] (the angle in fp32, as the CPU
// kernel and transformers form it). inv_freq is the table of kernels/rope_frequencies.h, computed
// on the host and uploaded once, so the CPU and CUDA backends rotate by the same frequencies. Token
// rows are q_stride / k_stride elements apart, so Q and K may be slices of one fused QKV buffer.
cudaError_t rope_inplace(DType dtype,
                         void* q,                  // [tokens, q_stride], num_heads * head_dim used
                         void* k,                  // [tokens, k_stride], num_kv_heads * head_dim used
                         const int32_t* positions, // [tokens], device
                         int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t q_stride,
                         int64_t k_stride,
                         const float* inv_freq,    // [head_dim / 2], device
                         cudaStream_t stream);

// Names the first unsupported value ("head_dim must be even and in (0, 1024], got 63"), or "".
std::string rope_unsupported(int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t q_stride,
                             int64_t k_stride);

}  // namespace tessera::kernels::cuda
