// kernels/cuda/gemm/gemm.h: the dense GEMM of every linear layer, y = x · Wᵀ (+ bias), row-major,
// bf16/fp16 in and out, fp32 accumulation: m <= 8 through the GEMV kernels (gemv.h), 9-64 through the
// skinny GEMM (skinny_gemm.h), the rest through cuBLASLt. run_w8a8() is the W8A8 form for int8 and fp8_e4m3 weights: both operands in the
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
#include "kernels/cuda/gemm/skinny_gemm.h"

namespace tessera::kernels::cuda {

// Where run()'s w comes from: a parameter, which nothing in the stream writes, so the GEMV and skinny
// kernels start reading it before the previous kernel ends; or written by the kernel just before it
// (a dequantized copy), which only cuBLASLt reads.
enum class WeightSource { kParameter, kWrittenJustBefore };

class GemmRunner {
 public:
  GemmRunner();
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Creates the cuBLASLt handle, a device workspace (shared by cuBLASLt and the skinny GEMM's split
  // sums) and the skinny GEMM's counters once; every run() reuses them.
  cudaError_t init(size_t workspace_bytes = size_t{32} << 20);

  // y[m, n] <- x[m, k] · w[n, k]ᵀ + bias[n]. bias may be null. Plans (descriptors and the chosen
  // algorithm) are cached per (dtype, m, n, k, has_bias), so a decode loop plans once.
  cudaError_t run(DType dtype,
                  void* y,            // [m, n]
                  const void* x,      // [m, k]
                  const void* w,      // [n, k]
                  const void* bias,   // [n] or null
                  int m, int n, int k, cudaStream_t stream, WeightSource source = WeightSource::kParameter);

  // y[m, n] (bf16) <- (x_scales[i] · w_scales[j] · Σ_e x[i, e] · w[j, e]) + bias[j] (bf16, may be
  // null), with x [m, k] and w [n, k] row-major in `format` (int8 or e4m3, 16-byte aligned, k a
  // multiple of 16), exact int32 or fp32 accumulation. Both scale vectors are applied in the GEMM's
  // epilogue, so they cost no pass of their own: fp8 through cuBLASLt's outer-vector scale mode, int8
  // through CUTLASS (int8_gemm.h; cuBLASLt's int8 GEMM has no such scales). cudaErrorNotSupported
  // when neither has a kernel for the shape (remembered by cuBLASLt's plan): the caller then takes a
  // bf16 path.
  cudaError_t run_w8a8(WeightFormat format, void* y, const void* x, const float* x_scales, const void* w,
                       const float* w_scales, const void* bias, int m, int n, int k, cudaStream_t stream);

  // y[m, n] (bf16) <- x[m, k] (bf16) · dequant(w)ᵀ + bias[j] (bf16, may be null) for an int8 or
  // fp8_e4m3 weight at 9-64 rows, on the skinny GEMM: weight-only, its values expanded in registers
  // and x left in bf16, which streams the weight faster than quantizing x for run_w8a8 at these
  // rows. cudaErrorNotSupported where it does not apply (other m, int4_g128, the skinny GEMM off):
  // the caller then takes run_w8a8.
  cudaError_t run_weight_only(WeightFormat format, void* y, const void* x, const void* w, const void* bias, int m,
                              int n, int k, cudaStream_t stream);

  // y[m, n] (bf16) <- x[m, k] (bf16) · dequant(w)ᵀ + bias[j] (bf16, may be null) for an int4_g128
  // weight w of n x k (quantized_weights.h), on CUTLASS's mixed-input GEMM (int4_gemm.h), which
  // expands the nibbles in registers: no bf16 copy of w is written. cudaErrorNotSupported for shapes
  // it does not take (n not a multiple of 16, k not of 64): the caller then takes a bf16 path.
  cudaError_t run_int4_g128(void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                            cudaStream_t stream);

  // What the GEMV path (m <= 8) guarantees each row (gemv.h); kFastest until set.
  void set_gemv_row_bits(GemvRowBits row_bits) { gemv_row_bits_ = row_bits; }
  // Off: run() sends 9-64 rows to cuBLASLt too (the benchmark's peer). On until set.
  void set_skinny_gemm(bool enabled) { skinny_gemm_ = enabled; }

  // The cuBLASLt status of the last failed call, for the error message above kernels/ ("" if none).
  const std::string& last_error() const { return last_error_; }

 private:
  struct Plan;
  // init() unless it has run.
  cudaError_t ensure_init();
  // The skinny GEMM's counters (zeroed), SM count and share of the workspace.
  cudaError_t init_skinny_workspace();
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
  SkinnyGemmWorkspace skinny_workspace_;
  bool skinny_gemm_ = true;
  std::map<std::tuple<int, int, int, int, bool>, std::unique_ptr<Plan>> plans_;
  std::string last_error_;
  GemvRowBits gemv_row_bits_ = GemvRowBits::kFastest;
};

std::string gemm_unsupported(int m, int n, int k);

}  // namespace tessera::kernels::cuda
