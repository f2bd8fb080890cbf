// kernels/cuda/gemm/w8a8_gemm.cu: int8_rowwise_gemm and fp8_rowwise_gemm_few_rows (see w8a8_gemm.h).
// int8 has two tile shapes, picked by m: 128 x 128 for prefill, and 64 x 64 (k steps of 256) up to
// 128 rows (batched decode, short prompts), where 128 x 128 tiles would leave most SMs idle on
// n = 4096. fp8_e4m3 at up to 64 rows puts the weight on the MMA's M side with stream-K (below).
#include "kernels/cuda/gemm/w8a8_gemm.h"

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

// fp8_e4m3 at few rows of x: the weight takes the MMA's M side, a tile being 128 rows of w by 64 rows
// of x, so each CTA streams a slab of w once, and stream-K splits k so that every SM streams (n = 4096
// has 32 such tiles). The product is w · xᵀ, [n, m], which column-major is y; the scale and bias
// broadcasts swap sides with it. On an H200, 7B linears at 16 and 64 rows: 8-11% faster than
// cuBLASLt's fp8 algorithm with outer-vector scales, 2% slower at 128. int8 on the same kernel ran
// 14% slower at 64 rows than on its own 64 x 64 tiles, so it keeps those.
template <class Tile>
using SwappedRowwiseEpilogue = fusion::Sm90EVT<
    fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Bf16, float, kRoundToNearest>,
    fusion::Sm90RowBroadcast<0, Tile, float, float, Stride<_0, _1, int64_t>>,
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRoundToNearest>,
                    fusion::Sm90ColBroadcast<0, Tile, float, float, Stride<_1, _0, int64_t>>, fusion::Sm90AccFetch>,
    fusion::Sm90ColBroadcast<0, Tile, Bf16, Bf16, Stride<_1, _0, int64_t>, 8, true>>;

struct Fp8FewRowsGemm {
  using Fp8 = cutlass::float_e4m3_t;
  using Tile = Shape<_128, _64, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor, 8, Bf16,
      cutlass::layout::ColumnMajor, 8, cutlass::epilogue::TmaWarpSpecializedCooperative,
      SwappedRowwiseEpilogue<Tile>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Fp8, cutlass::layout::RowMajor, 16, Fp8,
      cutlass::layout::ColumnMajor, 16, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static cudaError_t run(void* y, const void* x, const float* x_scales, const void* w, const float* w_scales,
                         const void* bias, int m, int n, int k, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
    const auto stride_w = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(n, k, 1));
    const auto stride_x = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(m, k, 1));
    const auto stride_y = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(n, m, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {n, m, k, 1},
                                  {static_cast<const Fp8*>(w), stride_w, static_cast<const Fp8*>(x), stride_x},
                                  {{}, nullptr, stride_y, static_cast<Bf16*>(y), stride_y}};
    args.epilogue.thread = {{x_scales}, {{w_scales}, {}, {}}, {static_cast<const Bf16*>(bias)}, {}};
    return run_cutlass_gemm<Gemm>(args, workspace, workspace_bytes, stream);
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

cudaError_t fp8_rowwise_gemm_few_rows(void* y, const void* x, const float* x_scales, const void* w,
                                      const float* w_scales, const void* bias, int m, int n, int k, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream) {
  if (m < 0 || n <= 0 || k <= 0) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  if (m > kFp8FewRows || k % 16 != 0 || n % 8 != 0 || !aligned16({y, x, w})) return cudaErrorNotSupported;
  return Fp8FewRowsGemm::run(y, x, x_scales, w, w_scales, bias, m, n, k, workspace, workspace_bytes, stream);
}

#else  // no sm_90a code in this build: the caller's bf16 path

cudaError_t int8_rowwise_gemm(void*, const int8_t*, const float*, const int8_t*, const float*, const void*, int, int,
                              int, void*, size_t, cudaStream_t) {
  return cudaErrorNotSupported;
}

cudaError_t fp8_rowwise_gemm_few_rows(void*, const void*, const float*, const void*, const float*, const void*, int,
                                      int, int, void*, size_t, cudaStream_t) {
  return cudaErrorNotSupported;
}

#endif

}  // namespace tessera::kernels::cuda
