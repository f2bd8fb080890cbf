// kernels/cuda/norm/layernorm.cuh: LayerNorm with an optional residual add (BERT), kernels then
// launchers. out <- ((x + residual) - mean) / sqrt(var + eps) * gamma + beta, fp32 statistics.
#pragma once

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

// One block per row. The row is read three times (sum, centred sum of squares, output); hidden
// sizes of encoders (384..1024) keep it in L1, so only the first pass reaches device memory.
template <typename T>
__global__ void layernorm_kernel(T* out,                        // [tokens, hidden]
                                 const T* x,                    // [tokens, hidden]
                                 const T* residual,             // [tokens, hidden] or null
                                 const T* __restrict__ gamma,   // [hidden]
                                 const T* __restrict__ beta,    // [hidden]
                                 int hidden, float eps) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  auto value = [&](int i) {
    float v = to_float(x[base + i]);
    if (residual != nullptr) v = to_float(from_float<T>(v + to_float(residual[base + i])));
    return v;
  };
  float sum = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) sum += value(i);
  const float mean = block_sum(sum, scratch) / static_cast<float>(hidden);
  float sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float d = value(i) - mean;
    sq += d * d;
  }
  const float inv_std = rsqrtf(block_sum(sq, scratch) / static_cast<float>(hidden) + eps);
  // Every thread has read all it needs (block_sum's barriers) before anyone overwrites an aliased x.
  __syncthreads();
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = (value(i) - mean) * inv_std;
    out[base + i] = from_float<T>(v * to_float(gamma[i]) + to_float(beta[i]));
  }
}

template <typename T>
cudaError_t launch_layernorm(T* out, const T* x, const T* residual, const T* gamma, const T* beta, int tokens,
                             int hidden, float eps, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  int threads = hidden >= 1024 ? 512 : ((hidden + 31) / 32) * 32;
  if (threads < 32) threads = 32;
  layernorm_kernel<T><<<tokens, threads, 0, stream>>>(out, x, residual, gamma, beta, hidden, eps);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
