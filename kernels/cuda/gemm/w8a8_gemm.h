// kernels/cuda/gemm/w8a8_gemm.h: W8A8 GEMMs on Hopper's int8 and FP8 tensor cores, built from CUTLASS's
// sm90 warp-specialised GEMM: both operands int8 (or fp8_e4m3) with one fp32 scale per row, int32 (or
// fp32) accumulation, and the scales and bias applied in the epilogue, so y is written once in bf16.
//   y[i, j] = bf16(x_scales[i] · w_scales[j] · Σ_e x[i, e] · w[j, e] + bias[j])
// x [m, k] and w [n, k] row-major int8 (or e4m3); y [m, n] row-major bf16; bias bf16 [n] or null. k
// a multiple of 16 and n of 8, and x, w and y 16-byte aligned (the TMA's rows). Anything else, a
// build without sm_90a code, or a workspace smaller than the kernel asks for (int8's kernels ask for
// none; fp8's stream-K keeps the partial sums of split tiles there) is cudaErrorNotSupported, and the
// caller takes another path. Plain launches, so they can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tessera::kernels::cuda {

cudaError_t int8_rowwise_gemm(void* y, const int8_t* x, const float* x_scales, const int8_t* w, const float* w_scales,
                              const void* bias, int m, int n, int k, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);

// The same for fp8_e4m3 operands (fp32 sums) at m <= kFp8FewRows; other m is cudaErrorNotSupported
// (cuBLASLt's fp8 GEMM serves it, faster from 128 rows).
inline constexpr int kFp8FewRows = 64;
cudaError_t fp8_rowwise_gemm_few_rows(void* y, const void* x, const float* x_scales, const void* w,
                                      const float* w_scales, const void* bias, int m, int n, int k, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
