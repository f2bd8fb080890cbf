// kernels/cuda/gemm/gemv_mma.cuh: the tensor-core GEMV skeleton that gemv.cu (bf16 / fp16 weights)
// and quantized_weights.cu (int8 and fp8_e4m3 weights, one scale a row) share for decode batches:
// y[m, n] = x[m, k] · w[n, k]ᵀ with m <= 8 on m16n8k16 MMAs.
//
// A block owns 16 rows of w (the MMA's M), and its warps split k; the m rows of x are the MMA's N.
// Lane (g, t) = (lane / 4, lane % 4) loads a 16-byte vector of w rows g and g + 8, and the x values
// at the same k of x row g. The format turns each weight vector into pairs of the activation type,
// and the pairs fill the lane's k slots of kValues / 4 MMAs as loaded. A dot product does not care
// which k a slot holds, as long as w and x agree, so no shuffle or shared-memory staging forms a
// fragment. Each output depends on its own x row only: a row alone and among up to 8 get the same
// bits. Per-row scales and the bias are applied once, after the warps' sums are added in warp order.
#pragma once

#include <cstdint>

#include "kernels/cuda/activation/activation.cuh"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/mma.cuh"
#include "kernels/cuda/gemm/gemv_rows.cuh"

namespace tessera::kernels::cuda::gemv_mma {

inline constexpr int kWarps = 8;  // k slices a block splits (8 measured above 4 at every m on the H100)
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRows = 16;          // w rows a block owns
inline constexpr int kVectorsPerStep = 4;  // weight vectors a lane loads per step for each of its two rows

// Format: static constexpr int kValues (weights in a 16-byte vector: 8 or 16) and
// static void pairs(const uint4&, uint32_t (&)[kValues / 2]) (consecutive weights as packed pairs of
// T). ScaleRow(sum, row): the output of w row `row` before the bias.
template <typename T, typename Format, bool kSiluMul, typename ScaleRow>
__device__ __forceinline__ void gemv(T* y, const T* x, const uint4* __restrict__ w, const T* __restrict__ bias,
                                     int m, int n, int k, ScaleRow&& scale_row) {
  constexpr int kValues = Format::kValues, kXVectors = kValues / 8;
  __shared__ float partial[kWarps - 1][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kRows;
  const int kv = k / kValues;        // weight vectors a row
  const int pieces = (kv + 3) >> 2;  // 4 vectors a piece, one for each lane of a row's group
  const int per_warp = (pieces + kWarps - 1) / kWarps;
  const int p_begin = warp * per_warp, p_end = min(p_begin + per_warp, pieces);
  // Rows past n re-read row n - 1 (never stored); x rows past m are zeros.
  const uint4* w_lo = w + static_cast<int64_t>(min(row0 + g, n - 1)) * kv + t;
  const uint4* w_hi = w + static_cast<int64_t>(min(row0 + g + 8, n - 1)) * kv + t;
  const uint4* x_row =
      reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(min(g, m - 1)) * (k / 8) + t * kXVectors;
  const uint64_t policy = gemv_rows::evict_first_policy();
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  auto in_range = [&](int p) { return p < p_end && p * 4 + t < kv; };

  uint4 lo[kVectorsPerStep], hi[kVectorsPerStep];
  auto load_w = [&](int p0) {
#pragma unroll
    for (int u = 0; u < kVectorsPerStep; ++u) {
      const bool valid = in_range(p0 + u);
      lo[u] = valid ? gemv_rows::load_weight(w_lo + (p0 + u) * 4, policy) : zero;
      hi[u] = valid ? gemv_rows::load_weight(w_hi + (p0 + u) * 4, policy) : zero;
    }
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  load_w(p_begin);  // w is a parameter: its first loads go out before the wait (gemv.h)
  pdl_wait_previous();
  pdl_launch_dependents();
  for (int p = p_begin; p < p_end; p += kVectorsPerStep) {
    uint4 xv[kVectorsPerStep][kXVectors], a_lo[kVectorsPerStep], a_hi[kVectorsPerStep];
#pragma unroll
    for (int u = 0; u < kVectorsPerStep; ++u) {
      const bool valid = g < m && in_range(p + u);
#pragma unroll
      for (int q = 0; q < kXVectors; ++q) xv[u][q] = valid ? x_row[(p + u) * 4 * kXVectors + q] : zero;
      a_lo[u] = lo[u];
      a_hi[u] = hi[u];
    }
    if (p + kVectorsPerStep < p_end) load_w(p + kVectorsPerStep);  // the next step's weights stream now
#pragma unroll
    for (int u = 0; u < kVectorsPerStep; ++u) {
      uint32_t pl[kValues / 2], ph[kValues / 2];
      Format::pairs(a_lo[u], pl);
      Format::pairs(a_hi[u], ph);
      const uint32_t* xw = reinterpret_cast<const uint32_t*>(xv[u]);
      // MMA j: A (row g, slots 2t, 2t+1) = pair 2j, (row g+8, same), (row g, slots 2t+8, 2t+9) = pair
      // 2j + 1, (row g+8, same); B: x row g's pairs 2j and 2j + 1 at the same k.
#pragma unroll
      for (int j = 0; j < kValues / 4; ++j)
        mma_16816<T>(acc, {pl[2 * j], ph[2 * j], pl[2 * j + 1], ph[2 * j + 1]}, xw[2 * j], xw[2 * j + 1]);
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
  for (int s = 0; s < kWarps - 1; ++s)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] += partial[s][lane][q];

  // acc[2h + j] is (w row row0 + g + 8h, x row 2t + j).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = 2 * t + j;
      const float out = scale_row(acc[2 * h + j], min(row, n - 1));
      if constexpr (kSiluMul) {
        // Pairs order: the up row 2p + 1 sits in lane + 4 (g + 1) of its gate row 2p (g even).
        const float up = __shfl_down_sync(0xffffffffu, out, 4);
        if (g % 2 == 0 && i < m && row < n)
          y[static_cast<int64_t>(i) * (n / 2) + row / 2] = from_float<T>(silu(out) * up);
      } else if (i < m && row < n) {
        y[static_cast<int64_t>(i) * n + row] = from_float<T>(out + (bias != nullptr ? to_float(bias[row]) : 0.f));
      }
    }
  }
}

// Whether a GEMV of m rows takes the tensor-core kernel: from min_rows rows (where it beats the
// row-streaming one for the format), unless the caller needs the bits the row-streaming kernel
// gives a row alone at m = 1, at every m.
inline bool takes(int m, int min_rows, GemvRowBits row_bits) {
  return row_bits == GemvRowBits::kFastest && m >= min_rows;
}

// Launches kernel (a __global__ wrapper of gemv above) over n rows of w, with programmatic dependent
// launch: the first weight loads overlap the previous kernel's tail.
template <typename Kernel, typename... Args>
cudaError_t launch(Kernel kernel, int n, cudaStream_t stream, Args... args) {
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows));
  return launch_with_pdl(kernel, grid, dim3(kThreads), 0, stream, args...);
}

}  // namespace tessera::kernels::cuda::gemv_mma
