// kernels/cuda/embedding/embedding.cuh: embedding gather kernel, then its launcher.
#pragma once

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

// One block per token; 16-byte copies when rows allow, 2-byte copies otherwise. kAccumulate adds the
// row onto out in fp32 (one rounding); an invalid id then leaves out unchanged.
template <typename T, bool kVec, bool kAccumulate>
__global__ void embedding_kernel(T* __restrict__ out,              // [tokens, hidden]
                                 const T* __restrict__ table,      // [vocab, hidden]
                                 const int32_t* __restrict__ ids,  // [tokens]
                                 int hidden, int vocab) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  if (kAccumulate && !valid) return;
  const T* src = table + static_cast<int64_t>(valid ? id : 0) * hidden;
  T* dst = out + t * hidden;
  if constexpr (kVec) {
    for (int v = threadIdx.x; v < hidden / 8; v += blockDim.x) {
      if constexpr (kAccumulate) {
        float a[8], b[8];
        vec8_to_float(Vec8<T>{reinterpret_cast<const uint4*>(dst)[v]}, a);
        vec8_to_float(Vec8<T>{__ldg(reinterpret_cast<const uint4*>(src) + v)}, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] += b[i];
        reinterpret_cast<uint4*>(dst)[v] = float_to_vec8<T>(a).raw;
      } else {
        const uint4 row = valid ? __ldg(reinterpret_cast<const uint4*>(src) + v) : make_uint4(0, 0, 0, 0);
        reinterpret_cast<uint4*>(dst)[v] = row;
      }
    }
  } else {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      if constexpr (kAccumulate) {
        dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
      } else {
        dst[i] = valid ? src[i] : from_float<T>(0.f);
      }
    }
  }
}

template <typename T>
cudaError_t launch_embedding(T* out, const T* table, const int32_t* ids, int tokens, int hidden, int vocab,
                             bool accumulate, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = hidden % 8 == 0 && is_aligned16(out) && is_aligned16(table);
  const int items = vec ? hidden / 8 : hidden;
  const int threads = items >= 256 ? 256 : ((items + 31) / 32) * 32;
  auto launch = [&](auto kernel) { kernel<<<tokens, threads, 0, stream>>>(out, table, ids, hidden, vocab); };
  if (vec) {
    accumulate ? launch(embedding_kernel<T, true, true>) : launch(embedding_kernel<T, true, false>);
  } else {
    accumulate ? launch(embedding_kernel<T, false, true>) : launch(embedding_kernel<T, false, false>);
  }
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
