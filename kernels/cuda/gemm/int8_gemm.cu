// kernels/cuda/gemm/int8_gemm.cu: int8_rowwise_gemm (see int8_gemm.h). Two tile shapes, picked by m: 128 x 128 for prefill, and 64 x 64 (k steps
// of 256) up to 128 rows (batched decode, short prompts), where 128 x 128 tiles would leave most
// SMs idle on n = 4096.
#include "kernels/cuda/gemm/int8_gemm.h"

#if defined(TESSERA_CUDA_SM90A)
#include "kernels/cuda/gemm/cutlass_gemm.cuh"
#endif

namespace tessera::kernels::cuda {

#if defined(TESSERA_CUDA_SM90A)
namespace {

using namespace cute;

// x's scales vary along m (a column broadcast), w's along n (a row broadcast); the bias is a row
// broadcast that reads as 0 when its pointer is null, so one kernel serves both.
template <class Tile>
using RowwiseEpilogue = fusion::Sm90EVT<
    fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Bf16, float, kRoundToNearest>,
    fusion::Sm90ColBroadcast<0, Tile, float, float, Stride<_1, _0, int64_t>>,
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRoundToNearest>,
                    fusion::Sm90RowBroadcast<0, Tile, float, float, Stride<_0, _1, int64_t>>, fusion::Sm90AccFetch>,
    fusion::Sm90RowBroadcast<0, Tile, Bf16, Bf16, Stride<_0, _1, int64_t>, 8, true>>;

template <class Tile, class Cluster>
struct RowwiseInt8Gemm {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void, cutlass::layout::RowMajor, 8, Bf16,
      cutlass::layout::RowMajor, 8, cutlass::epilogue::TmaWarpSpecialized, RowwiseEpilogue<Tile>>::CollectiveOp;
  // x is row-major [m, k] and w row-major [n, k]: both k-major, as int8 wgmma needs.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16, int8_t,
      cutlass::layout::ColumnMajor, 16, int32_t, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(void* y, const int8_t* x, const float* x_scales, const int8_t* w,
                                            const float* w_scales, const void* bias, int m, int n, int k) {
    using StrideD = typename Kernel::StrideD;
    const auto stride_x = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(m, k, 1));
    const auto stride_w = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(n, k, 1));
    const auto stride_y = cutlass::make_cute_packed_stride(StrideD{}, make_shape(m, n, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {x, stride_x, w, stride_w},
                                  {{}, nullptr, stride_y, static_cast<Bf16*>(y), stride_y}};
    args.epilogue.thread = {{x_scales}, {{w_scales}, {}, {}}, {static_cast<const Bf16*>(bias)}, {}};
    return args;
  }

  static cudaError_t run(void* y, const int8_t* x, const float* x_scales, const int8_t* w, const float* w_scales,
                         const void* bias, int m, int n, int k, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
    return run_cutlass_gemm<Gemm>(arguments(y, x, x_scales, w, w_scales, bias, m, n, k), workspace, workspace_bytes,
                                  stream);
  }
};

using PrefillGemm = RowwiseInt8Gemm<Shape<_128, _128, _128>, Shape<_2, _1, _1>>;
using FewRowsGemm = RowwiseInt8Gemm<Shape<_64, _64, _256>, Shape<_1, _1, _1>>;
constexpr int kFewRows = 128;

}  // namespace

cudaError_t int8_rowwise_gemm(void* y, const int8_t* x, const float* x_scales, const int8_t* w, const float* w_scales,
                              const void* bias, int m, int n, int k, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (m < 0 || n <= 0 || k <= 0) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  if (k % 16 != 0 || n % 8 != 0 || !aligned16({y, x, w})) return cudaErrorNotSupported;
  if (m <= kFewRows)
    return FewRowsGemm::run(y, x, x_scales, w, w_scales, bias, m, n, k, workspace, workspace_bytes, stream);
  return PrefillGemm::run(y, x, x_scales, w, w_scales, bias, m, n, k, workspace, workspace_bytes, stream);
}

#else  // no sm_90a code in this build: the caller's bf16 path

cudaError_t int8_rowwise_gemm(void*, const int8_t*, const float*, const int8_t*, const float*, const void*, int, int,
                              int, void*, size_t, cudaStream_t) {
  return cudaErrorNotSupported;
}

#endif

}  // namespace tessera::kernels::cuda
