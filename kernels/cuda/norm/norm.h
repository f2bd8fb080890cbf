// kernels/cuda/norm/norm.h: the norm ops' dispatch points (RMSNorm, fused add+RMSNorm, LayerNorm).
// Host code includes this; the kernels live in rmsnorm.cuh / layernorm.cuh, instantiated in norm.cu.
// Every call is thread-safe (no state); errors come back as cudaError_t. The RMSNorm kernels are
// launched with programmatic dependent launch and read `weight` before waiting for the kernel just
// before them in the stream, which therefore must not write it (weights are parameters).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// residual <- x + residual; x <- rmsnorm(residual) * weight. Rows of x are x_stride elements apart
// (x_stride >= hidden); residual is contiguous. A 16-byte vector path is taken when hidden, the
// stride and every pointer allow it, a scalar path otherwise.
cudaError_t fused_add_rmsnorm(DType dtype,
                              void* x,             // [tokens, x_stride]
                              void* residual,      // [tokens, hidden]
                              const void* weight,  // [hidden]
                              int tokens, int hidden, int64_t x_stride, float eps, cudaStream_t stream);

// out <- rmsnorm(x) * weight (the first layer's norm, and the final norm). out may alias x.
cudaError_t rmsnorm(DType dtype,
                    void* out,           // [tokens, out_stride]
                    const void* x,       // [tokens, x_stride]
                    const void* weight,  // [hidden]
                    int tokens, int hidden, int64_t x_stride, int64_t out_stride, float eps, cudaStream_t stream);

// out <- layernorm(x + residual) * gamma + beta (BERT). residual may be null; out may alias x.
cudaError_t layernorm(DType dtype,
                      void* out,             // [tokens, hidden]
                      const void* x,         // [tokens, hidden]
                      const void* residual,  // [tokens, hidden] or null
                      const void* gamma,     // [hidden]
                      const void* beta,      // [hidden]
                      int tokens, int hidden, float eps, cudaStream_t stream);

// Names the first unsupported value ("hidden must be > 0, got 0"), or "" when the call is valid.
std::string norm_unsupported(int tokens, int hidden, int64_t x_stride, int64_t out_stride);

}  // namespace tessera::kernels::cuda
