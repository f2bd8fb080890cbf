// kernels/cuda/sampling/token_mask.cu: mask_disallowed_tokens, constrained decoding's grammar
// bitmasks applied to the logits in place before sample_rows reads them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/sampling/sampling.h"

namespace tessera::kernels::cuda {

namespace {

// The value a disallowed token's logit becomes: as min_tokens' mask, very negative and finite in
// every dtype (every byte 0xFB), so exp() gives exactly 0 and no row turns into NaN.
template <typename T>
__device__ T masked_logit();
template <>
__device__ float masked_logit<float>() { return __int_as_float(static_cast<int>(0xFBFBFBFBu)); }
template <>
__device__ __nv_bfloat16 masked_logit<__nv_bfloat16>() { return __ushort_as_bfloat16(0xFBFB); }
template <>
__device__ __half masked_logit<__half>() { return __ushort_as_half(0xFBFB); }

// One thread per bitmask word: the 32 logits it covers. Grid: (word blocks, masked rows).
template <typename T>
__global__ void mask_disallowed_kernel(T* logits, int64_t row_stride, int vocab, const int32_t* rows,
                                       const int32_t* bitmask, int words) {
  const int word = blockIdx.x * blockDim.x + threadIdx.x;
  if (word >= words) return;
  const int mask_row = blockIdx.y;
  const uint32_t allowed = static_cast<uint32_t>(bitmask[static_cast<int64_t>(mask_row) * words + word]);
  if (allowed == 0xFFFFFFFFu) return;
  T* row = logits + static_cast<int64_t>(rows[mask_row]) * row_stride;
  const int first = word * 32;
  const int last = min(first + 32, vocab);
  for (int t = first; t < last; ++t) {
    if (((allowed >> (t - first)) & 1u) == 0) row[t] = masked_logit<T>();
  }
}

template <typename T>
cudaError_t launch(void* logits, int64_t row_stride, int vocab, const int32_t* rows, int num_rows,
                   const int32_t* bitmask, cudaStream_t stream) {
  const int words = (vocab + 31) / 32;
  constexpr int kThreads = 256;
  const dim3 grid((words + kThreads - 1) / kThreads, num_rows);
  mask_disallowed_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<T*>(logits), row_stride, vocab, rows, bitmask,
                                                           words);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mask_disallowed_tokens(LogitsType type, void* logits, int64_t row_stride, int vocab, const int32_t* rows,
                                   int num_rows, const int32_t* bitmask, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  if (logits == nullptr || rows == nullptr || bitmask == nullptr || vocab < 1 || row_stride < vocab ||
      num_rows > 65535) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case LogitsType::kF32: return launch<float>(logits, row_stride, vocab, rows, num_rows, bitmask, stream);
    case LogitsType::kBF16: return launch<__nv_bfloat16>(logits, row_stride, vocab, rows, num_rows, bitmask, stream);
    case LogitsType::kFP16: return launch<__half>(logits, row_stride, vocab, rows, num_rows, bitmask, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tessera::kernels::cuda
