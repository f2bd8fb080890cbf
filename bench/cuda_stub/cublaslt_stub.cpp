// bench/cuda_stub/cublaslt_stub.cpp: the libcublasLt.so.13 half of the CUDA stub (cudart_stub.cpp
// says what the stub is for). A library of its own, because the binary's versioned cuBLASLt symbols
// bind only to a library of that name; it counts and traces through the cudart stub. The heuristic
// always offers one algorithm, and a matmul's trace line names its shape (k, n, m as GemmRunner
// lays them out).
#include <cublasLt.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" int tessera_stub_counter_slot(const char* name);
extern "C" void tessera_stub_count(int slot);
extern "C" bool tessera_stub_tracing();
extern "C" void tessera_stub_trace(const char* line);

#define TESSERA_STUB_COUNT()                                               \
  do {                                                                     \
    static const int stub_slot = tessera_stub_counter_slot(__func__);      \
    tessera_stub_count(stub_slot);                                         \
  } while (0)

namespace {

struct Layout {
  uint64_t rows, cols;
  int64_t ld;
};

// Descriptors and preferences are opaque to the caller: any distinct allocation will do.
template <typename T>
T opaque() {
  return reinterpret_cast<T>(std::calloc(1, 64));
}

int g_handle;

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(&g_handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasLtGetStatusString(cublasStatus_t) { return "cuBLASLt stub"; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t, cudaDataType_t) {
  TESSERA_STUB_COUNT();
  *desc = opaque<cublasLtMatmulDesc_t>();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  std::free(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*,
                                              size_t) {
  TESSERA_STUB_COUNT();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  auto* l = static_cast<Layout*>(std::calloc(1, sizeof(Layout)));
  *l = {rows, cols, ld};
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  std::free(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = opaque<cublasLtMatmulPreference_t>();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  std::free(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* returned) {
  TESSERA_STUB_COUNT();
  std::memset(results, 0, sizeof(*results) * static_cast<size_t>(requested));
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                              cublasLtMatrixLayout_t a, const void*, cublasLtMatrixLayout_t b, const void*, const void*,
                              cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*,
                              size_t workspace_bytes, cudaStream_t) {
  TESSERA_STUB_COUNT();
  if (!tessera_stub_tracing()) return CUBLAS_STATUS_SUCCESS;
  const auto* la = reinterpret_cast<const Layout*>(a);
  const auto* lb = reinterpret_cast<const Layout*>(b);
  const std::string line = "matmul k " + std::to_string(la->rows) + " n " + std::to_string(la->cols) + " m " +
                           std::to_string(lb->cols) + " workspace " + std::to_string(workspace_bytes);
  tessera_stub_trace(line.c_str());
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
