// kernels/cuda/gemm/gemv.cu: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias) for m <= 8, bound by streaming w
// once from DRAM; the only place its templates are instantiated.
//
// Each warp owns R consecutive rows of w (output columns). A step loads 8 16-byte vectors of w per
// lane (R rows x U = 8 / R vectors, a warp covers 32·U contiguous vectors of each row) with an L2
// evict-first hint and no L1 allocation, then reads the matching vectors of the m rows of x (tiny,
// shared by every warp, so they stay in L1) and accumulates m x R dot products in fp32. The m·R sums
// are reduced across the warp at the end; bias is added in fp32 and each output rounded once.
// gemv_silu_mul's epilogue: R is even, so a warp's rows are whole (gate, up) pairs; the up sum moves
// to its gate's lane with one shuffle, and silu(gate) · up is rounded once.
#include <type_traits>

#include "kernels/cuda/activation/activation.cuh"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/gemm/gemv.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int kLoadsPerLane = 8;  // 16-byte w vectors in flight per lane per step

// Rows per warp: with more rows each x vector read from L1 feeds more w vectors, which matters once
// several x rows are read per w vector; at m <= 2 fewer rows per warp give a finer grid.
template <int M>
constexpr int rows_per_warp() {
  return M <= 2 ? 2 : 4;  // even: gemv_silu_mul's (gate, up) row pairs never straddle two warps
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

// kSiluMul: y is [M, n / 2], y[i, j] = silu(sum of row 2j) · sum of row 2j + 1 (bias is null).
template <typename T, int M, int R, bool kSiluMul>
__global__ void __launch_bounds__(kThreads) gemv_kernel(T* y,                           // [M, n]
                                                        const T* x,                     // [M, k]
                                                        const T* __restrict__ w,        // [n, k]
                                                        const T* __restrict__ bias,     // [n] or null
                                                        int n, int k) {
  constexpr int U = kLoadsPerLane / R;  // vectors of each row per lane per step
  constexpr int kStep = 32 * U;         // vectors of each row per warp per step
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (row0 >= n) return;  // the last block's spare warps
  const int kv = k >> 3;  // 16-byte vectors per row
  const uint64_t policy = evict_first_policy();
  // Rows past n (n not a multiple of R) re-read row n - 1 and are never stored.
  const uint4* w_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    w_row[r] = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(min(row0 + r, n - 1)) * kv + lane;
  const uint4* x_lane = reinterpret_cast<const uint4*>(x) + lane;

  uint4 wv[R][U];
  // kGuard: the last, partial step (kv not a multiple of kStep); vectors past the row are skipped.
  auto load_step = [&](int v, auto guard_tag) {
    constexpr bool kGuard = decltype(guard_tag)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kGuard && v + u * 32 + lane >= kv) continue;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][u] = load_weight(w_row[r] + v + u * 32, policy);
    }
  };
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.f;
  auto fma_step = [&](int v, auto guard_tag) {
    constexpr bool kGuard = decltype(guard_tag)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kGuard && v + u * 32 + lane >= kv) continue;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        Vec8<T> t;
        t.raw = wv[r][u];
        vec8_to_float(t, wf[r]);
      }
