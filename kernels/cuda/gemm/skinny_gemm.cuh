// kernels/cuda/gemm/skinny_gemm.cuh: the tensor-core skeleton for y[m, n] = x[m, k] · w[n, k]ᵀ at
// 9-64 rows of x (a decode batch), bound by streaming w once from DRAM, as gemv_mma.cuh is up to
// 8 rows.
//
// The MMA operands are formed as gemv_mma.cuh forms them: lane (g, t) takes a 16-byte vector of w
// rows g and g + 8 and, for each 8-row tile j of x, the 16 bytes of x row 8j + g at the same k;
// a dot product does not care which k a slot holds, as long as w and x agree. What changes with
// more rows of x:
//   - each MMA step takes longer, so w no longer streams through registers: each lane keeps kStages
//     steps of its own vectors in flight in a cp.async ring in shared memory (64 KB a block), enough
//     bytes in flight to stream at DRAM speed with few warps;
//   - a warp owns 16 rows of w and every x row, so each loaded w vector feeds one MMA per x tile;
//   - the block's warps own different rows of w over the same k, so they read the same x vectors at
//     about the same time, which L1 serves after the first;
//   - a block owns kRows rows of w over a slice of k; splits of k (gridDim.y) give the GPU enough
//     blocks when n is small. Each split stores its fp32 sums, and the last split of a row tile to
//     finish (an acquire-release counter, as the decode attention merges its splits) adds them in
//     split order and stores y, so the bits never depend on timing. The counter returns to 0.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/kernel_attributes.cuh"
#include "kernels/cuda/common/mma.cuh"

namespace tessera::kernels::cuda::skinny {

inline constexpr int kWarps = 4;           // w row groups of 16 a block
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRows = 16 * kWarps;  // w rows a block owns
inline constexpr int kVectorsPerStep = 4;  // w vectors a lane takes per step for each of its two rows
inline constexpr int kStages = 4;          // steps of w in flight a lane (its cp.async ring)
inline constexpr int kBlocksPerSm = 3;     // what the ring (64 KB a block) and __launch_bounds__ allow
inline constexpr int kMinM = 9, kMaxM = 64;
// Each lane's ring: kStages steps of its 2 · kVectorsPerStep vectors, laid out so that a warp's 32
// lanes read 512 contiguous bytes (no bank conflicts).
inline constexpr int kRingBytes = kWarps * 32 * kStages * kVectorsPerStep * 2 * 16;

// How k is split: splits (gridDim.y) and the 32-value pieces (4 vectors, one a lane of a row's
// group) each split covers.
struct Split {
  int splits = 1;
  int pieces_per_split = 0;
};

// kTiles: 8-row tiles of x (m <= 8 · kTiles). Format and ScaleRow as gemv_mma::gemv. Needs kRingBytes
// of dynamic shared memory.
template <typename T, typename Format, int kTiles, typename ScaleRow>
__device__ __forceinline__ void gemm(T* y, const T* x, const uint4* __restrict__ w, const T* __restrict__ bias, int m,
                                     int n, int k, int pieces_per_split, float* partials, int* counters,
                                     ScaleRow&& scale_row) {
  constexpr int kValues = Format::kValues, kXVectors = kValues / 8;
  extern __shared__ uint4 ring[];
  __shared__ bool is_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.y, splits = gridDim.y;
  const int row0 = blockIdx.x * kRows + warp * 16;
  const int kv = k / kValues;        // weight vectors a row
  const int pieces = (kv + 3) >> 2;  // 4 vectors a piece, one for each lane of a row's group
  const int p_begin = split * pieces_per_split, p_end = min(p_begin + pieces_per_split, pieces);
  const int steps = (p_end - p_begin + kVectorsPerStep - 1) / kVectorsPerStep;
  // Rows past n re-read row n - 1 (never stored); x rows past m are zeros.
  const uint4* w_row[2] = {w + static_cast<int64_t>(min(row0 + g, n - 1)) * kv + t,
                           w + static_cast<int64_t>(min(row0 + g + 8, n - 1)) * kv + t};
  const uint4* x_lane = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(g) * (k / 8) + t * kXVectors;
  const int64_t x_tile_stride = static_cast<int64_t>(8) * (k / 8);  // x vectors in 8 rows
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  auto in_range = [&](int p) { return p < p_end && p * 4 + t < kv; };
  // This lane's vector u of row r in ring slot `slot`.
  uint4* my_ring = ring + warp * (32 * kStages * kVectorsPerStep * 2) + lane;
  auto ring_at = [&](int slot, int u, int r) { return my_ring + ((slot * kVectorsPerStep + u) * 2 + r) * 32; };
  const uint64_t policy = l2_evict_first_policy();
  // A lane copies only what it reads itself, so its own cp.async waits order the ring: no barrier.
  auto issue_step = [&](int i) {
    const int p0 = p_begin + i * kVectorsPerStep;
#pragma unroll
    for (int u = 0; u < kVectorsPerStep; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        cp_async16(smem_addr(ring_at(i % kStages, u, r)), w_row[r] + (p0 + u) * 4, in_range(p0 + u), policy);
  };

  float acc[kTiles][4] = {};
  // w is a parameter: the ring fills before the wait. One commit group a step, empty ones included,
  // so that the loop's wait count is uniform.
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    if (i < steps) issue_step(i);
    cp_async_commit();
  }
  pdl_wait_previous();
  pdl_launch_dependents();
  for (int i = 0; i < steps; ++i) {
    cp_async_wait<kStages - 1>();  // step i's group has landed
    asm volatile("" ::: "memory");
    const int p0 = p_begin + i * kVectorsPerStep;
#pragma unroll
    for (int u = 0; u < kVectorsPerStep; ++u) {
      // Every lane runs every MMA (a lane past k multiplies zero weights by zero x).
      const bool valid = in_range(p0 + u);
      uint32_t pl[kValues / 2], ph[kValues / 2];
      Format::pairs(*ring_at(i % kStages, u, 0), pl);
      Format::pairs(*ring_at(i % kStages, u, 1), ph);
      uint4 xv[kTiles][kXVectors];
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int q = 0; q < kXVectors; ++q)
          xv[j][q] = valid && 8 * j + g < m ? __ldg(x_lane + j * x_tile_stride + (p0 + u) * 4 * kXVectors + q) : zero;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const uint32_t* xw = reinterpret_cast<const uint32_t*>(xv[j]);
#pragma unroll
        for (int v = 0; v < kValues / 4; ++v)
          mma_16816<T>(acc[j], {pl[2 * v], ph[2 * v], pl[2 * v + 1], ph[2 * v + 1]}, xw[2 * v], xw[2 * v + 1]);
      }
    }
    // The slot's values are in registers and used: refill it with the step kStages ahead.
    asm volatile("" ::: "memory");
    if (i + kStages < steps) issue_step(i + kStages);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // acc[j][2h + c] is (w row row0 + g + 8h, x row 8j + 2t + c).
  auto for_each_sum = [&](auto&& f) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int row = row0 + g + 8 * h, i = 8 * j + 2 * t + c;
          if (row < n && i < m) f(acc[j][2 * h + c], row, i);
        }
  };
  auto store = [&](float sum, int row, int i) {
    y[static_cast<int64_t>(i) * n + row] =
        from_float<T>(scale_row(sum, row) + (bias != nullptr ? to_float(bias[row]) : 0.f));
  };
  if (splits == 1) {
    for_each_sum(store);
    return;
  }
  // partials: [splits, m, n] fp32.
  const int64_t split_stride = static_cast<int64_t>(m) * n;
  for_each_sum([&](float sum, int row, int i) { partials[split * split_stride + static_cast<int64_t>(i) * n + row] = sum; });
  __syncthreads();
  int* counter = counters + blockIdx.x;
  if (threadIdx.x == 0) {
    int ticket;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(ticket) : "l"(counter) : "memory");
    is_last = ticket == splits - 1;
  }
  __syncthreads();
  if (!is_last) return;
  for_each_sum([&](float, int row, int i) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += __ldcg(partials + s * split_stride + static_cast<int64_t>(i) * n + row);
    store(sum, row, i);
  });
  if (threadIdx.x == 0) *counter = 0;
}

