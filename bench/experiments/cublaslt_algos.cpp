// bench/experiments/cublaslt_algos.cpp: every algorithm cuBLASLt's heuristic offers for y = x · Wᵀ + bias
// (fp16, the GemmRunner's TN layout and bias epilogue), each timed on the GPU, as JSON lines. It asks
// whether the heuristic's first choice, which GemmRunner takes, is the fastest at few rows (BERT at one
// text of 128 tokens, and the 7B shape's prefill chunks), where a GEMM is launch- and latency-bound.
// Each algorithm runs 20 times in one captured graph, replayed 50 times: the GPU's time alone.
//   build: g++ -O2 -std=c++20 -I/usr/local/cuda/include bench/experiments/cublaslt_algos.cpp
//            -L/usr/local/cuda/lib64 -lcublasLt -lcudart -o cublaslt_algos
//   run:   cublaslt_algos [m ...]   (default 128)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                             \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)
#define CHECK_LT(x)                                                                    \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cublasLtGetStatusString(s_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Shape {
  const char* name;
  int n, k;
};

constexpr Shape kShapes[] = {
    {"bert_qkv", 2304, 768}, {"bert_attn_out", 768, 768}, {"bert_inter", 3072, 768}, {"bert_out", 768, 3072},
    {"7b_qkv", 12288, 4096}, {"7b_o", 4096, 4096},        {"7b_gate_up", 22016, 4096}, {"7b_down", 4096, 11008},
};

// Microseconds per GEMM of `algo`, or -1 when it fails to run.
double time_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                 cublasLtMatrixLayout_t c, const cublasLtMatmulAlgo_t& algo, const void* w, const void* x, void* y,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const float alpha = 1.f, beta = 0.f;
  if (cublasLtMatmul(lt, desc, &alpha, w, a, x, b, &beta, y, c, y, c, &algo, workspace, workspace_bytes, stream) !=
      CUBLAS_STATUS_SUCCESS)
    return -1;
  CHECK_CUDA(cudaStreamSynchronize(stream));
  constexpr int kPerGraph = 20, kReplays = 50;
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kPerGraph; ++i) {
    cublasLtMatmul(lt, desc, &alpha, w, a, x, b, &beta, y, c, y, c, &algo, workspace, workspace_bytes, stream);
  }
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  for (int r = 0; r < kReplays; ++r) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / (kPerGraph * kReplays);
}

void sweep(cublasLtHandle_t lt, int m, const Shape& s, cudaStream_t stream) {
  const size_t workspace_bytes = 32u << 20;  // GemmRunner's default is set by its caller; 32 MiB covers it
  void *w, *x, *y, *bias, *workspace;
  CHECK_CUDA(cudaMalloc(&w, size_t(s.n) * s.k * 2));
  CHECK_CUDA(cudaMalloc(&x, size_t(m) * s.k * 2));
  CHECK_CUDA(cudaMalloc(&y, size_t(m) * s.n * 2));
  CHECK_CUDA(cudaMalloc(&bias, size_t(s.n) * 2));
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_CUDA(cudaMemset(w, 0, size_t(s.n) * s.k * 2));
  CHECK_CUDA(cudaMemset(x, 0, size_t(m) * s.k * 2));
  CHECK_CUDA(cudaMemset(bias, 0, size_t(s.n) * 2));
  cublasLtMatmulDesc_t desc;
  CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  cublasLtMatrixLayout_t a, b, c;
  CHECK_LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, s.k, s.n, s.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, s.k, m, s.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&c, CUDA_R_16F, s.n, m, s.n));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof(workspace_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(32);
  int found = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, static_cast<int>(results.size()),
                                          results.data(), &found));
  double first = -1, best = 1e30;
  int best_at = -1;
  for (int i = 0; i < found; ++i) {
    const double us = time_algo(lt, desc, a, b, c, results[i].algo, w, x, y, workspace, workspace_bytes, stream);
    if (i == 0) first = us;
    if (us > 0 && us < best) {
      best = us;
      best_at = i;
    }
    int tile = 0, splitk = 0, stages = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                         &got);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages),
                                         &got);
    std::printf("{\"bench\": \"cublaslt_algos\", \"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"rank\": %d, "
                "\"tile_id\": %d, \"splitk\": %d, \"stages_id\": %d, \"workspace\": %zu, \"us\": %.3f}\n",
                s.name, m, s.n, s.k, i, tile, splitk, stages, results[i].workspaceSize, us);
  }
  std::printf("{\"bench\": \"cublaslt_algos_summary\", \"shape\": \"%s\", \"m\": %d, \"algos\": %d, "
              "\"first_us\": %.3f, \"best_us\": %.3f, \"best_rank\": %d, \"first_over_best\": %.3f}\n",
              s.name, m, found, first, best, best_at, first / best);
  std::fflush(stdout);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(desc);
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaFree(bias);
  cudaFree(workspace);
}

int main(int argc, char** argv) {
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {128};
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int m : ms) {
    for (const Shape& s : kShapes) sweep(lt, m, s, stream);
  }
  return 0;
}
