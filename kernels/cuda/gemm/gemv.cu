// kernels/cuda/gemm/gemv.cu: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias) for m <= 8, bound by streaming w
// once from DRAM; the only place its templates are instantiated. Two kernels (gemv.h says which runs):
//   - the row-streaming kernel, for m = 1: gemv_rows.cuh's skeleton (rows per warp, the streaming
//     loads, the main loop, the reduction and the epilogue), where a loaded vector holds 8 weights of
//     the activation dtype, each multiplied with the same 8 values of x in fp32. A warp instruction
//     reads 512 bytes of one row: 97% of copy bandwidth on the H100. Its fp32 FMAs grow with m and
//     run out of issue slots: 71% at m = 8;
//   - the tensor-core kernel, for m = 2..8: the same stream into m16n8k16 MMAs, 91-92% at every m.
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/mma.cuh"
#include "kernels/cuda/gemm/gemv.h"
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

// Tensor-core GEMV: a block owns 16 rows of w (the MMA's M) and its warps split k; the m <= 8 rows
// of x are the MMA's N. Lane (g, t) = (lane / 4, lane % 4) loads 16-byte vectors of w rows g and
// g + 8 and of x row g at the same k: the 8 values of such a vector fill the lane's k slots of two
// m16n8k16 MMAs. A dot product does not care which k a slot holds as long as w and x agree, so the
// fragments come straight from the loads, with no shuffles or shared-memory staging. Each output's
// sum depends only on its own x row, never on m: a row decoded alone and inside a batch of up to 8
// (a speculative verify) get the same bits.
constexpr int kMmaWarps = 8;  // k slices a block splits (8 measured above 4 at every m on the H100)
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaRows = 16;  // w rows a block owns
constexpr int kMmaChunks = 4;   // 32-value pieces of k a lane loads per step for each of its two rows

template <typename T, bool kSiluMul>
__global__ void __launch_bounds__(kMmaThreads) gemv_mma_kernel(T* y, const T* x, const T* __restrict__ w,
                                                               const T* __restrict__ bias, int m, int n, int k) {
  __shared__ float partial[kMmaWarps - 1][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kMmaRows;
  const int kv = k >> 3;  // 16-byte vectors a row
  const int chunks = (kv + 3) >> 2;  // 32-value pieces a row (4 vectors, one a lane of the group)
  const int per_warp = (chunks + kMmaWarps - 1) / kMmaWarps;
  const int c_begin = warp * per_warp, c_end = min(c_begin + per_warp, chunks);
  // Rows past n re-read row n - 1 (never stored); x rows past m are zeros.
  const uint4* w_lo = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(min(row0 + g, n - 1)) * kv + t;
  const uint4* w_hi =
      reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(min(row0 + g + 8, n - 1)) * kv + t;
  const uint4* x_row = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(min(g, m - 1)) * kv + t;
  const uint64_t policy = gemv_rows::evict_first_policy();
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  auto in_range = [&](int c) { return c < c_end && c * 4 + t < kv; };

  uint4 lo[kMmaChunks], hi[kMmaChunks];
  auto load_w = [&](int c0) {
#pragma unroll
    for (int u = 0; u < kMmaChunks; ++u) {
      const bool valid = in_range(c0 + u);
      lo[u] = valid ? gemv_rows::load_weight(w_lo + (c0 + u) * 4, policy) : zero;
      hi[u] = valid ? gemv_rows::load_weight(w_hi + (c0 + u) * 4, policy) : zero;
    }
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  load_w(c_begin);  // w is a parameter: its first loads go out before the wait (gemv.h)
  pdl_wait_previous();
  pdl_launch_dependents();
  for (int c = c_begin; c < c_end; c += kMmaChunks) {
    uint4 xv[kMmaChunks], a_lo[kMmaChunks], a_hi[kMmaChunks];
#pragma unroll
    for (int u = 0; u < kMmaChunks; ++u) {
      xv[u] = g < m && in_range(c + u) ? x_row[(c + u) * 4] : zero;
      a_lo[u] = lo[u];
      a_hi[u] = hi[u];
    }
    if (c + kMmaChunks < c_end) load_w(c + kMmaChunks);  // the next step's weights stream meanwhile
#pragma unroll
    for (int u = 0; u < kMmaChunks; ++u) {
      // A: (row g, slots 2t, 2t+1), (row g+8, same), (row g, slots 2t+8, 2t+9), (row g+8, same);
      // B: x row g at the same slots. Values 0-3 of the vectors feed one MMA, 4-7 the other.
      mma_16816<T>(acc, {a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y}, xv[u].x, xv[u].y);
      mma_16816<T>(acc, {a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w}, xv[u].z, xv[u].w);
    }
  }

  // The k slices' sums, added in warp order (fixed, so the bits never depend on timing).
  if (warp > 0) {
#pragma unroll
    for (int q = 0; q < 4; ++q) partial[warp - 1][lane][q] = acc[q];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int p = 0; p < kMmaWarps - 1; ++p)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] += partial[p][lane][q];

  // acc[2h + j] is (w row row0 + g + 8h, x row 2t + j).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = 2 * t + j;
      if constexpr (kSiluMul) {
        // Pairs order: the up row 2p + 1 sits in lane + 4 (g + 1) of its gate row 2p (g even).
        const float up = __shfl_down_sync(0xffffffffu, acc[2 * h + j], 4);
        if (g % 2 == 0 && i < m && row < n)
          y[static_cast<int64_t>(i) * (n / 2) + row / 2] = from_float<T>(silu(acc[2 * h + j]) * up);
      } else if (i < m && row < n) {
        const float out = acc[2 * h + j] + (bias != nullptr ? to_float(bias[row]) : 0.f);
        y[static_cast<int64_t>(i) * n + row] = from_float<T>(out);
      }
    }
  }
}

template <typename T, bool kSiluMul>
cudaError_t launch_gemv_mma(T* y, const T* x, const T* w, const T* bias, int m, int n, int k, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + kMmaRows - 1) / kMmaRows));
  return launch_with_pdl(gemv_mma_kernel<T, kSiluMul>, grid, dim3(kMmaThreads), 0, stream, y, x, w, bias, m, n, k);
}

// The row-streaming kernel at m = 1 unless the caller needs the same bits at every m; the
// tensor-core kernel otherwise.
template <typename T, bool kSiluMul>
cudaError_t launch_gemv_m(T* y, const T* x, const T* w, const T* bias, int m, int n, int k, GemvRowBits row_bits,
                          cudaStream_t stream) {
  if (m > 1 || row_bits == GemvRowBits::kSameAtAnyM)
    return launch_gemv_mma<T, kSiluMul>(y, x, w, bias, m, n, k, stream);
  constexpr int R = gemv_rows::rows_per_warp<1>();
  constexpr int kRowsPerBlock = R * kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock));
  return launch_with_pdl(gemv_kernel<T, 1, R, kSiluMul>, grid, dim3(kThreads), 0, stream, y, x, w, bias, n, k);
}

}  // namespace

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
