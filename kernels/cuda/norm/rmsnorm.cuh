// kernels/cuda/norm/rmsnorm.cuh: RMSNorm and fused residual-add + RMSNorm (kernels, then launchers).
//   fused:  residual <- x + residual;  x <- rmsnorm(residual) * weight   (in place)
//   plain:  out <- rmsnorm(x) * weight                                   (out may alias x)
// fp32 accumulation; the sum is rounded to the activation dtype before it is normalised and stored,
// as HF transformers does (hidden = residual + x in bf16, then the norm in fp32).
#pragma once

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/norm/residual_sum.cuh"

namespace tessera::kernels::cuda {

// One block per row; each thread keeps its kVecs 16-byte vectors in registers between the two
// passes, so every byte is read and written exactly once.
template <typename T, int kVecs, bool kAddResidual>
__global__ void rmsnorm_vec_kernel(T* out,                        // [tokens, out_stride], first hidden used
                                   const T* x,                      // [tokens, x_stride]; may alias out
                                   T* __restrict__ residual,        // [tokens, hidden] (fused only)
                                   const T* __restrict__ weight,    // [hidden]
                                   int hidden, int64_t x_stride, int64_t out_stride, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int num_vecs = hidden / 8;
  // The weight is a model parameter, never written by the kernel just before (norm.h), so its loads
  // go out before the programmatic-launch wait: at one token they were a second round trip.
  const uint4* w_vec = reinterpret_cast<const uint4*>(weight);
  uint4 w_raw[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v < num_vecs) w_raw[i] = __ldg(w_vec + v);
  }
  // Programmatic dependent launch: wait for the previous kernel to complete before touching memory it
  // may have written, then let the next one start launching (no-ops without PDL). Released only
  // after the wait, the next kernel never runs beside the one before this (attention.h, decode).
  pdl_wait_previous();
  pdl_launch_dependents();
  const uint4* x_row = reinterpret_cast<const uint4*>(x + row * x_stride);
  uint4* res_row = reinterpret_cast<uint4*>(residual + row * static_cast<int64_t>(hidden));
  // Every load of the row is issued before any value is used: otherwise each residual store can hold
  // back the next vector's loads, one round trip per vector (measured: 64 rows from DRAM took twice
  // as long as one row from L2).
  uint4 x_raw[kVecs], res_raw[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v < num_vecs) {
      x_raw[i] = x_row[v];
      if constexpr (kAddResidual) res_raw[i] = res_row[v];
    }
  }
  float vals[kVecs][8];
  float sum_sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v < num_vecs) {
      if constexpr (kAddResidual) {
        res_row[v] = vec8_add_rounded<T>(x_raw[i], res_raw[i], vals[i]).raw;  // normalise the stored value
      } else {
        Vec8<T> a;
        a.raw = x_raw[i];
        vec8_to_float(a, vals[i]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_sq += vals[i][j] * vals[i][j];
    }
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(hidden) + eps);
  uint4* out_row = reinterpret_cast<uint4*>(out + row * out_stride);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v < num_vecs) {
      Vec8<T> w;
      w.raw = w_raw[i];
      float wf[8];
      vec8_to_float(w, wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) vals[i][j] = vals[i][j] * inv_rms * wf[j];
      out_row[v] = float_to_vec8<T>(vals[i]).raw;
    }
  }
}

// Any hidden size, any alignment: two passes, the second re-reads the row (from L1/L2).
template <typename T, bool kAddResidual>
__global__ void rmsnorm_scalar_kernel(T* out,                      // [tokens, out_stride]
                                      const T* x,                    // [tokens, x_stride]; may alias out
                                      T* __restrict__ residual,      // [tokens, hidden] (fused only)
                                      const T* __restrict__ weight,  // [hidden]
                                      int hidden, int64_t x_stride, int64_t out_stride, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x_row = x + row * x_stride;
  T* res_row = residual + row * static_cast<int64_t>(hidden);
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = to_float(x_row[i]);
    if constexpr (kAddResidual) {
      const T sum = from_float<T>(v + to_float(res_row[i]));
      res_row[i] = sum;
      v = to_float(sum);
    }
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(hidden) + eps);
  T* out_row = out + row * out_stride;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    // The same thread wrote res_row[i] above, so it reads its own store.
    const float v = kAddResidual ? to_float(res_row[i]) : to_float(x_row[i]);
    out_row[i] = from_float<T>(v * inv_rms * to_float(weight[i]));
  }
}

template <typename T, bool kAddResidual>
cudaError_t launch_rmsnorm(T* out, const T* x, T* residual, const T* weight, int tokens, int hidden,
                           int64_t x_stride, int64_t out_stride, float eps, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec_ok = hidden % 8 == 0 && x_stride % 8 == 0 && out_stride % 8 == 0 && is_aligned16(x) &&
                      is_aligned16(out) && is_aligned16(weight) && (!kAddResidual || is_aligned16(residual));
  const int num_vecs = hidden / 8;
  // Up to 512 threads per row so that a single row (decode) still has many loads in flight; beyond
  // 4096 vectors (hidden 32768) the registers run out and the two-pass kernel takes over. (Blocks of
  // 128 threads x 4 vectors for many rows measured 3-4% slower on the H100 at 4096 x 4096.)
  // Launched with programmatic dependent launch: the kernel's launch and prologue overlap the tail of
  // the previous kernel in the stream, and griddepcontrol.wait holds every read of x / residual until
  // that kernel has finished, so results are unchanged. At decode sizes launch latency is most of the
  // cost.
  auto launch_vec = [&](auto vecs_tag) {
    constexpr int kVecs = decltype(vecs_tag)::value;
    int threads = (num_vecs + kVecs - 1) / kVecs;
    threads = ((threads + 31) / 32) * 32;
    return launch_with_pdl(rmsnorm_vec_kernel<T, kVecs, kAddResidual>, dim3(tokens), dim3(threads), 0, stream, out, x,
                           residual, weight, hidden, x_stride, out_stride, eps);
  };
  // Few rows (decode): latency-bound, so four vectors per thread in one 128-thread block for hidden
  // 4096: the same loads in flight, a four-warp reduction instead of a sixteen-warp one.
  if (vec_ok && tokens < 256 && num_vecs > 128 && num_vecs <= 512) return launch_vec(std::integral_constant<int, 4>{});
  if (vec_ok && num_vecs <= 512) return launch_vec(std::integral_constant<int, 1>{});
  if (vec_ok && num_vecs <= 1024) return launch_vec(std::integral_constant<int, 2>{});
  if (vec_ok && num_vecs <= 2048) return launch_vec(std::integral_constant<int, 4>{});
  if (vec_ok && num_vecs <= 4096) return launch_vec(std::integral_constant<int, 8>{});
  rmsnorm_scalar_kernel<T, kAddResidual><<<tokens, 512, 0, stream>>>(out, x, residual, weight, hidden, x_stride,
                                                                      out_stride, eps);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
