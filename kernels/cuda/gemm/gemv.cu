// kernels/cuda/gemm/gemv.cu: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias) for m <= 8, bound by streaming w
// once from DRAM; the only place its templates are instantiated. Two kernels (gemv.h says which runs):
//   - the row-streaming kernel, for m = 1: gemv_rows.cuh's skeleton (rows per warp, the streaming
//     loads, the main loop, the reduction and the epilogue), where a loaded vector holds 8 weights of
//     the activation dtype, each multiplied with the same 8 values of x in fp32. A warp instruction
//     reads 512 bytes of one row: 97% of copy bandwidth on the H100. Its fp32 FMAs grow with m:
//     from m = 3 each step's FMAs overlap the next step's loads, and at m = 8 the 7B shape's layers
//     still stream at 61-92% of copy bandwidth;
//   - the tensor-core kernel, for m = 2..8: gemv_mma.cuh's skeleton, the same stream into m16n8k16
//     MMAs, 91-92% at every m.
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/gemv_mma.cuh"
#include "kernels/cuda/gemm/gemv_rows.cuh"

namespace tessera::kernels::cuda {
namespace {

using gemv_rows::kThreads;
using gemv_rows::kWarpsPerBlock;

// kSiluMul: y is [M, n / 2], y[i, j] = silu(sum of row 2j) · sum of row 2j + 1 (bias is null).
template <typename T, int M, int R, bool kSiluMul>
__global__ void __launch_bounds__(kThreads) gemv_kernel(T* y,                           // [M, n]
                                                        const T* x,                     // [M, k]
                                                        const T* __restrict__ w,        // [n, k]
                                                        const T* __restrict__ bias,     // [n] or null
                                                        int n, int k) {
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (row0 >= n) return;  // the last block's spare warps
  const int kv = k >> 3;  // 16-byte vectors per row
  const uint4* x_lane = reinterpret_cast<const uint4*>(x) + lane;
  auto fma_vector = [&](const auto& wv, int u, int v, float(&acc)[M][R]) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      Vec8<T> t;
      t.raw = wv[r][u];
      vec8_to_float(t, wf[r]);
    }
    gemv_rows::fma_x_rows<T, M, R>([&](int i) { return x_lane[i * kv + v + u * 32]; }, wf, acc);
  };
  const float out =
      gemv_rows::warp_row_sums<M, R>(reinterpret_cast<const uint4*>(w), row0, n, kv, lane, fma_vector);
  gemv_rows::store_row_sums<T, M, R, kSiluMul>(y, out, bias, row0, n, lane, [](float sum, int) { return sum; });
}

// The tensor-core kernel over weights of the activation type: a 16-byte vector is 4 pairs already.
struct DenseWeights {
  static constexpr int kValues = 8;
  __device__ __forceinline__ static void pairs(const uint4& v, uint32_t (&out)[4]) {
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};

template <typename T, bool kSiluMul>
__global__ void __launch_bounds__(gemv_mma::kThreads) gemv_mma_kernel(T* y, const T* x, const T* __restrict__ w,
                                                                     const T* __restrict__ bias, int m, int n, int k) {
  gemv_mma::gemv<T, DenseWeights, kSiluMul>(y, x, reinterpret_cast<const uint4*>(w), bias, m, n, k,
                                            [](float sum, int) { return sum; });
}

// The tensor-core kernel from 2 rows, unless the caller needs the bits a row gets alone at every m;
// the row-streaming kernel otherwise.
template <typename T, bool kSiluMul>
cudaError_t launch_gemv_m(T* y, const T* x, const T* w, const T* bias, int m, int n, int k, GemvRowBits row_bits,
                          cudaStream_t stream) {
  if (gemv_takes_tensor_cores(m, row_bits))
    return gemv_mma::launch(gemv_mma_kernel<T, kSiluMul>, n, stream, y, x, w, bias, m, n, k);
  auto kernel_of = [](auto m_tag, auto r_tag) {
    return gemv_kernel<T, decltype(m_tag)::value, decltype(r_tag)::value, kSiluMul>;
  };
  return gemv_rows::launch_for_m(m, n, stream, kernel_of, y, x, w, bias, n, k);
}

}  // namespace

bool gemv_takes_tensor_cores(int m, GemvRowBits row_bits) { return gemv_mma::takes(m, 2, row_bits); }

bool gemv_supported(int m, int n, int k, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxM && n > 0 && k > 0 && k % 8 == 0 && is_aligned16(x) && is_aligned16(w);
}

cudaError_t gemv(DType dtype, void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                 GemvRowBits row_bits, cudaStream_t stream) {
  if (!gemv_supported(m, n, k, x, w)) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_gemv_m<scalar_t, false>(static_cast<scalar_t*>(y), static_cast<const scalar_t*>(x),
                                          static_cast<const scalar_t*>(w), static_cast<const scalar_t*>(bias), m, n, k,
                                          row_bits, stream);
  });
}

cudaError_t gemv_silu_mul(DType dtype, void* out, const void* x, const void* w, int m, int n, int k,
                          GemvRowBits row_bits, cudaStream_t stream) {
  if (!gemv_supported(m, n, k, x, w) || n % 2 != 0) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_gemv_m<scalar_t, true>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x),
                                         static_cast<const scalar_t*>(w), nullptr, m, n, k, row_bits, stream);
  });
}

}  // namespace tessera::kernels::cuda
