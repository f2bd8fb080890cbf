// kernels/cuda/rope/rope.h: rotary position embedding, in place on Q and K (HF rotate_half
// convention: dimension i pairs with i + head_dim/2). Stateless and thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

enum class RopeScaling : int32_t { kNone = 0, kLlama3 = 1 };

struct RopeParams {
  float theta = 10000.f;
  RopeScaling scaling = RopeScaling::kNone;
  // kLlama3 (Llama 3.1 "rope_type": "llama3"): long wavelengths are divided by `factor`, short ones
  // kept, the band between blended.
  float factor = 8.f;
  float low_freq_factor = 1.f;
  float high_freq_factor = 4.f;
  int32_t original_max_position = 8192;
};

// Rotates q[t, h, :] and k[t, h, :] by positions[t]. Token rows are q_stride / k_stride elements
// apart, so Q and K may be slices of one fused QKV buffer.
cudaError_t rope_inplace(DType dtype,
                         void* q,                  // [tokens, q_stride], num_heads * head_dim used
                         void* k,                  // [tokens, k_stride], num_kv_heads * head_dim used
                         const int32_t* positions, // [tokens]
                         int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t q_stride,
                         int64_t k_stride, const RopeParams& params, cudaStream_t stream);

std::string rope_unsupported(int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t q_stride,
                             int64_t k_stride, const RopeParams& params);

// The rotation frequency of pair i (0 <= i < head_dim/2), as the kernel computes it (fp32).
float rope_inv_freq(const RopeParams& params, int head_dim, int i);

}  // namespace tessera::kernels::cuda
