// kernels/cuda/rows/rows.cuh: the row ops' kernels, then their launchers. Row kernels run one block
// per row (softmax, L2 norm) or per (sequence, column chunk) (pooling); they read the row from
// global memory once per pass (the re-reads hit L1/L2), which is fine at these ops' sizes.
#pragma once

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/rows/rows.h"

namespace tessera::kernels::cuda {

// Max over the block; every thread gets the result. `scratch` holds at least 32 floats.
__device__ __forceinline__ float rows_block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : -INFINITY;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Threads for a one-block-per-row kernel: a multiple of 32, at most 512.
inline int rows_threads(int width) {
  const int t = ((width + 31) / 32) * 32;
  return t > 512 ? 512 : t;
}

// The gather is a copy, so one 2-byte instance serves both dtypes; 16-byte copies when rows allow.
template <bool kVec>
__global__ void gather_rows_kernel(uint16_t* __restrict__ out, const uint16_t* __restrict__ x,
                                   const int32_t* __restrict__ rows, int width) {
  const int64_t i = blockIdx.x;
  const int32_t r = rows[i];
  uint16_t* dst = out + i * width;
  const uint16_t* src = x + static_cast<int64_t>(r < 0 ? 0 : r) * width;
  if constexpr (kVec) {
    for (int v = threadIdx.x; v < width / 8; v += blockDim.x)
      reinterpret_cast<uint4*>(dst)[v] = r >= 0 ? __ldg(reinterpret_cast<const uint4*>(src) + v) : make_uint4(0, 0, 0, 0);
  } else {
    for (int c = threadIdx.x; c < width; c += blockDim.x) dst[c] = r >= 0 ? src[c] : uint16_t{0};
  }
}

// A mean pool's rows are summed by kPoolSlices threads a column, slice j taking the sequence's rows
// j, j + kPoolSlices, ...: one thread a column left a 128-token text a chain of 128 dependent loads.
// The slices depend only on a row's place in its sequence, so a text pools to the same bits packed
// or alone.
inline constexpr int kPoolSlices = 8;
inline constexpr int kPoolColumns = 128;  // columns a block pools, at most

// grid (num_seqs, column chunks), block (columns, kPoolSlices).
template <typename T>
__global__ void pool_rows_kernel(T* __restrict__ out, const T* __restrict__ x, const int32_t* __restrict__ cu_seqlens,
                                 int width, PoolKind kind) {
  __shared__ float partial[kPoolSlices][kPoolColumns];
  const int s = blockIdx.x;
  const int col = blockIdx.y * blockDim.x + threadIdx.x;
  const int slice = threadIdx.y;
  const int64_t begin = cu_seqlens[s], end = cu_seqlens[s + 1];
  float sum = 0.f;
  if (col < width && kind == PoolKind::kMean) {
    for (int64_t r = begin + slice; r < end; r += kPoolSlices) sum += to_float(x[r * width + col]);
  }
  partial[slice][threadIdx.x] = sum;
  __syncthreads();
  if (slice != 0 || col >= width) return;
  float v = 0.f;
  if (end > begin) {
    if (kind == PoolKind::kFirst) {
      v = to_float(x[begin * width + col]);
    } else if (kind == PoolKind::kLast) {
      v = to_float(x[(end - 1) * width + col]);
    } else {
      for (int j = 0; j < kPoolSlices; ++j) v += partial[j][threadIdx.x];
      v /= static_cast<float>(end - begin);
    }
  }
  out[static_cast<int64_t>(s) * width + col] = from_float<T>(v);
}

template <typename T>
__global__ void l2_normalize_rows_kernel(T* x, int width, float eps) {
  __shared__ float scratch[32];
  T* row = x + static_cast<int64_t>(blockIdx.x) * width;
  float ss = 0.f;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    const float v = to_float(row[c]);
    ss = fmaf(v, v, ss);
  }
  const float denom = fmaxf(sqrtf(block_sum(ss, scratch)), eps);
  for (int c = threadIdx.x; c < width; c += blockDim.x) row[c] = from_float<T>(to_float(row[c]) / denom);
}

template <typename T>
__global__ void softmax_rows_kernel(T* x, int width) {
  __shared__ float scratch[32];
  T* row = x + static_cast<int64_t>(blockIdx.x) * width;
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < width; c += blockDim.x) mx = fmaxf(mx, to_float(row[c]));
  mx = rows_block_max(mx, scratch);
  float sum = 0.f;
  for (int c = threadIdx.x; c < width; c += blockDim.x) sum += expf(to_float(row[c]) - mx);
  const float inv = 1.f / block_sum(sum, scratch);
  for (int c = threadIdx.x; c < width; c += blockDim.x) row[c] = from_float<T>(expf(to_float(row[c]) - mx) * inv);
}

template <typename T>
__global__ void convert_to_f32_kernel(float* __restrict__ out, const T* __restrict__ x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = to_float(x[i]);
}

template <typename T>
__global__ void convert_from_f32_kernel(T* __restrict__ out, const float* __restrict__ x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(x[i]);  // __float2bfloat16_rn / __float2half_rn: nearest even
}

inline cudaError_t launch_gather_rows(uint16_t* out, const uint16_t* x, const int32_t* rows, int num_rows, int width,
                                      cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && is_aligned16(out) && is_aligned16(x);
  const int items = vec ? width / 8 : width;
  const int threads = items >= 256 ? 256 : ((items + 31) / 32) * 32;
  if (vec) {
    gather_rows_kernel<true><<<num_rows, threads, 0, stream>>>(out, x, rows, width);
  } else {
    gather_rows_kernel<false><<<num_rows, threads, 0, stream>>>(out, x, rows, width);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_pool_rows(T* out, const T* x, const int32_t* cu_seqlens, int num_seqs, int width, PoolKind kind,
                             cudaStream_t stream) {
  if (num_seqs == 0) return cudaSuccess;
  const int threads = width >= kPoolColumns ? kPoolColumns : ((width + 31) / 32) * 32;
  const dim3 grid(num_seqs, (width + threads - 1) / threads);
  pool_rows_kernel<T><<<grid, dim3(threads, kPoolSlices), 0, stream>>>(out, x, cu_seqlens, width, kind);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_l2_normalize_rows(T* x, int rows, int width, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  l2_normalize_rows_kernel<T><<<rows, rows_threads(width), 0, stream>>>(x, width, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_softmax_rows(T* x, int rows, int width, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  softmax_rows_kernel<T><<<rows, rows_threads(width), 0, stream>>>(x, width);
  return cudaGetLastError();
}

// Elementwise grid: enough blocks to fill the GPU several times over, then grid-stride.
inline unsigned convert_blocks(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 8192 ? blocks : 8192);
}

template <typename T>
cudaError_t launch_convert_to_f32(float* out, const T* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  convert_to_f32_kernel<T><<<convert_blocks(n), 256, 0, stream>>>(out, x, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_convert_from_f32(T* out, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  convert_from_f32_kernel<T><<<convert_blocks(n), 256, 0, stream>>>(out, x, n);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
