// kernels/cuda/gemm/gemv_rows.cuh: the row-streaming skeleton the decode GEMVs share (gemv.cu over
// bf16/fp16 weights, quantized_weights.cu over int8 and fp8; gemv_mma.cuh is the tensor-core one they
// take at more rows): each warp owns R rows of w, a step loads 8 16-byte vectors of w per lane (R
// rows x U = 8 / R vectors, a warp covering 32·U contiguous vectors of each row) with an L2
// evict-first hint and no L1 allocation, then a kernel-given step turns each loaded vector into fp32
// and multiplies it with the matching x (tiny, shared by every warp, so it stays in L1). The m·R sums are reduced across the warp at the end, and the epilogue stores them: a per-row
// scale (quantized weights), bias, rounded once; or, in pairs order (kSiluMul), silu(gate) · up, the
// up sum moved to its gate's lane by one shuffle.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/activation/activation.cuh"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/gemm/gemv.h"

namespace tessera::kernels::cuda::gemv_rows {

inline constexpr int kWarpsPerBlock = 4;
inline constexpr int kThreads = 32 * kWarpsPerBlock;
inline constexpr int kLoadsPerLane = 8;  // 16-byte w vectors in flight per lane per step

// Fewer rows of w than this put under 4 warps on each of an H100's 132 SMs at 4 rows a warp, too
// few to keep the weight stream in flight.
inline constexpr int kFewRows = 2048;

// Launches kernel_of(std::integral_constant<int, M>{}, std::integral_constant<int, R>{}) (the kernel
// instantiated for M rows of x and R rows of w a warp) over n rows of w, one block per
// R · kWarpsPerBlock rows, with programmatic dependent launch: the launch and the first weight loads
// overlap the tail of the previous kernel, and griddepcontrol.wait holds every read of x until it
// has finished.
template <int M, int R, typename KernelOf, typename... Args>
cudaError_t launch_rows_per_warp(int n, cudaStream_t stream, KernelOf&& kernel_of, Args... args) {
  constexpr int kRowsPerBlock = R * kWarpsPerBlock;
  return launch_with_pdl(kernel_of(std::integral_constant<int, M>{}, std::integral_constant<int, R>{}),
                         dim3(static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock)), dim3(kThreads), 0,
                         stream, args...);
}

// launch_rows_per_warp at R rows a warp (even: the (gate, up) row pairs of pairs order never straddle
// two warps). With 4 rows each x vector read from L1 feeds more w vectors, which matters once several
// x rows are read per w vector; at m <= 2, and for a w of fewer than kFewRows rows, 2 rows a warp
// give a finer grid.
template <int M, typename KernelOf, typename... Args>
cudaError_t launch_rows(int n, cudaStream_t stream, KernelOf&& kernel_of, Args... args) {
  if constexpr (M > 2) {
    if (n >= kFewRows) return launch_rows_per_warp<M, 4>(n, stream, kernel_of, args...);
  }
  return launch_rows_per_warp<M, 2>(n, stream, kernel_of, args...);
}

// launch_rows for a runtime m in 1..8 (every M instantiated).
template <typename KernelOf, typename... Args>
cudaError_t launch_for_m(int m, int n, cudaStream_t stream, KernelOf&& kernel_of, Args... args) {
  switch (m) {
    case 1: return launch_rows<1>(n, stream, kernel_of, args...);
    case 2: return launch_rows<2>(n, stream, kernel_of, args...);
    case 3: return launch_rows<3>(n, stream, kernel_of, args...);
    case 4: return launch_rows<4>(n, stream, kernel_of, args...);
    case 5: return launch_rows<5>(n, stream, kernel_of, args...);
    case 6: return launch_rows<6>(n, stream, kernel_of, args...);
    case 7: return launch_rows<7>(n, stream, kernel_of, args...);
    case 8: return launch_rows<8>(n, stream, kernel_of, args...);
  }
  return cudaErrorInvalidValue;
}

__device__ __forceinline__ uint64_t evict_first_policy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
#else
  return 0;
#endif
}

// Every weight byte is read once per step: keep it out of L1 and first in line for L2 eviction.
__device__ __forceinline__ uint4 load_weight(const uint4* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
#else
  (void)policy;
  return __ldg(p);
#endif
}

// acc[i][r] += x_vector(i) · wf[r] for the M rows of x: x_vector(i) is row i's 16-byte vector (8
// values of T) that meets the 8 weights wf[r] of each of the warp's R rows.
template <typename T, int M, int R, typename XVector>
__device__ __forceinline__ void fma_x_rows(XVector&& x_vector, const float (&wf)[R][8], float (&acc)[M][R]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    Vec8<T> t;
    t.raw = x_vector(i);
    float xf[8];
    vec8_to_float(t, xf);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][r] = fmaf(xf[e], wf[r][e], acc[i][r]);
  }
}

// From this many rows of x a step's FMAs take about as long as its loads: the next step's loads go
// out before them so that the two overlap, and the sums are reduced by reduce_scatter_sums.
inline constexpr int kOverlapFromM = 3;

// The M·R sums (acc[i][r] at i·R + r, the rest zero) reduced across the warp in warp_sum's tree
// (partners 16, 8, 4, 2, 1 lanes apart, each adding what it holds to what it receives), so each sum
// has the bits warp_sum gives it; but each level sends only the half of the sums the partner goes
// on with: 31 shuffles in all instead of 5 a sum. Lane j returns sum j.
// One level of reduce_scatter_sums: lanes kHalf apart exchange halves of the kHalf·2 sums v holds.
template <int kHalf>
__device__ __forceinline__ void reduce_scatter_level(float (&v)[32], int lane) {
  const bool upper = (lane & kHalf) != 0;  // this lane goes on with the upper half
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const float send = upper ? v[j] : v[j + kHalf];
    const float keep = upper ? v[j + kHalf] : v[j];
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, kHalf);
  }
  if constexpr (kHalf > 1) reduce_scatter_level<kHalf / 2>(v, lane);
}

