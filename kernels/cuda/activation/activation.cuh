// kernels/cuda/activation/activation.cuh: SiLU-mul and bias+GELU kernels, then launchers. Both are
// pure streams: 16-byte vectors when the width and pointers allow, one element per thread otherwise.
#pragma once

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }
__device__ __forceinline__ float gelu_erf(float v) { return 0.5f * v * (1.f + erff(v * 0.7071067811865476f)); }

template <typename T, bool kVec>
__global__ void silu_mul_kernel(T* __restrict__ out,            // [tokens, inter]
                                const T* __restrict__ gate_up,  // [tokens, 2 * inter]
                                int inter) {
  const int64_t t = blockIdx.y;
  const T* gate = gate_up + t * 2 * inter;
  const T* up = gate + inter;
  T* o = out + t * inter;
  if constexpr (kVec) {
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v * 8 >= inter) return;
    Vec8<T> g, u;
    g.raw = reinterpret_cast<const uint4*>(gate)[v];
    u.raw = reinterpret_cast<const uint4*>(up)[v];
    float gf[8], uf[8];
    vec8_to_float(g, gf);
    vec8_to_float(u, uf);
#pragma unroll
    for (int j = 0; j < 8; ++j) gf[j] = silu(gf[j]) * uf[j];
    reinterpret_cast<uint4*>(o)[v] = float_to_vec8<T>(gf).raw;
  } else {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= inter) return;
    o[i] = from_float<T>(silu(to_float(gate[i])) * to_float(up[i]));
  }
}

// (gate, up) pairs: a 16-byte vector of the input holds 4 pairs, for 4 outputs (8 bytes).
template <typename T, bool kVec>
__global__ void silu_mul_pairs_kernel(T* __restrict__ out,            // [tokens, inter]
                                      const T* __restrict__ gate_up,  // [tokens, 2 * inter]
                                      int inter) {
  const int64_t t = blockIdx.y;
  const T* in = gate_up + t * 2 * inter;
  T* o = out + t * inter;
  if constexpr (kVec) {
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v * 4 >= inter) return;
    Vec8<T> a;
    a.raw = reinterpret_cast<const uint4*>(in)[v];
    float f[8];
    vec8_to_float(a, f);
    uint2 r;
    auto* pairs = reinterpret_cast<typename DTypeTraits<T>::pair*>(&r);
#pragma unroll
    for (int j = 0; j < 2; ++j)
      pairs[j] = DTypeTraits<T>::from_float2(silu(f[4 * j]) * f[4 * j + 1], silu(f[4 * j + 2]) * f[4 * j + 3]);
    reinterpret_cast<uint2*>(o)[v] = r;
  } else {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= inter) return;
    o[i] = from_float<T>(silu(to_float(in[2 * i])) * to_float(in[2 * i + 1]));
  }
}

template <typename T, bool kVec>
__global__ void bias_gelu_kernel(T* __restrict__ x,            // [tokens, width]
                                 const T* __restrict__ bias,   // [width] or null
                                 int width) {
  T* row = x + static_cast<int64_t>(blockIdx.y) * width;
  if constexpr (kVec) {
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v * 8 >= width) return;
    Vec8<T> a;
    a.raw = reinterpret_cast<uint4*>(row)[v];
    float f[8];
    vec8_to_float(a, f);
    if (bias != nullptr) {
      Vec8<T> b;
      b.raw = __ldg(reinterpret_cast<const uint4*>(bias) + v);
      float bf[8];
      vec8_to_float(b, bf);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] += bf[j];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = gelu_erf(f[j]);
    reinterpret_cast<uint4*>(row)[v] = float_to_vec8<T>(f).raw;
  } else {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    float v = to_float(row[i]);
    if (bias != nullptr) v += to_float(bias[i]);
    row[i] = from_float<T>(gelu_erf(v));
  }
}

template <typename T, bool kVec>
__global__ void add_residual_kernel(T* __restrict__ residual,  // [tokens, width]
                                    const T* __restrict__ x,   // [tokens, width]
                                    int width) {
  const int64_t offset = static_cast<int64_t>(blockIdx.y) * width;
  T* r = residual + offset;
  const T* a = x + offset;
  if constexpr (kVec) {
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v * 8 >= width) return;
    Vec8<T> rv, av;
    rv.raw = reinterpret_cast<const uint4*>(r)[v];
    av.raw = reinterpret_cast<const uint4*>(a)[v];
    float rf[8], af[8];
    vec8_to_float(rv, rf);
    vec8_to_float(av, af);
#pragma unroll
    for (int j = 0; j < 8; ++j) rf[j] += af[j];
    reinterpret_cast<uint4*>(r)[v] = float_to_vec8<T>(rf).raw;
  } else {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    r[i] = from_float<T>(to_float(r[i]) + to_float(a[i]));
  }
}

template <typename T>
cudaError_t launch_add_residual(T* residual, const T* x, int tokens, int width, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && is_aligned16(residual) && is_aligned16(x);
  const int items = vec ? width / 8 : width;
  const int threads = items >= 256 ? 256 : ((items + 31) / 32) * 32;
  const dim3 grid((items + threads - 1) / threads, tokens);
  if (vec) {
    add_residual_kernel<T, true><<<grid, threads, 0, stream>>>(residual, x, width);
  } else {
    add_residual_kernel<T, false><<<grid, threads, 0, stream>>>(residual, x, width);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_silu_mul(T* out, const T* gate_up, int tokens, int inter, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = inter % 8 == 0 && is_aligned16(out) && is_aligned16(gate_up);
  const int items = vec ? inter / 8 : inter;
  const int threads = items >= 256 ? 256 : ((items + 31) / 32) * 32;
  const dim3 grid((items + threads - 1) / threads, tokens);
  if (vec) {
    silu_mul_kernel<T, true><<<grid, threads, 0, stream>>>(out, gate_up, inter);
  } else {
    silu_mul_kernel<T, false><<<grid, threads, 0, stream>>>(out, gate_up, inter);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_silu_mul_pairs(T* out, const T* gate_up, int tokens, int inter, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = inter % 4 == 0 && is_aligned16(gate_up) && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int items = vec ? inter / 4 : inter;
  const int threads = items >= 256 ? 256 : ((items + 31) / 32) * 32;
  const dim3 grid((items + threads - 1) / threads, tokens);
  if (vec) {
    silu_mul_pairs_kernel<T, true><<<grid, threads, 0, stream>>>(out, gate_up, inter);
  } else {
    silu_mul_pairs_kernel<T, false><<<grid, threads, 0, stream>>>(out, gate_up, inter);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_bias_gelu(T* x, const T* bias, int tokens, int width, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && is_aligned16(x) && (bias == nullptr || is_aligned16(bias));
  const int items = vec ? width / 8 : width;
  const int threads = items >= 256 ? 256 : ((items + 31) / 32) * 32;
  const dim3 grid((items + threads - 1) / threads, tokens);
  if (vec) {
    bias_gelu_kernel<T, true><<<grid, threads, 0, stream>>>(x, bias, width);
  } else {
    bias_gelu_kernel<T, false><<<grid, threads, 0, stream>>>(x, bias, width);
  }
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
