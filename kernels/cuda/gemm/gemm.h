// kernels/cuda/gemm/gemm.h: the dense GEMM of every linear layer, y = x · Wᵀ (+ bias), row-major,
// bf16/fp16 in and out, fp32 accumulation: m <= 8 through the GEMV kernels (gemv.h), the rest through
// cuBLASLt. run_w8a8() is the W8A8 form for int8 and fp8_e4m3 weights: both operands in the
// weight's format with a scale per row, on Hopper's int8 or FP8 tensor cores; run_int4_g128() the
// mixed-input form for int4_g128 weights. The GEMV kernels read w before waiting for the
// previous kernel in the stream (programmatic dependent launch), so that kernel must not write w
// (weights are parameters).
// Not thread-safe: one GemmRunner per stream/thread (it owns a handle, a workspace and a plan cache).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "kernels/cuda/common/dtype.h"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/quantized_weights.h"

namespace tessera::kernels::cuda {

class GemmRunner {
 public:
  GemmRunner();
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Creates the cuBLASLt handle and a device workspace once; every run() reuses both.
  cudaError_t init(size_t workspace_bytes = size_t{32} << 20);

  // y[m, n] <- x[m, k] · w[n, k]ᵀ + bias[n]. bias may be null. Plans (descriptors and the chosen
  // algorithm) are cached per (dtype, m, n, k, has_bias), so a decode loop plans once.
  cudaError_t run(DType dtype,
                  void* y,            // [m, n]
                  const void* x,      // [m, k]
                  const void* w,      // [n, k]
                  const void* bias,   // [n] or null
                  int m, int n, int k, cudaStream_t stream);

  // y[m, n] (bf16) <- (x_scales[i] · w_scales[j] · Σ_e x[i, e] · w[j, e]) + bias[j] (bf16, may be
  // null), with x [m, k] and w [n, k] row-major in `format` (int8 or e4m3, 16-byte aligned, k a
  // multiple of 16), exact int32 or fp32 accumulation. Both scale vectors are applied in the GEMM's
  // epilogue, so they cost no pass of their own: int8, and fp8 up to kFp8FewRows rows, through CUTLASS
  // (w8a8_gemm.h; cuBLASLt's int8 GEMM has no such scales), fp8 above through cuBLASLt's outer-vector
  // scale mode. cudaErrorNotSupported
  // when neither has a kernel for the shape (remembered by cuBLASLt's plan): the caller then takes a
  // bf16 path.
  cudaError_t run_w8a8(WeightFormat format, void* y, const void* x, const float* x_scales, const void* w,
                       const float* w_scales, const void* bias, int m, int n, int k, cudaStream_t stream);

  // y[m, n] (bf16) <- x[m, k] (bf16) · dequant(w)ᵀ + bias[j] (bf16, may be null) for an int4_g128
  // weight w of n x k (quantized_weights.h), on CUTLASS's mixed-input GEMM (int4_gemm.h), which
  // expands the nibbles in registers: no bf16 copy of w is written. cudaErrorNotSupported for shapes
  // it does not take (n not a multiple of 16, k not of 64): the caller then takes a bf16 path.
  cudaError_t run_int4_g128(void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                            cudaStream_t stream);

  // What the GEMV path (m <= 8) guarantees each row (gemv.h); kFastest until set.
  void set_gemv_row_bits(GemvRowBits row_bits) { gemv_row_bits_ = row_bits; }

  // The cuBLASLt status of the last failed call, for the error message above kernels/ ("" if none).
  const std::string& last_error() const { return last_error_; }

 private:
  struct Plan;
  // init() unless it has run.
  cudaError_t ensure_init();
  // A CUTLASS GEMM's status, passed on, with last_error() saying why it did not run: `kernel` names
  // it ("int8 tensor-core"), `needs` the shapes it takes.
  cudaError_t cutlass_status(cudaError_t e, const char* kernel, int m, int n, int k, const char* needs);
  cudaError_t run_fp8_rowwise(void* y, const void* x, const float* x_scales, const void* w, const float* w_scales,
                              const void* bias, int m, int n, int k, cudaStream_t stream);
  // Asks cuBLASLt's heuristic for the algorithm of a plan whose descriptors are set; false if none.
  bool choose_algorithm(Plan& plan);
  // y <- w-side A · x-side B as the plan says (alpha 1, beta 0); `what` names a failure in last_error().
  cudaError_t matmul(Plan& plan, void* y, const void* x, const void* w, const char* what, cudaStream_t stream);
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int, bool>, std::unique_ptr<Plan>> plans_;
  std::string last_error_;
  GemvRowBits gemv_row_bits_ = GemvRowBits::kFastest;
};

std::string gemm_unsupported(int m, int n, int k);

}  // namespace tessera::kernels::cuda
