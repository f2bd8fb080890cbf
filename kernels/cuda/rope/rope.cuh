// kernels/cuda/rope/rope.cuh: rotary embedding kernels, then launchers.
#pragma once

#include <cmath>

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/rope/rope.h"

namespace tessera::kernels::cuda {

__host__ __device__ inline float rope_inv_freq_impl(const RopeParams& p, int head_dim, int i) {
  float inv = 1.f / powf(p.theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  if (p.scaling == RopeScaling::kLlama3) {
    const float two_pi = 6.283185307179586f;
    const float wavelen = two_pi / inv;
    const float low_freq_wavelen = static_cast<float>(p.original_max_position) / p.low_freq_factor;
    const float high_freq_wavelen = static_cast<float>(p.original_max_position) / p.high_freq_factor;
    if (wavelen > low_freq_wavelen) {
      inv = inv / p.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const float smooth = (static_cast<float>(p.original_max_position) / wavelen - p.low_freq_factor) /
                           (p.high_freq_factor - p.low_freq_factor);
      inv = (1.f - smooth) * inv / p.factor + smooth * inv;
    }
  }
  return inv;
}

// One block per token. The frequencies are computed once per block into shared memory; each thread
// then rotates (head, pair) items of Q and K.
template <typename T>
__global__ void rope_kernel(T* q,                              // [tokens, q_stride]
                            T* k,                              // [tokens, k_stride]
                            const int32_t* __restrict__ positions,  // [tokens]
                            int num_heads, int num_kv_heads, int head_dim, int64_t q_stride, int64_t k_stride,
                            RopeParams params) {
  extern __shared__ float cos_sin[];  // [head_dim/2][2]
  const int half = head_dim / 2;
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * rope_inv_freq_impl(params, head_dim, i), &s, &c);
    cos_sin[2 * i] = c;
    cos_sin[2 * i + 1] = s;
  }
  __syncthreads();
  const int q_items = num_heads * half;
  const int total = (num_heads + num_kv_heads) * half;
  for (int item = threadIdx.x; item < total; item += blockDim.x) {
    const bool is_q = item < q_items;
    const int local = is_q ? item : item - q_items;
    const int head = local / half;
    const int i = local - head * half;
    T* row = is_q ? q + t * q_stride : k + t * k_stride;
    T* a = row + head * head_dim + i;
    T* b = a + half;
    const float x1 = to_float(*a);
    const float x2 = to_float(*b);
    const float c = cos_sin[2 * i];
    const float s = cos_sin[2 * i + 1];
    *a = from_float<T>(x1 * c - x2 * s);
    *b = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T>
cudaError_t launch_rope(T* q, T* k, const int32_t* positions, int tokens, int num_heads, int num_kv_heads,
                        int head_dim, int64_t q_stride, int64_t k_stride, const RopeParams& params,
                        cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int total = (num_heads + num_kv_heads) * head_dim / 2;
  const int threads = total >= 512 ? 512 : ((total + 31) / 32) * 32;
  const size_t smem = static_cast<size_t>(head_dim) * sizeof(float);
  rope_kernel<T><<<tokens, threads, smem, stream>>>(q, k, positions, num_heads, num_kv_heads, head_dim, q_stride,
                                                    k_stride, params);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
