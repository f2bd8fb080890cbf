// kernels/cuda/activation/activation.cu: the activations' dispatch points.
#include "kernels/cuda/activation/activation.cuh"
#include "kernels/cuda/activation/activation.h"

namespace tessera::kernels::cuda {

std::string activation_unsupported(int tokens, int width) {
  if (tokens < 0 || tokens > 65535)
    return "tokens must be in [0, 65535] (one grid row each), got " + std::to_string(tokens);
  if (width <= 0) return "width must be > 0, got " + std::to_string(width);
  return "";
}

cudaError_t silu_mul(DType dtype, void* out, const void* gate_up, int tokens, int inter, cudaStream_t stream) {
  if (!activation_unsupported(tokens, inter).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_silu_mul<scalar_t>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(gate_up), tokens,
                                     inter, stream);
  });
}

cudaError_t silu_mul_pairs(DType dtype, void* out, const void* gate_up, int tokens, int inter, cudaStream_t stream) {
  if (!activation_unsupported(tokens, inter).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_silu_mul_pairs<scalar_t>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(gate_up), tokens,
                                           inter, stream);
  });
}

cudaError_t bias_gelu(DType dtype, void* x, const void* bias, int tokens, int width, cudaStream_t stream) {
  if (!activation_unsupported(tokens, width).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_bias_gelu<scalar_t>(static_cast<scalar_t*>(x), static_cast<const scalar_t*>(bias), tokens, width,
                                      stream);
  });
}

cudaError_t add_residual(DType dtype, void* residual, const void* x, int tokens, int width, cudaStream_t stream) {
  if (!activation_unsupported(tokens, width).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_add_residual<scalar_t>(static_cast<scalar_t*>(residual), static_cast<const scalar_t*>(x), tokens,
                                         width, stream);
  });
}

}  // namespace tessera::kernels::cuda
