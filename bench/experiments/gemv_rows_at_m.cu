// bench/experiments/gemv_rows_at_m.cu: the row-streaming GEMV (GemvRowBits::kSameAtAnyM, the kernel a
// speculating server runs) at m = 1..8 on the Llama-2-7B and SmolLM2-135M layer shapes, as JSON lines:
// microseconds a launch, launched back to back with programmatic dependent launch (each waits for the
// one before, as in a decode graph) over enough copies of the weight to miss L2, and how many outputs
// of the m rows differ in their bits from each row computed alone at m = 1 (must be 0).
// An experiment: built by hand against a source tree's gemv.cu, so two trees can be timed side by side:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I<tree> -o gemv_rows_at_m bench/experiments/gemv_rows_at_m.cu
//   ./gemv_rows_at_m LABEL
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/gemm/gemv.cu"

namespace kc = tessera::kernels::cuda;

#define CHECK_CUDA(call)                                                                 \
  do {                                                                                   \
    const cudaError_t status = (call);                                                   \
    if (status != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(status), __LINE__); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

struct Shape {
  const char* name;
  int n, k;
  bool silu_mul;
};

int main(int argc, char** argv) {
  const char* label = argc > 1 ? argv[1] : "";
  const Shape shapes[] = {{"7b_qkv", 12288, 4096, false}, {"7b_o", 4096, 4096, false},
                          {"7b_gate_up", 22016, 4096, true}, {"7b_down", 4096, 11008, false},
                          {"7b_lm_head", 32000, 4096, false}, {"smollm2_qkv", 960, 576, false},
                          {"smollm2_o", 576, 576, false}, {"smollm2_gate_up", 3072, 576, true},
                          {"smollm2_down", 576, 1536, false}, {"smollm2_lm_head", 49152, 576, false}};
  constexpr int kMaxK = 11008;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  __nv_bfloat16* x;
  CHECK_CUDA(cudaMalloc(&x, size_t{kc::kGemvMaxM} * kMaxK * 2));
  fill_random<<<64, 256>>>(x, size_t{kc::kGemvMaxM} * kMaxK, 7);
  for (const Shape& s : shapes) {
    const size_t weight_bytes = size_t{2} * s.n * s.k;
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / weight_bytes));
    __nv_bfloat16 *w, *y, *y_alone;
    CHECK_CUDA(cudaMalloc(&w, weight_bytes * copies));
    fill_random<<<1024, 256>>>(w, weight_bytes / 2 * copies, 11);
    const int cols = s.silu_mul ? s.n / 2 : s.n;
    CHECK_CUDA(cudaMalloc(&y, size_t{2} * kc::kGemvMaxM * cols));
    CHECK_CUDA(cudaMalloc(&y_alone, size_t{2} * kc::kGemvMaxM * cols));
    auto run = [&](int m, const __nv_bfloat16* in, __nv_bfloat16* out, const __nv_bfloat16* weight) {
      return s.silu_mul ? kc::gemv_silu_mul(kc::DType::kBF16, out, in, weight, m, s.n, s.k,
                                            kc::GemvRowBits::kSameAtAnyM, stream)
                        : kc::gemv(kc::DType::kBF16, out, in, weight, nullptr, m, s.n, s.k,
                                   kc::GemvRowBits::kSameAtAnyM, stream);
    };
    for (int row = 0; row < kc::kGemvMaxM; ++row)
      CHECK_CUDA(run(1, x + size_t{1} * row * s.k, y_alone + size_t{1} * row * cols, w));
    std::vector<uint16_t> alone(size_t{kc::kGemvMaxM} * cols), together(alone.size());
    CHECK_CUDA(cudaMemcpyAsync(alone.data(), y_alone, alone.size() * 2, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (int m = 1; m <= kc::kGemvMaxM; ++m) {
      CHECK_CUDA(run(m, x, y, w));
      CHECK_CUDA(cudaMemcpyAsync(together.data(), y, size_t{2} * m * cols, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      int differ = 0;
      for (size_t i = 0; i < size_t{1} * m * cols; ++i) differ += together[i] != alone[i];
      const int launches = std::max(copies * 4, 64);
      float best_us = 1e30f;
      for (int rep = 0; rep < 5; ++rep) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        for (int i = 0; i < launches; ++i) CHECK_CUDA(run(m, x, y, w + weight_bytes / 2 * (i % copies)));
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        best_us = std::min(best_us, ms * 1000 / launches);
      }
      std::printf("{\"label\":\"%s\",\"shape\":\"%s\",\"m\":%d,\"us\":%.2f,\"GBps\":%.0f,\"bits_differ\":%d}\n", label,
                  s.name, m, best_us, weight_bytes / (best_us * 1e-6) / 1e9, differ);
    }
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaFree(y_alone));
  }
  return 0;
}
