// kernels/cuda/gemm/gemm.cpp: cuBLASLt plans for y = x · Wᵀ (+ bias).
//
// Row-major y[m,n] is column-major yᵀ[n,m]; yᵀ = W · xᵀ, where the row-major W[n,k] buffer read as
// column-major is Wᵀ[k,n] (so op A = transpose) and row-major x[m,k] is column-major xᵀ[k,m]
// (op B = none). The bias epilogue then adds bias[n] along the rows of the column-major result.
// That is the "TN" form cuBLASLt's FP8 kernels require, so the W8A8 GEMM maps the same way: A is the
// e4m3 weight (its scale vector has cuBLAS's M = n entries, one per output channel) and B the e4m3
// activations (N = m entries, one per row). int8 W8A8, fp8 W8A8 at few rows and the int4_g128
// mixed-input GEMM are CUTLASS's (w8a8_gemm.h, int4_gemm.h).
#include "kernels/cuda/gemm/gemm.h"

#include <cublasLt.h>

#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/int4_gemm.h"
#include "kernels/cuda/gemm/w8a8_gemm.h"

namespace tessera::kernels::cuda {

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool supported = true;  // false: cuBLASLt found no algorithm (kept, so the search is not repeated)
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

GemmRunner::GemmRunner() = default;

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

std::string gemm_unsupported(int m, int n, int k) {
  if (m < 0 || n <= 0 || k <= 0)
    return "gemm needs m >= 0, n > 0, k > 0, got m=" + std::to_string(m) + " n=" + std::to_string(n) +
           " k=" + std::to_string(k);
  return "";
}

cudaError_t GemmRunner::init(size_t workspace_bytes) {
  if (handle_ != nullptr) return cudaSuccess;
  cublasLtHandle_t handle = nullptr;
  if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    last_error_ = "cublasLtCreate failed";
    return cudaErrorUnknown;
  }
  handle_ = handle;
  workspace_bytes_ = workspace_bytes;
  if (workspace_bytes_ > 0) return cudaMalloc(&workspace_, workspace_bytes_);
  return cudaSuccess;
}

cudaError_t GemmRunner::run(DType dtype, void* y, const void* x, const void* w, const void* bias, int m, int n,
                            int k, cudaStream_t stream) {
  if (!gemm_unsupported(m, n, k).empty()) {
    last_error_ = gemm_unsupported(m, n, k);
    return cudaErrorInvalidValue;
  }
  if (dtype != DType::kBF16 && dtype != DType::kFP16) {
    last_error_ = "unsupported gemm dtype: " + std::to_string(static_cast<int>(dtype));
    return cudaErrorInvalidValue;
  }
  if (m == 0) return cudaSuccess;
  // The one dispatch point: m <= 8 (decode) streams w through the GEMV kernel (cuBLASLt's m = 1
  // kernels reach ~75% of copy bandwidth on the H100; the GEMV kernel is built to stream w at copy
  // bandwidth); larger m, k not a multiple of 8, or x / w not 16-byte aligned go to cuBLASLt.
  if (gemv_supported(m, n, k, x, w)) {
    const cudaError_t err = gemv(dtype, y, x, w, bias, m, n, k, gemv_row_bits_, stream);
    if (err != cudaSuccess) last_error_ = std::string("gemv launch failed: ") + cudaGetErrorString(err);
    return err;
  }
  if (const cudaError_t err = ensure_init(); err != cudaSuccess) return err;
  const auto key = std::make_tuple(static_cast<int>(dtype), m, n, k, bias != nullptr);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto plan = std::make_unique<Plan>();
    const cudaDataType_t type = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    bool ok = cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    ok = ok && cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)) ==
                   CUBLAS_STATUS_SUCCESS;
    if (bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      ok = ok && cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS;
    }
    ok = ok && cublasLtMatrixLayoutCreate(&plan->a, type, k, n, k) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&plan->b, type, k, m, k) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&plan->c, type, n, m, n) == CUBLAS_STATUS_SUCCESS;
    ok = ok && choose_algorithm(*plan);
    if (!ok) {
      last_error_ = "cuBLASLt found no algorithm for m=" + std::to_string(m) + " n=" + std::to_string(n) +
                    " k=" + std::to_string(k) + " dtype=" + dtype_name(dtype);
      return cudaErrorNotSupported;
    }
    it = plans_.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *it->second;
  if (bias != nullptr &&
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) !=
          CUBLAS_STATUS_SUCCESS) {
    last_error_ = "cuBLASLt rejected the bias pointer";
    return cudaErrorInvalidValue;
  }
  return matmul(plan, y, x, w, "cublasLtMatmul", stream);
}

namespace {
// The plan cache's dtype slot for the W8A8 GEMM (no DType value).
constexpr int kFp8RowwiseTag = -1;
}  // namespace

