// kernels/cuda/attention/prefill_mma.cuh: FlashAttention-2-style varlen prefill on mma.sync
// (m16n8k16), cp.async and ldmatrix; every head dim, every policy. Kernels, then the launcher.
//
// One CTA = one (query tile of 128 rows, query head, sequence); 4 warps of 32 rows each, so every K/V
// fragment a warp loads from shared memory feeds two m16 tiles (one fragment per 16 rows would make
// the loop shared-memory bound). K and V tiles are single-buffered but staggered: V(i) loads while
// S = Q·K(i)ᵀ and the softmax run, K(i+1) loads while O += P·V(i) runs.
#pragma once

#include <cfloat>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/mask_policy.cuh"
#include "kernels/cuda/attention/prefill_tile.cuh"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/kernel_attributes.cuh"
#include "kernels/cuda/common/mma.cuh"

namespace tessera::kernels::cuda {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Row-major tiles of head_dim elements per row, swizzled in 16-byte chunks so that the 8 row
// addresses of one ldmatrix land in 8 different bank groups.
template <int kChunks>
__device__ __forceinline__ int swizzle_chunk(int row, int chunk) {
  if constexpr (kChunks >= 8) {
    return chunk ^ (row & 7);
  } else {
    static_assert(kChunks == 4, "head_dim 32 rows are 4 chunks: two rows share one 128-byte line");
    return chunk ^ ((row >> 1) & 3);
  }
}

template <int kHeadDim>
struct MmaPrefillConfig {
  static constexpr int kWarps = 4;
  // m16 tiles per warp; at head_dim 256 two would need 256 O registers a thread.
  static constexpr int kMTiles = kHeadDim == 256 ? 1 : 2;
  static constexpr int kBlockM = 16 * kMTiles * kWarps;  // 128 query rows (64 at head_dim 256)
  static constexpr int kBlockN = 64;                     // keys per tile
  static constexpr int kChunks = kHeadDim / 8;           // 16-byte chunks per row
  static constexpr int kThreads = kWarps * 32;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kBlockM + 2 * kBlockN) * kHeadDim * 2;
};

// Copies rows [row0, row0 + kRows) of one head into a swizzled shared tile; rows at or past `limit`
// are zero-filled (never read), so masked-out keys cannot carry NaN into P·V.
template <typename T, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void load_tile_async(T* smem, const T* base, int64_t row_stride, int row0, int limit) {
  constexpr int kChunks = kHeadDim / 8;
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool in = row0 + r < limit;
    const T* src = base + (in ? static_cast<int64_t>(row0 + r) * row_stride + c * 8 : 0);
    cp_async16(smem_addr(smem + r * kHeadDim + swizzle_chunk<kChunks>(r, c) * 8), src, in);
  }
}

