// kernels/cuda/gemm/skinny_gemm.cu: the skinny GEMM over weights of the activation type; the only place
// skinny_gemm.cuh is instantiated for them.
#include "kernels/cuda/gemm/skinny_gemm.h"

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/gemm/skinny_gemm.cuh"

namespace tessera::kernels::cuda {
namespace {

// A 16-byte vector of weights of the activation type is 4 pairs already.
struct DenseWeights {
  static constexpr int kValues = 8;
  __device__ __forceinline__ static void pairs(const uint4& v, uint32_t (&out)[4]) {
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};

template <typename T, int kTiles>
__global__ void __launch_bounds__(skinny::kThreads, skinny::kBlocksPerSm)
    skinny_gemm_kernel(T* y, const T* x, const T* __restrict__ w, const T* __restrict__ bias, int m, int n, int k,
                       int pieces_per_split, float* partials, int* counters) {
  skinny::gemm<T, DenseWeights, kTiles>(y, x, reinterpret_cast<const uint4*>(w), bias, m, n, k, pieces_per_split,
                                             partials, counters, [](float sum, int) { return sum; });
}

}  // namespace

bool skinny_gemm_supported(int m, int n, int k, const void* x, const void* w) {
  return m >= kSkinnyGemmMinM && m <= kSkinnyGemmMaxM && n > 0 && k > 0 && k % 8 == 0 && is_aligned16(x) &&
         is_aligned16(w);
}

cudaError_t skinny_gemm(DType dtype, void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                        const SkinnyGemmWorkspace& workspace, cudaStream_t stream) {
  if (!skinny_gemm_supported(m, n, k, x, w) || workspace.num_sms <= 0) return cudaErrorInvalidValue;
  const skinny::Split split = skinny::plan_split(m, n, k, DenseWeights::kValues, workspace.num_sms,
                                                           workspace.partial_bytes, workspace.num_counters);
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    auto kernel_of = [](auto tiles) { return skinny_gemm_kernel<scalar_t, decltype(tiles)::value>; };
    return skinny::launch(kernel_of, m, n, split, stream, static_cast<scalar_t*>(y),
                               static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(w),
                               static_cast<const scalar_t*>(bias), m, n, k, split.pieces_per_split,
                               workspace.partials, workspace.counters);
  });
}

}  // namespace tessera::kernels::cuda
