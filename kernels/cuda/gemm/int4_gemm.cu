// kernels/cuda/gemm/int4_gemm.cu: int4_g128_gemm (see int4_gemm.h). CUTLASS's mixed-input mainloop
// keeps the narrow operand in registers, so it must be A: the problem is run transposed,
// yᵀ[n, m] = w[n, k] · xᵀ, with yᵀ column-major, which is y row-major. The bias is then a value per
// row of the transposed problem, a column broadcast. The weight is in CUTLASS's shuffled layout
// (quantized_weights.h), so each thread loads its fragment's 8 nibbles as one word from shared memory.
//
// Four tiles (n x m, k 64), picked by m, each the fastest of those measured on the H100 for the 7B
// linears at its m (bench/NOTES.md): 128 x 32 up to 32 rows, 128 x 64 up to 64, 128 x 128 up to 512,
// and 128 x 256 above, where the wider tile halves the weight's reads and conversions per output.
// Up to 128 rows the tiles are too few for 132 SMs, so those run stream-K (25-35% faster there).
#include "kernels/cuda/gemm/int4_gemm.h"

#include <type_traits>

#if defined(TESSERA_CUDA_SM90A)
#include "kernels/cuda/gemm/cutlass_gemm.cuh"
// After the GEMM headers: it uses their types without including them.
#include "cutlass/util/mixed_dtype_utils.hpp"
#endif

namespace tessera::kernels::cuda {

#if defined(TESSERA_CUDA_SM90A)
namespace {

using namespace cute;
constexpr int kGroup = 128;

// The shuffled layout of the weight (quantized_weights.h): an atom is one warp's A fragments of four
// 16 x 16 mma steps along k, a thread's values in the order 0, 2, 4, 6, 1, 3, 5, 7 (so a LOP3 turns
// nibbles i and i + 4 into one bf16 pair), tiled over [n, k] with the k atoms of a row tile together.
using ValueOrder = Layout<Shape<_2, _4>, Stride<_4, _1>>;
using WeightAtom = decltype(cutlass::compute_memory_reordering_atom<Bf16, Layout<Shape<_1, _4>>, ValueOrder>());
using KAtomsFirst = Step<_2, _1, _3>;
using WeightLayout = decltype(tile_to_shape(WeightAtom{}, Layout<Shape<int, int, int>, Stride<int64_t, _1, int64_t>>{},
                                            KAtomsFirst{}));

// acc + bias[row of the transposed problem]; a null bias reads as 0.
template <class Tile>
using BiasEpilogue =
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, Bf16, float, kRoundToNearest>,
                    fusion::Sm90AccFetch,
                    fusion::Sm90ColBroadcast<0, Tile, Bf16, float, Stride<_1, _0, int64_t>, 8, true>>;

// How a GEMM splits its work over the SMs: whole output tiles (data-parallel), or stream-K, which
// also splits the k loop of the tiles when there are too few tiles to fill the GPU (decode batches
// and short prompts: n / 128 tiles for m up to the tile's width) and adds the partial sums in a fixed
// order, so the result does not depend on timing.
enum class Split { kTiles, kStreamKHeuristic, kStreamK };

using StreamKMode = cutlass::gemm::kernel::detail::DecompositionMode;

template <class Tile, Split kSplit>
struct Int4Gemm {
  using Cluster = Shape<_1, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor, 8, Bf16,
      cutlass::layout::ColumnMajor, 8, cutlass::epilogue::TmaWarpSpecializedCooperative,
      BiasEpilogue<Tile>>::CollectiveOp;
  // A: the weight [n, k] with its group scales and minimums; B: x [m, k] k-major.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<cutlass::uint4b_t, Bf16, Bf16>, WeightLayout,
      32, Bf16, cutlass::layout::ColumnMajor, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Scheduler = std::conditional_t<kSplit == Split::kTiles, cutlass::gemm::PersistentScheduler,
                                       cutlass::gemm::StreamKScheduler>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(void* y, const void* x, const void* q, const void* scales,
                                            const void* mins, const void* bias, int m, int n, int k) {
    const WeightLayout layout_w = tile_to_shape(WeightAtom{}, make_shape(n, k, 1), KAtomsFirst{});
    const auto stride_x = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(m, k, 1));
    const auto stride_y = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(n, m, 1));
    const int groups = (k + kGroup - 1) / kGroup;
    const auto stride_s =
        cutlass::make_cute_packed_stride(typename Mainloop::StrideScale{}, make_shape(n, groups, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {n, m, k, 1},
                                  {static_cast<const cutlass::uint4b_t*>(q), layout_w, static_cast<const Bf16*>(x),
                                   stride_x, static_cast<const Bf16*>(scales), stride_s, kGroup,
                                   static_cast<const Bf16*>(mins)},
                                  {{}, nullptr, stride_y, static_cast<Bf16*>(y), stride_y}};
    args.epilogue.thread = {{}, {static_cast<const Bf16*>(bias)}, {}};
    if constexpr (kSplit != Split::kTiles)
      args.scheduler.decomposition_mode =
          kSplit == Split::kStreamK ? StreamKMode::StreamK : StreamKMode::Heuristic;
    return args;
  }

  static cudaError_t run(void* y, const void* x, const void* q, const void* scales, const void* mins,
                         const void* bias, int m, int n, int k, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
    return run_cutlass_gemm<Gemm>(arguments(y, x, q, scales, mins, bias, m, n, k), workspace, workspace_bytes, stream);
  }
};

using Int4Gemm32 = Int4Gemm<Shape<_128, _32, _64>, Split::kStreamKHeuristic>;
using Int4Gemm64 = Int4Gemm<Shape<_128, _64, _64>, Split::kStreamKHeuristic>;
using Int4Gemm128StreamK = Int4Gemm<Shape<_128, _128, _64>, Split::kStreamK>;
using Int4Gemm128 = Int4Gemm<Shape<_128, _128, _64>, Split::kTiles>;
using Int4Gemm256 = Int4Gemm<Shape<_128, _256, _64>, Split::kTiles>;

}  // namespace

cudaError_t int4_g128_gemm(void* y, const void* x, const void* q, const void* scales, const void* mins,
                           const void* bias, int m, int n, int k, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (m < 0 || n <= 0 || k <= 0) return cudaErrorInvalidValue;
  if (m == 0) return cudaSuccess;
  if (k % 64 != 0 || n % 16 != 0 || !aligned16({y, x, q, scales, mins})) return cudaErrorNotSupported;
  if (m <= 32) return Int4Gemm32::run(y, x, q, scales, mins, bias, m, n, k, workspace, workspace_bytes, stream);
  if (m <= 64) return Int4Gemm64::run(y, x, q, scales, mins, bias, m, n, k, workspace, workspace_bytes, stream);
  if (m <= 128)
    return Int4Gemm128StreamK::run(y, x, q, scales, mins, bias, m, n, k, workspace, workspace_bytes, stream);
  if (m <= 512) return Int4Gemm128::run(y, x, q, scales, mins, bias, m, n, k, workspace, workspace_bytes, stream);
  return Int4Gemm256::run(y, x, q, scales, mins, bias, m, n, k, workspace, workspace_bytes, stream);
}

#else  // no sm_90a code in this build: the caller's bf16 path

cudaError_t int4_g128_gemm(void*, const void*, const void*, const void*, const void*, const void*, int, int, int,
                           void*, size_t, cudaStream_t) {
  return cudaErrorNotSupported;
}

#endif

}  // namespace tessera::kernels::cuda
