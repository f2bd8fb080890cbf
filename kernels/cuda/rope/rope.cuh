// kernels/cuda/rope/rope.cuh: rotary embedding kernels, then launchers.
#pragma once

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/rope/rope.h"

namespace tessera::kernels::cuda {

// One pair (x1, x2) = (x[i], x[i + half]) rotated by the angle with cosine c and sine s, in fp32:
// (x1·c − x2·s, x2·c + x1·s), each an FMA over one rounded product. Spelled out with the rounding
// intrinsics (never contracted differently) so that every kernel that rotates, rope_kernel and
// kv_cache_append_rope (kv_cache/kv_cache.cuh), gives bit-identical results.
__device__ __forceinline__ float2 rope_rotate(float x1, float x2, float c, float s) {
  return make_float2(__fmaf_rn(x1, c, -__fmul_rn(x2, s)), __fmaf_rn(x2, c, __fmul_rn(x1, s)));
}

// One block per token. The token's cos/sin are computed once per block into shared memory; each
// thread then rotates (head, pair) items of Q and K.
template <typename T>
__global__ void rope_kernel(T* q,                              // [tokens, q_stride]
                            T* k,                              // [tokens, k_stride]
                            const int32_t* __restrict__ positions,  // [tokens]
                            const float* __restrict__ inv_freq,     // [head_dim / 2]
                            int num_heads, int num_kv_heads, int head_dim, int64_t q_stride, int64_t k_stride) {
  extern __shared__ float cos_sin[];  // [head_dim/2][2]
  const int half = head_dim / 2;
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
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
    const float2 r = rope_rotate(x1, x2, c, s);
    *a = from_float<T>(r.x);
    *b = from_float<T>(r.y);
  }
}

template <typename T>
cudaError_t launch_rope(T* q, T* k, const int32_t* positions, int tokens, int num_heads, int num_kv_heads,
                        int head_dim, int64_t q_stride, int64_t k_stride, const float* inv_freq,
                        cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int total = (num_heads + num_kv_heads) * head_dim / 2;
  const int threads = total >= 512 ? 512 : ((total + 31) / 32) * 32;
  const size_t smem = static_cast<size_t>(head_dim) * sizeof(float);
  rope_kernel<T><<<tokens, threads, smem, stream>>>(q, k, positions, inv_freq, num_heads, num_kv_heads, head_dim,
                                                    q_stride, k_stride);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
