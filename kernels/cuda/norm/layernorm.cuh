// kernels/cuda/norm/layernorm.cuh: LayerNorm with an optional residual add (BERT), kernels then
// launchers. out <- ((x + residual) - mean) / sqrt(var + eps) * gamma + beta, fp32 statistics.
#pragma once

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/norm/residual_sum.cuh"

#include <type_traits>

namespace tessera::kernels::cuda {

inline constexpr int kLayerNormWarps = 4;    // rows per block of the register kernel
inline constexpr int kLayerNormMaxVecs = 4;  // 16-byte vectors a lane holds: hidden up to 32 * 8 * 4 = 1024

// One warp per row; each lane keeps its kVecs 16-byte vectors (8 values) of the row in registers, so
// the row is read once and written once, and the two statistics are warp reductions with no block
// barrier. A block of 768 threads per row, three passes and two block reductions moved about 0.5 TB/s
// on BERT-base's 16384 x 768 (H200, under ncu): a third of the encoder's time.
template <typename T, int kVecs, bool kResidual>
__global__ void __launch_bounds__(kLayerNormWarps * 32)
    layernorm_warp_kernel(T* out,                        // [tokens, hidden]
                          const T* x,                    // [tokens, hidden]; may alias out
                          const T* residual,             // [tokens, hidden] (kResidual)
                          const T* __restrict__ gamma,   // [hidden]
                          const T* __restrict__ beta,    // [hidden]
                          int tokens, int hidden, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kLayerNormWarps + (threadIdx.x >> 5);
  if (row >= tokens) return;
  const int num_vecs = hidden / 8;
  const uint4* x_row = reinterpret_cast<const uint4*>(x + row * hidden);
  const uint4* r_row = reinterpret_cast<const uint4*>(residual + (kResidual ? row * hidden : 0));
  // Every load of the row goes out before any value is used.
  uint4 x_raw[kVecs], r_raw[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = lane + 32 * i;
    if (v < num_vecs) {
      x_raw[i] = x_row[v];
      if constexpr (kResidual) r_raw[i] = r_row[v];
    }
  }
  float vals[kVecs][8];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    if (lane + 32 * i >= num_vecs) continue;
    if constexpr (kResidual) {  // the sum is rounded to T before it is normalised, as the scalar kernel does
      vec8_add_rounded<T>(x_raw[i], r_raw[i], vals[i]);
    } else {
      Vec8<T> a;
      a.raw = x_raw[i];
      vec8_to_float(a, vals[i]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += vals[i][j];
  }
  const float mean = warp_sum(sum) / static_cast<float>(hidden);
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    if (lane + 32 * i >= num_vecs) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) sq += (vals[i][j] - mean) * (vals[i][j] - mean);
  }
  const float inv_std = rsqrtf(warp_sum(sq) / static_cast<float>(hidden) + eps);
  uint4* out_row = reinterpret_cast<uint4*>(out + row * hidden);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = lane + 32 * i;
    if (v >= num_vecs) continue;
    Vec8<T> g, b;
    g.raw = __ldg(reinterpret_cast<const uint4*>(gamma) + v);
    b.raw = __ldg(reinterpret_cast<const uint4*>(beta) + v);
    float gf[8], bf[8];
    vec8_to_float(g, gf);
    vec8_to_float(b, bf);
#pragma unroll
    for (int j = 0; j < 8; ++j) vals[i][j] = (vals[i][j] - mean) * inv_std * gf[j] + bf[j];
    out_row[v] = float_to_vec8<T>(vals[i]).raw;
  }
}

// Any hidden size and alignment: one block per row, which reads the row three times (sum, centred sum
// of squares, output); after the first pass it comes from L1.
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
  const int vecs = (hidden / 8 + 31) / 32;
  if (hidden % 8 == 0 && vecs <= kLayerNormMaxVecs && is_aligned16(out) && is_aligned16(x) && is_aligned16(gamma) &&
      is_aligned16(beta) && (residual == nullptr || is_aligned16(residual))) {
    auto launch = [&](auto vecs_tag) {
      constexpr int kVecs = decltype(vecs_tag)::value;
      auto kernel = residual != nullptr ? layernorm_warp_kernel<T, kVecs, true> : layernorm_warp_kernel<T, kVecs, false>;
      kernel<<<(tokens + kLayerNormWarps - 1) / kLayerNormWarps, kLayerNormWarps * 32, 0, stream>>>(
          out, x, residual, gamma, beta, tokens, hidden, eps);
      return cudaGetLastError();
    };
    switch (vecs) {
      case 1: return launch(std::integral_constant<int, 1>{});
      case 2: return launch(std::integral_constant<int, 2>{});
      case 3: return launch(std::integral_constant<int, 3>{});
      default: return launch(std::integral_constant<int, kLayerNormMaxVecs>{});
    }
  }
  int threads = hidden >= 1024 ? 512 : ((hidden + 31) / 32) * 32;
  if (threads < 32) threads = 32;
  layernorm_kernel<T><<<tokens, threads, 0, stream>>>(out, x, residual, gamma, beta, hidden, eps);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
