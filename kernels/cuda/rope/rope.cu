// kernels/cuda/rope/rope.cu: RoPE's dispatch point.
#include "kernels/cuda/rope/rope.cuh"

namespace tessera::kernels::cuda {

std::string rope_unsupported(int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t q_stride,
                             int64_t k_stride) {
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
  return "";
}

cudaError_t rope_inplace(DType dtype, void* q, void* k, const int32_t* positions, int tokens, int num_heads,
                         int num_kv_heads, int head_dim, int64_t q_stride, int64_t k_stride, const float* inv_freq,
                         cudaStream_t stream) {
  if (!rope_unsupported(tokens, num_heads, num_kv_heads, head_dim, q_stride, k_stride).empty())
    return cudaErrorInvalidValue;
  if (tokens > 0 && inv_freq == nullptr) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_rope<scalar_t>(static_cast<scalar_t*>(q), static_cast<scalar_t*>(k), positions, tokens, num_heads,
                                 num_kv_heads, head_dim, q_stride, k_stride, inv_freq, stream);
  });
}

}  // namespace tessera::kernels::cuda
