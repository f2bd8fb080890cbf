// kernels/cuda/embedding/embedding.cuh: embedding gather kernel, then its launcher.
#pragma once

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

// One block per token; 16-byte copies when rows allow, 2-byte copies otherwise.
template <typename T, bool kVec>
__global__ void embedding_kernel(T* __restrict__ out,              // [tokens, hidden]
                                 const T* __restrict__ table,      // [vocab, hidden]
                                 const int32_t* __restrict__ ids,  // [tokens]
                                 int hidden, int vocab) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const T* src = table + static_cast<int64_t>(valid ? id : 0) * hidden;
  T* dst = out + t * hidden;
  if constexpr (kVec) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int v = threadIdx.x; v < hidden / 8; v += blockDim.x)
      reinterpret_cast<uint4*>(dst)[v] = valid ? __ldg(reinterpret_cast<const uint4*>(src) + v) : zero;
  } else {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = valid ? src[i] : from_float<T>(0.f);
  }
}

template <typename T>
cudaError_t launch_embedding(T* out, const T* table, const int32_t* ids, int tokens, int hidden, int vocab,
                             cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec = hidden % 8 == 0 && is_aligned16(out) && is_aligned16(table);
  const int items = vec ? hidden / 8 : hidden;
  const int threads = items >= 256 ? 256 : ((items + 31) / 32) * 32;
  if (vec) {
    embedding_kernel<T, true><<<tokens, threads, 0, stream>>>(out, table, ids, hidden, vocab);
  } else {
    embedding_kernel<T, false><<<tokens, threads, 0, stream>>>(out, table, ids, hidden, vocab);
  }
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
