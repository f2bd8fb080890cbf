// kernels/cuda/gemm/gemv.h: the small-m path of y = x · Wᵀ (+ bias) (decode: m = 1..8), a
// weight-streaming kernel that GemmRunner::run dispatches to (gemm.cpp); cuBLASLt does the rest.
// Stateless and thread-safe; plain launches only, so it can be captured in a CUDA graph.
// Launched with programmatic dependent launch: the first weight loads are issued before waiting for
// the kernel just before in the stream, which therefore must not write `w` (weights are parameters).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

inline constexpr int kGemvMaxM = 8;

// What a row of x gets: kFastest runs m = 1 on the row-streaming kernel (gemv.cu) and more rows on the
// tensor-core kernel where that is faster, whose sums are not the row-streaming kernel's bits;
// kSameAtAnyM runs every m on the row-streaming kernel, whose rows never depend on the others, so
// that a row's output is the bits it gets alone at m = 1 on either setting (a speculative verify's
// rows against decoding without speculation). That costs 2-8 rows their tensor-core speed: at 8
// rows the row-streaming kernel reads 61-92% of copy bandwidth on the 7B shape's layers where the
// tensor-core one reads 91%.
enum class GemvRowBits { kFastest, kSameAtAnyM };

// Whether gemv() and gemv_silu_mul() run m rows of bf16 / fp16 weights on the tensor-core kernel.
bool gemv_takes_tensor_cores(int m, GemvRowBits row_bits);

// Whether gemv() takes this call: 1 <= m <= kGemvMaxM, k a multiple of 8 (16-byte rows), x and w
// 16-byte aligned. y and bias may have any (element) alignment.
bool gemv_supported(int m, int n, int k, const void* x, const void* w);

// y[m, n] <- x[m, k] · w[n, k]ᵀ + bias[n] (bias may be null), fp32 accumulation, rounded once.
// Only for calls gemv_supported() accepts; cudaErrorInvalidValue otherwise.
cudaError_t gemv(DType dtype, void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                 GemvRowBits row_bits, cudaStream_t stream);

// The gate-up projection and SiLU·mul in one pass (the epilogue of the same kernel): w holds the
// gate and up weights with their rows in pairs, row 2j gate row j and row 2j + 1 up row j ("pairs
// order", which the caller arranges at load); n = 2 · dim, even. out[i, j] <- silu(x[i] · w[2j]) ·
// (x[i] · w[2j + 1]), both dot products in fp32 and the result rounded once. Only for calls
// gemv_supported() accepts with an even n; cudaErrorInvalidValue otherwise.
cudaError_t gemv_silu_mul(DType dtype, void* out, const void* x, const void* w, int m, int n, int k,
                          GemvRowBits row_bits, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