template <typename T, int kHeadDim, MaskKind kKind>
__device__ __forceinline__ void prefill_mma_tile(const PrefillArgs& args, const MaskParams& mask, int seq, int head,
                                                 int q_tile, unsigned char* smem_raw) {
  using Cfg = MmaPrefillConfig<kHeadDim>;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kMT = Cfg::kMTiles, kChunks = Cfg::kChunks;
  constexpr int kNT = kBN / 8;        // n8 tiles of S per row block
  constexpr int kDT = kHeadDim / 8;   // n8 tiles of O
  T* s_q = reinterpret_cast<T*>(smem_raw);
  T* s_k = s_q + kBM * kHeadDim;
  T* s_v = s_k + kBN * kHeadDim;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const PrefillTile<T, kHeadDim, kKind, kBM, kBN> tile(args, mask, seq, head, q_tile);
  const int kv_len = tile.kv_len, valid_rows = tile.valid_rows;
  const int q_first = tile.q_first, q_last = tile.q_last, lead = tile.lead, n_tiles = tile.n_tiles;
  const T *q_base = tile.q_base, *k_base = tile.k_base, *v_base = tile.v_base;
  T* o_base = tile.o_base;
  const MaskPolicy<kKind>& policy = tile.policy;
  if (n_tiles == 0) {  // no query of this tile sees any key
    for (int idx = threadIdx.x; idx < valid_rows * kChunks; idx += Cfg::kThreads) {
      const int r = idx / kChunks, c = idx % kChunks;
      *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(r) * args.out_row_stride + c * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  auto tile_at = [&](int i) { return tile.tile_at(i); };

  // Per-thread rows: (mt, h) -> local row warp*32 + mt*16 + h*8 + g.
  int row_hi[kMT][2], row_lo[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pos = q_first + warp * 16 * kMT + mt * 16 + h * 8 + g;
      row_hi[mt][h] = policy.row_hi(pos);
      row_lo[mt][h] = policy.row_lo(pos);
    }

  load_tile_async<T, kHeadDim, kBM, Cfg::kThreads>(s_q, q_base, args.q_row_stride, 0, valid_rows);
  load_tile_async<T, kHeadDim, kBN, Cfg::kThreads>(s_k, k_base, args.k_row_stride, tile_at(0) * kBN, kv_len);
  cp_async_commit();

  float o[kMT][kDT][4];
  float m_run[kMT][2], l_run[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int d = 0; d < kDT; ++d) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.f;
  }
  const float scale_log2 = args.softmax_scale * 1.4426950408889634f;
  const uint32_t q_addr = smem_addr(s_q), k_addr = smem_addr(s_k), v_addr = smem_addr(s_v);

  for (int i = 0; i < n_tiles; ++i) {
    const int k0 = tile_at(i) * kBN;
    cp_async_wait<0>();
    __syncthreads();  // K(i) is in; every warp is done with V(i-1)
    load_tile_async<T, kHeadDim, kBN, Cfg::kThreads>(s_v, v_base, args.v_row_stride, k0, kv_len);
    cp_async_commit();

    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int n = 0; n < kNT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int r = warp * 16 * kMT + mt * 16 + (lane & 15);
        const int c = kk * 2 + (lane >> 4);
        ldmatrix_x4(qa[mt], q_addr + (r * kHeadDim + swizzle_chunk<kChunks>(r, c) * 8) * 2);
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t kb[4];
        const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int c = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(kb, k_addr + (r * kHeadDim + swizzle_chunk<kChunks>(r, c) * 8) * 2);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    if (!policy.tile_full(q_first, q_last, k0, k0 + kBN - 1)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int n = 0; n < kNT; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = k0 + n * 8 + 2 * t + e;
              if (!(key <= row_hi[mt][h] && (key >= row_lo[mt][h] || key < lead))) s[mt][n][2 * h + e] = -INFINITY;
            }
    }

    // Online softmax; each row lives in the 4 threads of a quad.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = m_run[mt][h];
#pragma unroll
        for (int n = 0; n < kNT; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row that has seen only masked keys keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
        const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
        const float alpha = fast_exp2(m_run[mt][h] * scale_log2 - m_scaled);
        m_run[mt][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          s[mt][n][2 * h] = fast_exp2(fmaf(s[mt][n][2 * h], scale_log2, -m_scaled));
          s[mt][n][2 * h + 1] = fast_exp2(fmaf(s[mt][n][2 * h + 1], scale_log2, -m_scaled));
          sum += s[mt][n][2 * h] + s[mt][n][2 * h + 1];
        }
        l_run[mt][h] = l_run[mt][h] * alpha + sum;
#pragma unroll
        for (int d = 0; d < kDT; ++d) {
          o[mt][d][2 * h] *= alpha;
          o[mt][d][2 * h + 1] *= alpha;
        }
      }

    cp_async_wait<0>();
    __syncthreads();  // V(i) is in; every warp is done with K(i)
    if (i + 1 < n_tiles) {
      load_tile_async<T, kHeadDim, kBN, Cfg::kThreads>(s_k, k_base, args.k_row_stride, tile_at(i + 1) * kBN, kv_len);
      cp_async_commit();
    }

#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t vb[4];
        const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
        const int c = dp * 2 + (lane >> 4);
        ldmatrix_x4_trans(vb, v_addr + (r * kHeadDim + swizzle_chunk<kChunks>(r, c) * 8) * 2);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_16816<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

  // Normalise, stage through this warp's own rows of s_q, then store 16-byte chunks.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int r = warp * 16 * kMT + mt * 16 + h * 8 + g;
#pragma unroll
      for (int d = 0; d < kDT; ++d) {
        const uint32_t packed = pack2<T>(o[mt][d][2 * h] * inv, o[mt][d][2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(s_q + r * kHeadDim + swizzle_chunk<kChunks>(r, d) * 8 + 2 * t) = packed;
      }
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < valid_rows * kChunks; idx += Cfg::kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(r) * args.out_row_stride + c * 8) =
        *reinterpret_cast<const uint4*>(s_q + r * kHeadDim + swizzle_chunk<kChunks>(r, c) * 8);
  }
}

// Grid: (query tiles of the longest sequence, heads, sequences). Query tiles run last-first so the
// long causal tiles start early and the short ones fill the tail.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(MmaPrefillConfig<kHeadDim>::kThreads)
    prefill_mma_kernel(const __grid_constant__ PrefillArgs args) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  using Cfg = MmaPrefillConfig<kHeadDim>;
  const int seq = blockIdx.z, head = blockIdx.y;
  const int q_len = args.cu_seqlens_q[seq + 1] - args.cu_seqlens_q[seq];
  const int q_tile = gridDim.x - 1 - blockIdx.x;
  if (q_tile * Cfg::kBlockM >= q_len) return;
  const MaskParams mask = args.masks[seq];
  with_mask_kind(mask.kind, [&](auto kind) {
    prefill_mma_tile<T, kHeadDim, decltype(kind)::value>(args, mask, seq, head, q_tile, smem_raw);
  });
}

template <typename T, int kHeadDim>
cudaError_t launch_prefill_mma(const PrefillArgs& args, cudaStream_t stream) {
  using Cfg = MmaPrefillConfig<kHeadDim>;
  const cudaError_t attr = allow_dynamic_shared_memory(reinterpret_cast<const void*>(prefill_mma_kernel<T, kHeadDim>),
                                                       static_cast<int>(Cfg::kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid((args.max_seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, args.num_heads, args.num_seqs);
  prefill_mma_kernel<T, kHeadDim><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
