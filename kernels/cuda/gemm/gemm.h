// kernels/cuda/gemm/gemm.h: the dense GEMM of every linear layer, y = x · Wᵀ (+ bias), row-major,
// bf16/fp16 in and out, fp32 accumulation: m <= 8 through the GEMV kernel (gemv.h), the rest through
// cuBLASLt. The GEMV kernel reads w before waiting for the previous kernel in the stream (programmatic
// dependent launch), so that kernel must not write w (weights are parameters).
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

  // W8A8 on the FP8 tensor cores: y[m, n] (bf16) <- (x_q[m, k] · x_scale[m]) · (w_q[n, k] · w_scale[n])ᵀ
  // + bias[n], where x_q and w_q are e4m3 with one fp32 scale per row (cuBLASLt's outer-vector
  // scaling), accumulated in fp32. k a multiple of 16, every pointer 16-byte aligned. Plans are cached
  // like run()'s. cudaErrorNotSupported when cuBLASLt offers no FP8 algorithm for the shape (the
  // caller falls back to bf16); last_error() says why.
  cudaError_t run_fp8(void* y, const void* x_q, const float* x_scale, const void* w_q, const float* w_scale,
                      const void* bias, int m, int n, int k, cudaStream_t stream);

  // The cuBLASLt status of the last failed call, for the error message above kernels/ ("" if none).
  const std::string& last_error() const { return last_error_; }

 private:
  struct Plan;
  // Asks cuBLASLt's heuristic for the plan's algorithm, its descriptors set; false when it has none.
  bool choose_algorithm(Plan& plan);
  static constexpr int kFp8PlanTag = -1;  // the dtype slot of a run_fp8 plan's cache key
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int, bool>, std::unique_ptr<Plan>> plans_;
  std::string last_error_;
};

std::string gemm_unsupported(int m, int n, int k);

}  // namespace tessera::kernels::cuda
