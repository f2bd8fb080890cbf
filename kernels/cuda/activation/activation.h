// kernels/cuda/activation/activation.h: element-wise activations of the MLP blocks: SiLU-mul
// (Llama/Mistral gate-up) and bias + GELU (BERT, exact erf form), and the residual add of unfused
// graphs. Stateless and thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// out[t, i] <- silu(gate_up[t, i]) * gate_up[t, inter + i]  (gate first, as a fused gate-up GEMM writes it)
cudaError_t silu_mul(DType dtype,
                     void* out,            // [tokens, inter]
                     const void* gate_up,  // [tokens, 2 * inter]
                     int tokens, int inter, cudaStream_t stream);

// out[t, i] <- silu(gate_up[t, 2i]) * gate_up[t, 2i + 1]: the same for a gate-up GEMM whose weight rows
// are in pairs order (gemv_silu_mul, gemm/gemv.h), so its output columns alternate gate and up.
cudaError_t silu_mul_pairs(DType dtype,
                           void* out,            // [tokens, inter]
                           const void* gate_up,  // [tokens, 2 * inter], (gate, up) pairs
                           int tokens, int inter, cudaStream_t stream);

// x[t, i] <- gelu_erf(x[t, i] + bias[i]), in place. bias may be null.
cudaError_t bias_gelu(DType dtype,
                      void* x,           // [tokens, width]
                      const void* bias,  // [width] or null
                      int tokens, int width, cudaStream_t stream);

// residual[t, i] <- residual[t, i] + x[t, i], rounded once to the dtype: the add of add_rms_norm alone
// (a graph with fusions.add_rms_norm separate).
cudaError_t add_residual(DType dtype,
                         void* residual,  // [tokens, width]
                         const void* x,   // [tokens, width]
                         int tokens, int width, cudaStream_t stream);

std::string activation_unsupported(int tokens, int width);

}  // namespace tessera::kernels::cuda
