// kernels/cuda/norm/residual_sum.cuh: what the fused residual-add norms (rmsnorm.cuh, layernorm.cuh)
// share: the residual sum of 8 values, rounded as the model stores it.
#pragma once

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

// out <- a + b as floats, rounded to T first (the sum as a model stores it, before a norm reads it);
// returns the rounded sum.
template <typename T>
__device__ __forceinline__ Vec8<T> vec8_add_rounded(uint4 a_raw, uint4 b_raw, float (&out)[8]) {
  Vec8<T> a, b;
  a.raw = a_raw;
  b.raw = b_raw;
  float bf[8];
  vec8_to_float(a, out);
  vec8_to_float(b, bf);
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] += bf[j];
  const Vec8<T> sum = float_to_vec8<T>(out);
  vec8_to_float(sum, out);
  return sum;
}

}  // namespace tessera::kernels::cuda
