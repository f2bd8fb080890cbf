// kernels/cuda/norm/norm.cu: the norm ops' dispatch points; the only place their templates are
// instantiated.
#include "kernels/cuda/norm/layernorm.cuh"
#include "kernels/cuda/norm/norm.h"
#include "kernels/cuda/norm/rmsnorm.cuh"

namespace tessera::kernels::cuda {

std::string norm_unsupported(int tokens, int hidden, int64_t x_stride, int64_t out_stride) {
  if (tokens < 0) return "tokens must be >= 0, got " + std::to_string(tokens);
  if (hidden <= 0) return "hidden must be > 0, got " + std::to_string(hidden);
  if (x_stride < hidden) return "x_stride must be >= hidden (" + std::to_string(hidden) + "), got " + std::to_string(x_stride);
  if (out_stride < hidden)
    return "out_stride must be >= hidden (" + std::to_string(hidden) + "), got " + std::to_string(out_stride);
  return "";
}

cudaError_t fused_add_rmsnorm(DType dtype, void* x, void* residual, const void* weight, int tokens, int hidden,
                              int64_t x_stride, float eps, cudaStream_t stream) {
  if (!norm_unsupported(tokens, hidden, x_stride, x_stride).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_rmsnorm<scalar_t, true>(static_cast<scalar_t*>(x), static_cast<const scalar_t*>(x),
                                          static_cast<scalar_t*>(residual), static_cast<const scalar_t*>(weight),
                                          tokens, hidden, x_stride, x_stride, eps, stream);
  });
}

cudaError_t rmsnorm(DType dtype, void* out, const void* x, const void* weight, int tokens, int hidden,
                    int64_t x_stride, int64_t out_stride, float eps, cudaStream_t stream) {
  if (!norm_unsupported(tokens, hidden, x_stride, out_stride).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_rmsnorm<scalar_t, false>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x), nullptr,
                                           static_cast<const scalar_t*>(weight), tokens, hidden, x_stride,
                                           out_stride, eps, stream);
  });
}

cudaError_t layernorm(DType dtype, void* out, const void* x, const void* residual, const void* gamma,
                      const void* beta, int tokens, int hidden, float eps, cudaStream_t stream) {
  if (!norm_unsupported(tokens, hidden, hidden, hidden).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_layernorm<scalar_t>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x),
                                      static_cast<const scalar_t*>(residual), static_cast<const scalar_t*>(gamma),
                                      static_cast<const scalar_t*>(beta), tokens, hidden, eps, stream);
  });
}

}  // namespace tessera::kernels::cuda
