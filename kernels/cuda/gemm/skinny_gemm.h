// kernels/cuda/gemm/skinny_gemm.h: y = x · Wᵀ (+ bias) at 9-64 rows of x (batched decode, short prompt
// chunks), a tensor-core kernel that streams W once from DRAM (skinny_gemm.cuh), which GemmRunner::run
// dispatches to between the GEMV (m <= 8) and cuBLASLt. Launched with programmatic dependent launch:
// the first weight loads go out before the previous kernel in the stream ends, so it must not write
// W (weights are parameters).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

inline constexpr int kSkinnyGemmMinM = 9, kSkinnyGemmMaxM = 64;

// Device memory a call may use when it splits k across blocks: fp32 partial sums, and counters that
// must be 0 before the first call (each call leaves them 0). One workspace per stream.
struct SkinnyGemmWorkspace {
  float* partials = nullptr;
  size_t partial_bytes = 0;
  int* counters = nullptr;
  int num_counters = 0;
  int num_sms = 0;  // the device's, which sizes the split
};

// Whether skinny_gemm() takes this call: kSkinnyGemmMinM <= m <= kSkinnyGemmMaxM, k a multiple of 8,
// x and w 16-byte aligned.
bool skinny_gemm_supported(int m, int n, int k, const void* x, const void* w);

// y[m, n] <- x[m, k] · w[n, k]ᵀ + bias[n] (bias may be null), fp32 accumulation, rounded once; the bits
// of a row depend on n, k and the device's SM count, not on the other rows. Only for calls
// skinny_gemm_supported() accepts; cudaErrorInvalidValue otherwise.
cudaError_t skinny_gemm(DType dtype, void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                        const SkinnyGemmWorkspace& workspace, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
