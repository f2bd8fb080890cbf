// kernels/cuda/common/host_convert.h: bf16 / fp16 bits to and from float on the host (uploads,
// downloads, test references), rounding to nearest even as the kernels do. Needs the CUDA headers,
// not a CUDA compiler.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

inline uint16_t to_bits(float v, DType dtype) {
  if (dtype == DType::kBF16) return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v)).x;
  return static_cast<__half_raw>(__float2half_rn(v)).x;
}

inline float from_bits(uint16_t bits, DType dtype) {
  if (dtype == DType::kBF16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// OCP e4m3 bits of v, rounded to nearest even and saturating at +-448: what the fp8 KV cache stores
// (kernels/cuda/common/fp8.cuh).
inline uint8_t to_e4m3_bits(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }

inline float from_e4m3_bits(uint8_t bits) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3))); }

}  // namespace tessera::kernels::cuda