// 8-row tiles of x for m rows: the kernel instantiated for them.
inline int x_tiles(int m) { return m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// The split of k for a w of n x k on num_sms SMs: the number of splits whose blocks fill the last of
// their waves best (kBlocksPerSm a SM; the fewest splits among equals), each split at least
// kMinPieces pieces long, at most kMaxSplits, and the fp32 partials of m rows within partial_bytes; at
// most max_tiles row tiles when split (one counter each). Only n, k and the SM count decide it while
// the partials fit, so a row's bits do not depend on m.
inline constexpr int kMinPieces = 8, kMaxSplits = 8;
inline Split plan_split(int m, int n, int k, int values_per_vector, int num_sms, size_t partial_bytes,
                        int max_tiles) {
  const int tiles = (n + kRows - 1) / kRows;
  const int pieces = (k / values_per_vector + 3) / 4;
  const int slots = kBlocksPerSm * num_sms;
  const size_t split_bytes = static_cast<size_t>(m) * n * sizeof(float);
  int splits = 1;
  double best = 0;
  for (int s = 1; s <= kMaxSplits && (s == 1 || (s * kMinPieces <= pieces && tiles <= max_tiles &&
                                                 static_cast<size_t>(s) * split_bytes <= partial_bytes));
       ++s) {
    const double waves = static_cast<double>(tiles) * s / slots;
    const double filled = waves / std::ceil(waves);
    if (filled > best + 0.02) {
      best = filled;
      splits = s;
    }
  }
  Split plan;
  plan.pieces_per_split = (pieces + splits - 1) / splits;
  plan.splits = (pieces + plan.pieces_per_split - 1) / plan.pieces_per_split;
  return plan;
}

// Launches kernel_of(std::integral_constant<int, kTiles>{}) (a __global__ wrapper of gemm above for
// kTiles 8-row tiles of x) for m rows, with programmatic dependent launch.
template <typename KernelOf, typename... Args>
cudaError_t launch(KernelOf&& kernel_of, int m, int n, const Split& split, cudaStream_t stream, Args... args) {
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows), static_cast<unsigned>(split.splits));
  auto go = [&](auto tiles) {
    const auto kernel = kernel_of(tiles);
    if (const cudaError_t e = allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), kRingBytes);
        e != cudaSuccess)
      return e;
    return launch_with_pdl(kernel, grid, dim3(kThreads), kRingBytes, stream, args...);
  };
  switch (x_tiles(m)) {
    case 2: return go(std::integral_constant<int, 2>{});
    case 4: return go(std::integral_constant<int, 4>{});
    default: return go(std::integral_constant<int, 8>{});
  }
}

}  // namespace tessera::kernels::cuda::skinny