cudaError_t GemmRunner::run_w8a8(WeightFormat format, void* y, const void* x, const float* x_scales, const void* w,
                                 const float* w_scales, const void* bias, int m, int n, int k, cudaStream_t stream) {
  const char* name = weight_format_name(format);
  if (!gemm_unsupported(m, n, k).empty() || k % 16 != 0 || format == WeightFormat::kInt4G128) {
    last_error_ = std::string("W8A8 gemm needs int8 or fp8_e4m3, m >= 0, n > 0 and k a positive multiple of 16, got ") +
                  name + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
    return cudaErrorInvalidValue;
  }
  if (m == 0) return cudaSuccess;
  if (const cudaError_t err = ensure_init(); err != cudaSuccess) return err;
  if (format == WeightFormat::kFp8E4M3) {
    // Up to kFp8FewRows rows CUTLASS's kernel with the weight on the MMA's M side and stream-K, which
    // streams the weight faster than cuBLASLt's one fp8 algorithm with outer-vector scales there.
    const cudaError_t err = fp8_rowwise_gemm_few_rows(y, x, x_scales, w, w_scales, bias, m, n, k, workspace_,
                                                      workspace_bytes_, stream);
    if (err != cudaErrorNotSupported)
      return cutlass_status(err, "fp8 tensor-core", m, n, k, "n must be a multiple of 8");
    return run_fp8_rowwise(y, x, x_scales, w, w_scales, bias, m, n, k, stream);
  }
  return cutlass_status(int8_rowwise_gemm(y, static_cast<const int8_t*>(x), x_scales, static_cast<const int8_t*>(w),
                                           w_scales, bias, m, n, k, workspace_, workspace_bytes_, stream),
                        "int8 tensor-core", m, n, k, "n must be a multiple of 8");
}

cudaError_t GemmRunner::run_int4_g128(void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                                      cudaStream_t stream) {
  if (!gemm_unsupported(m, n, k).empty() || quantized_weight_bytes(WeightFormat::kInt4G128, n, k) == 0) {
    last_error_ = "int4_g128 gemm needs m >= 0, n > 0 and k a positive multiple of 32, got m=" + std::to_string(m) +
                  " n=" + std::to_string(n) + " k=" + std::to_string(k);
    return cudaErrorInvalidValue;
  }
  if (m == 0) return cudaSuccess;
  if (const cudaError_t err = ensure_init(); err != cudaSuccess) return err;
  const Int4G128Parts parts = int4_g128_parts(w, n, k);
  return cutlass_status(int4_g128_gemm(y, x, parts.data, parts.scales, parts.mins, bias, m, n, k, workspace_,
                                        workspace_bytes_, stream),
                        "int4_g128 mixed-input", m, n, k, "n must be a multiple of 16 and k of 64");
}

cudaError_t GemmRunner::ensure_init() { return handle_ != nullptr ? cudaSuccess : init(); }

cudaError_t GemmRunner::cutlass_status(cudaError_t e, const char* kernel, int m, int n, int k, const char* needs) {
  if (e == cudaErrorNotSupported) {
    last_error_ = std::string("no ") + kernel + " kernel for m=" + std::to_string(m) + " n=" + std::to_string(n) +
                  " k=" + std::to_string(k) + " (" + needs + ", operands 16-byte aligned)";
  } else if (e != cudaSuccess) {
    last_error_ = std::string(kernel) + " gemm launch failed: " + cudaGetErrorString(e);
  }
  return e;
}

cudaError_t GemmRunner::run_fp8_rowwise(void* y, const void* x, const float* x_scales, const void* w,
                                        const float* w_scales, const void* bias, int m, int n, int k,
                                        cudaStream_t stream) {
  const auto key = std::make_tuple(kFp8RowwiseTag, m, n, k, bias != nullptr);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto plan = std::make_unique<Plan>();
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
      return cublasLtMatmulDescSetAttribute(plan->desc, attr, value, size) == CUBLAS_STATUS_SUCCESS;
    };
    bool ok = cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    ok = ok && set(CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a));
    ok = ok && set(CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    ok = ok && set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer));
    ok = ok && set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer));
    ok = ok && set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales));
    ok = ok && set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales));
    if (bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const int32_t bias_type = CUDA_R_16BF;
      ok = ok && set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
      ok = ok && set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
      ok = ok && set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    }
    ok = ok && cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, k, n, k) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, k, m, k) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, n, m, n) == CUBLAS_STATUS_SUCCESS;
    plan->supported = ok && choose_algorithm(*plan);
    it = plans_.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *it->second;
  if (!plan.supported) {
    last_error_ = "cuBLASLt found no fp8 (e4m3, outer-vector scales) algorithm for m=" + std::to_string(m) +
                  " n=" + std::to_string(n) + " k=" + std::to_string(k);
    return cudaErrorNotSupported;
  }
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    return cublasLtMatmulDescSetAttribute(plan.desc, attr, value, size) == CUBLAS_STATUS_SUCCESS;
  };
  if (!set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)) ||
      !set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)) ||
      (bias != nullptr && !set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)))) {
    last_error_ = "cuBLASLt rejected a scale or bias pointer";
    return cudaErrorInvalidValue;
  }
  return matmul(plan, y, x, w, "cublasLtMatmul (fp8)", stream);
}

cudaError_t GemmRunner::matmul(Plan& plan, void* y, const void* x, const void* w, const char* what,
                               cudaStream_t stream) {
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t status =
      cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.desc, &alpha, w, plan.a, x, plan.b, &beta, y,
                     plan.c, y, plan.c, &plan.algo, workspace_, workspace_bytes_, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    last_error_ = std::string(what) + " failed: " + cublasLtGetStatusString(status);
    return cudaErrorUnknown;
  }
  return cudaSuccess;
}

bool GemmRunner::choose_algorithm(Plan& plan) {
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                  sizeof(workspace_bytes_)) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan.desc, plan.a, plan.b, plan.c,
                                            plan.c, pref, 1, &result, &found) == CUBLAS_STATUS_SUCCESS &&
       found > 0;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (ok) plan.algo = result.algo;
  return ok;
}

}  // namespace tessera::kernels::cuda