template <int M, int R>
__device__ __forceinline__ float reduce_scatter_sums(const float (&acc)[M][R], int lane) {
  static_assert(M * R <= 32, "one sum a lane");
  float v[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) v[j] = j < M * R ? acc[j / R][j % R] : 0.f;
  reduce_scatter_level<16>(v, lane);
  return v[0];
}

// The warp's sums over rows [row0, row0 + R) of w (kv 16-byte vectors a row; rows past n re-read
// row n - 1, whose sums are never stored) against the M rows of x. fma_vector(wv, u, v, acc) adds
// to acc[M][R] the products of the loaded vectors wv[r][u] (vector v + u·32 + lane of their rows, v
// the step's first) with the matching x. Lane i·R + r returns sum (i, row0 + r). A lane adds its
// vectors lane, lane + 32, lane + 64, ... in that order and the warp's lanes in warp_sum's tree,
// whatever M, R and the step size, so a row's sum has the same bits at every M.
//
// The first step's weights go out before the programmatic-launch wait (w is a parameter, never
// written by the kernel before: gemv.h); x is read only after it.
template <int M, int R, typename FmaVector>
__device__ __forceinline__ float warp_row_sums(const uint4* w, int row0, int n, int kv, int lane,
                                               FmaVector&& fma_vector) {
  constexpr int U = kLoadsPerLane / R;  // vectors of each row per lane per step
  constexpr int kStep = 32 * U;         // vectors of each row per warp per step
  const uint64_t policy = evict_first_policy();
  const uint4* w_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w_row[r] = w + static_cast<int64_t>(min(row0 + r, n - 1)) * kv + lane;

  // kGuard: the last, partial step (kv not a multiple of kStep); vectors past the row are skipped.
  auto load_step = [&](uint4(&buf)[R][U], int v, auto guard_tag) {
    constexpr bool kGuard = decltype(guard_tag)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kGuard && v + u * 32 + lane >= kv) continue;
#pragma unroll
      for (int r = 0; r < R; ++r) buf[r][u] = load_weight(w_row[r] + v + u * 32, policy);
    }
  };
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.f;
  auto fma_step = [&](const uint4(&buf)[R][U], int v, auto guard_tag) {
    constexpr bool kGuard = decltype(guard_tag)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kGuard && v + u * 32 + lane >= kv) continue;
      fma_vector(buf, u, v, acc);
    }
  };

  const int full_steps = kv / kStep;
  const bool has_tail = kv % kStep != 0;
  uint4 wv[R][U];
  if (full_steps > 0)
    load_step(wv, 0, std::false_type{});
  else
    load_step(wv, 0, std::true_type{});
  pdl_wait_previous();
  pdl_launch_dependents();
  if constexpr (M >= kOverlapFromM) {
    uint4 next[R][U];
    for (int s = 0; s < full_steps; ++s) {
      const int v_next = (s + 1) * kStep;
      if (s + 1 < full_steps)
        load_step(next, v_next, std::false_type{});
      else if (has_tail)
        load_step(next, v_next, std::true_type{});
      fma_step(wv, s * kStep, std::false_type{});
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int u = 0; u < U; ++u) wv[r][u] = next[r][u];
    }
    if (has_tail) fma_step(wv, full_steps * kStep, std::true_type{});
    return reduce_scatter_sums<M, R>(acc, lane);
  } else {
    for (int s = 0; s < full_steps; ++s) {
      if (s > 0) load_step(wv, s * kStep, std::false_type{});
      fma_step(wv, s * kStep, std::false_type{});
    }
    if (has_tail) {
      if (full_steps > 0) load_step(wv, full_steps * kStep, std::true_type{});
      fma_step(wv, full_steps * kStep, std::true_type{});
    }
    float out = 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float sum = warp_sum(acc[i][r]);
        if (lane == i * R + r) out = sum;
      }
    return out;
  }
}

// Stores the lane's sum from warp_row_sums as y[lane / R, row0 + lane % R]: scale_row(sum, row) (a
// quantized weight's row scale; the sum itself for a dense one) plus bias, rounded once. kSiluMul:
// y is [M, n / 2], y[i, j] = silu(row 2j's output) · row 2j + 1's (bias is null).
template <typename T, int M, int R, bool kSiluMul, typename ScaleRow>
__device__ __forceinline__ void store_row_sums(T* y, float out, const T* bias, int row0, int n, int lane,
                                               ScaleRow&& scale_row) {
  const int row = row0 + lane % R;
  if constexpr (kSiluMul) {
    // Rows past n are never paired (n is even): the scale read is clamped, the value unused.
    out = scale_row(out, min(row, n - 1));
    const float up = __shfl_down_sync(0xffffffffu, out, 1);  // row + 1's output, for the even rows
    if (lane < M * R && row < n && row % 2 == 0)
      y[static_cast<int64_t>(lane / R) * (n / 2) + row / 2] = from_float<T>(silu(out) * up);
  } else if (lane < M * R && row < n) {
    out = scale_row(out, row);
    if (bias != nullptr) out += to_float(bias[row]);
    y[static_cast<int64_t>(lane / R) * n + row] = from_float<T>(out);
  }
}

}  // namespace tessera::kernels::cuda::gemv_rows
