// kernels/cuda/gemm/gemm.h: the dense GEMM of every linear layer, y = x · Wᵀ (+ bias), row-major,
// bf16/fp16 in and out, fp32 accumulation: m <= 8 through the GEMV kernels (gemv.h), the rest through
// cuBLASLt. run_fp8_rowwise() is the W8A8 form for fp8_e4m3 weights: both operands e4m3 with a
// scale per row, on Hopper's FP8 tensor cores. The GEMV kernels read w before waiting for the
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
  // null), with x [m, k] and w [n, k] row-major e4m3 (16-byte aligned, k a multiple of 16), fp32
  // accumulation. cuBLASLt's outer-vector scale mode applies both scale vectors in the GEMM's
  // epilogue, so the scales cost no pass of their own. cudaErrorNotSupported (remembered for the
  // shape) when cuBLASLt has no FP8 algorithm for it: the caller then takes a bf16 path.
  cudaError_t run_fp8_rowwise(void* y, const void* x, const float* x_scales, const void* w, const float* w_scales,
                              const void* bias, int m, int n, int k, cudaStream_t stream);

  // What the GEMV path (m <= 8) guarantees each row (gemv.h); kFastest until set.
  void set_gemv_row_bits(GemvRowBits row_bits) { gemv_row_bits_ = row_bits; }

  // The cuBLASLt status of the last failed call, for the error message above kernels/ ("" if none).
  const std::string& last_error() const { return last_error_; }

 private:
  struct Plan;
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
