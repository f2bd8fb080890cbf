// kernels/cuda/common/fp8.cuh: OCP fp8 e4m3 <-> bf16/fp16/fp32 on the device, for the fp8 KV cache.
//
// The cache stores each value as e4m3 with a scale of 1.0 (vLLM's `kv_cache_dtype=fp8` without
// calibration does the same). Why no scale: K and V of real models are layer-normed projections
// whose values sit well inside e4m3's range (+-448, normal down to 2^-6), so a scale would only move
// the rounding step, not the relative error (3 mantissa bits: <= 2^-4 relative), and a per-tensor
// scale needs calibration data the server does not have. Conversion saturates (satfinite): a value
// past +-448 becomes +-448 instead of NaN, so one outlier cannot poison a softmax. Rounding is to
// nearest even, in hardware (cvt.rn.satfinite.e4m3x2.f32 on sm_89+).
//
// Decoding goes e4m3 -> fp16 (exact: every e4m3 value, subnormals included, is an fp16 value) ->
// fp32 -> the activation type (exact again: e4m3's 3 mantissa bits fit bf16's 7).
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

// One byte of e4m3 as the cache stores it.
using e4m3_t = __nv_fp8_storage_t;

__device__ __forceinline__ e4m3_t e4m3_from_float(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// Two values; `a` lands in the low byte (the lower address).
__device__ __forceinline__ uint16_t e4m3x2_from_float2(float a, float b) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float e4m3_to_float(e4m3_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3)));
}

__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t v) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3)));
}

// 8 values of T (16 bytes) -> 8 e4m3 bytes, in order.
template <typename T>
__device__ __forceinline__ uint2 e4m3x8_from_vec8(uint4 v) {
  const auto* pairs = reinterpret_cast<const typename DTypeTraits<T>::pair*>(&v);
  uint16_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = DTypeTraits<T>::to_float2(pairs[i]);
    packed[i] = e4m3x2_from_float2(f.x, f.y);
  }
  return make_uint2(packed[0] | (static_cast<uint32_t>(packed[1]) << 16),
                    packed[2] | (static_cast<uint32_t>(packed[3]) << 16));
}

// 8 e4m3 bytes -> 8 values of T (16 bytes), in order.
template <typename T>
__device__ __forceinline__ uint4 vec8_from_e4m3x8(uint2 v) {
  uint4 out;
  auto* pairs = reinterpret_cast<typename DTypeTraits<T>::pair*>(&out);
  const uint32_t words[2] = {v.x, v.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = e4m3x2_to_float2(static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2))));
    pairs[i] = DTypeTraits<T>::from_float2(f.x, f.y);
  }
  return out;
}

// A cached value of storage type KvT (T itself, or e4m3_t) to and from fp32.
template <typename KvT>
__device__ __forceinline__ float kv_to_float(KvT v) {
  if constexpr (std::is_same_v<KvT, e4m3_t>) {
    return e4m3_to_float(v);
  } else {
    return to_float(v);
  }
}

// A fp32 value into the cache: rounded to T first, as the unfused path leaves it in a T buffer before
// the append converts it, so fused and unfused writes store the same byte.
template <typename T, typename KvT>
__device__ __forceinline__ KvT kv_from_float(float v) {
  if constexpr (std::is_same_v<KvT, e4m3_t>) {
    return e4m3_from_float(to_float(from_float<T>(v)));
  } else {
    return from_float<T>(v);
  }
}

// Two adjacent cached values (4-byte aligned for T, 2-byte for e4m3) as fp32.
template <typename KvT>
__device__ __forceinline__ float2 kv_pair_to_float2(const KvT* p) {
  if constexpr (std::is_same_v<KvT, e4m3_t>) {
    return e4m3x2_to_float2(*reinterpret_cast<const uint16_t*>(p));
  } else {
    return DTypeTraits<KvT>::to_float2(*reinterpret_cast<const typename DTypeTraits<KvT>::pair*>(p));
  }
}

}  // namespace tessera::kernels::cuda
