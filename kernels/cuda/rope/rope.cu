// kernels/cuda/rope/rope.cu: RoPE's dispatch point.
#include "kernels/cuda/rope/rope.cuh"

namespace tessera::kernels::cuda {

float rope_inv_freq(const RopeParams& params, int head_dim, int i) { return rope_inv_freq_impl(params, head_dim, i); }

std::string rope_unsupported(int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t q_stride,
                             int64_t k_stride, const RopeParams& params) {
  if (tokens < 0) return "tokens must be >= 0, got " + std::to_string(tokens);
  if (num_heads <= 0 || num_kv_heads < 0)
    return "num_heads must be > 0 and num_kv_heads >= 0, got " + std::to_string(num_heads) + " / " +
           std::to_string(num_kv_heads);
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024)
    return "head_dim must be even and in (0, 1024], got " + std::to_string(head_dim);
  if (q_stride < static_cast<int64_t>(num_heads) * head_dim)
    return "q_stride must be >= num_heads * head_dim, got " + std::to_string(q_stride);
  if (k_stride < static_cast<int64_t>(num_kv_heads) * head_dim)
    return "k_stride must be >= num_kv_heads * head_dim, got " + std::to_string(k_stride);
  if (!(params.theta > 0.f)) return "rope theta must be > 0";
  if (params.scaling == RopeScaling::kLlama3 &&
      (!(params.factor > 0.f) || !(params.high_freq_factor > params.low_freq_factor) ||
       params.original_max_position <= 0))
    return "llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor, original_max_position > 0";
  if (params.scaling != RopeScaling::kNone && params.scaling != RopeScaling::kLlama3)
    return "unsupported rope scaling: " + std::to_string(static_cast<int>(params.scaling));
  return "";
}

cudaError_t rope_inplace(DType dtype, void* q, void* k, const int32_t* positions, int tokens, int num_heads,
                         int num_kv_heads, int head_dim, int64_t q_stride, int64_t k_stride, const RopeParams& params,
                         cudaStream_t stream) {
  if (!rope_unsupported(tokens, num_heads, num_kv_heads, head_dim, q_stride, k_stride, params).empty())
    return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_rope<scalar_t>(static_cast<scalar_t*>(q), static_cast<scalar_t*>(k), positions, tokens, num_heads,
                                 num_kv_heads, head_dim, q_stride, k_stride, params, stream);
  });
}

}  // namespace tessera::kernels::cuda
