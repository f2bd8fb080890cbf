// kernels/cuda/common/device.cuh: device-side building blocks shared by the CUDA kernels: dtype
// traits (bf16/fp16 <-> fp32), 16-byte vectors, warp reductions, and the DType dispatch macro.
#pragma once

#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

template <typename T>
struct DTypeTraits;

template <>
struct DTypeTraits<__nv_bfloat16> {
  using pair = __nv_bfloat162;
  static constexpr DType kDType = DType::kBF16;
  __device__ __forceinline__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  __device__ __forceinline__ static float2 to_float2(pair v) { return __bfloat1622float2(v); }
  __device__ __forceinline__ static pair from_float2(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

template <>
struct DTypeTraits<__half> {
  using pair = __half2;
  static constexpr DType kDType = DType::kFP16;
  __device__ __forceinline__ static float to_float(__half v) { return __half2float(v); }
  __device__ __forceinline__ static __half from_float(float v) { return __float2half_rn(v); }
  __device__ __forceinline__ static float2 to_float2(pair v) { return __half22float2(v); }
  __device__ __forceinline__ static pair from_float2(float a, float b) { return __floats2half2_rn(a, b); }
};

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return DTypeTraits<T>::to_float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return DTypeTraits<T>::from_float(v);
}

// 8 elements of a 2-byte dtype in one 16-byte register quad.
template <typename T>
struct Vec8 {
  uint4 raw;
};

template <typename T>
__device__ __forceinline__ void vec8_to_float(const Vec8<T>& v, float (&out)[8]) {
  const auto* pairs = reinterpret_cast<const typename DTypeTraits<T>::pair*>(&v.raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = DTypeTraits<T>::to_float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
template <typename T>
__device__ __forceinline__ Vec8<T> float_to_vec8(const float (&in)[8]) {
  Vec8<T> v;
  auto* pairs = reinterpret_cast<typename DTypeTraits<T>::pair*>(&v.raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = DTypeTraits<T>::from_float2(in[2 * i], in[2 * i + 1]);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds at least 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// Programmatic dependent launch (sm_90+): let the next kernel in the stream start launching, and wait
// until the previous one has completed and its writes are visible. No-ops without PDL, and compiled
// out for older architectures.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_previous() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches `kernel` with programmatic dependent launch allowed, so its launch (and whatever it does
// before pdl_wait_previous) overlaps the tail of the kernel before it in the stream.
template <typename... Params, typename... Args>
cudaError_t launch_with_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                            Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

inline bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace tessera::kernels::cuda

// Turns a runtime DType into the element type `scalar_t` inside the body; anything else returns
// cudaErrorInvalidValue from the enclosing function.
#define TESSERA_DISPATCH_DTYPE(dtype, ...)                                    \
  [&]() -> cudaError_t {                                                      \
    switch (dtype) {                                                          \
      case ::tessera::kernels::cuda::DType::kBF16: {                          \
        using scalar_t = __nv_bfloat16;                                       \
        return __VA_ARGS__();                                                 \
      }                                                                       \
      case ::tessera::kernels::cuda::DType::kFP16: {                          \
        using scalar_t = __half;                                              \
        return __VA_ARGS__();                                                 \
      }                                                                       \
    }                                                                         \
    return cudaErrorInvalidValue;                                             \
  }()