#pragma unroll
      for (int i = 0; i < M; ++i) {
        Vec8<T> t;
        t.raw = x_lane[i * kv + v + u * 32];
        float xf[8];
        vec8_to_float(t, xf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[i][r] = fmaf(xf[e], wf[r][e], acc[i][r]);
      }
    }
  };

  const int full_steps = kv / kStep;
  const bool has_tail = kv % kStep != 0;
  // The first step's weights go out before the programmatic-launch wait (w is a parameter, never
  // written by the kernel before: gemv.h); x is read only after it.
  if (full_steps > 0)
    load_step(0, std::false_type{});
  else
    load_step(0, std::true_type{});
  pdl_wait_previous();
  pdl_launch_dependents();
  for (int s = 0; s < full_steps; ++s) {
    if (s > 0) load_step(s * kStep, std::false_type{});
    fma_step(s * kStep, std::false_type{});
  }
  if (has_tail) {
    if (full_steps > 0) load_step(full_steps * kStep, std::true_type{});
    fma_step(full_steps * kStep, std::true_type{});
  }

  // Every lane gets every sum; lane i·R + r stores output (i, row0 + r).
  float out = 0.f;
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = warp_sum(acc[i][r]);
      if (lane == i * R + r) out = s;
    }
  const int row = row0 + lane % R;
  if constexpr (kSiluMul) {
    const float up = __shfl_down_sync(0xffffffffu, out, 1);  // row + 1's sum, for the even rows
    if (lane < M * R && row < n && row % 2 == 0)
      y[static_cast<int64_t>(lane / R) * (n / 2) + row / 2] = from_float<T>(silu(out) * up);
  } else if (lane < M * R && row < n) {
    if (bias != nullptr) out += to_float(bias[row]);
    y[static_cast<int64_t>(lane / R) * n + row] = from_float<T>(out);
  }
}

template <typename T, int M, bool kSiluMul>
cudaError_t launch_gemv(T* y, const T* x, const T* w, const T* bias, int n, int k, cudaStream_t stream) {
  constexpr int R = rows_per_warp<M>();
  constexpr int kRowsPerBlock = R * kWarpsPerBlock;
  // Programmatic dependent launch: the launch and the first weight loads overlap the tail of the
  // previous kernel; griddepcontrol.wait holds every read of x until it has finished.
  return launch_with_pdl(gemv_kernel<T, M, R, kSiluMul>, dim3(static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock)),
                         dim3(kThreads), 0, stream, y, x, w, bias, n, k);
}

template <typename T, bool kSiluMul>
cudaError_t launch_gemv_m(T* y, const T* x, const T* w, const T* bias, int m, int n, int k, cudaStream_t stream) {
  switch (m) {
    case 1: return launch_gemv<T, 1, kSiluMul>(y, x, w, bias, n, k, stream);
    case 2: return launch_gemv<T, 2, kSiluMul>(y, x, w, bias, n, k, stream);
    case 3: return launch_gemv<T, 3, kSiluMul>(y, x, w, bias, n, k, stream);
    case 4: return launch_gemv<T, 4, kSiluMul>(y, x, w, bias, n, k, stream);
    case 5: return launch_gemv<T, 5, kSiluMul>(y, x, w, bias, n, k, stream);
    case 6: return launch_gemv<T, 6, kSiluMul>(y, x, w, bias, n, k, stream);
    case 7: return launch_gemv<T, 7, kSiluMul>(y, x, w, bias, n, k, stream);
    case 8: return launch_gemv<T, 8, kSiluMul>(y, x, w, bias, n, k, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool gemv_supported(int m, int n, int k, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxM && n > 0 && k > 0 && k % 8 == 0 && is_aligned16(x) && is_aligned16(w);
}

cudaError_t gemv(DType dtype, void* y, const void* x, const void* w, const void* bias, int m, int n, int k,
                 cudaStream_t stream) {
  if (!gemv_supported(m, n, k, x, w)) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_gemv_m<scalar_t, false>(static_cast<scalar_t*>(y), static_cast<const scalar_t*>(x),
                                          static_cast<const scalar_t*>(w), static_cast<const scalar_t*>(bias), m, n, k,
                                          stream);
  });
}

cudaError_t gemv_silu_mul(DType dtype, void* out, const void* x, const void* w, int m, int n, int k,
                          cudaStream_t stream) {
  if (!gemv_supported(m, n, k, x, w) || n % 2 != 0) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_gemv_m<scalar_t, true>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x),
                                         static_cast<const scalar_t*>(w), nullptr, m, n, k, stream);
  });
}

}  // namespace tessera::kernels::cuda
