// kernels/cuda/attention/prefill_hopper.cuh: varlen prefill on Hopper warpgroup MMA (wgmma, sm_90a),
// head dims 64 and 128, every policy. Kernels, then the launcher.
//
// One CTA = (query tile of 128 rows, query head, sequence) with two consumer warpgroups of 64 rows.
//   S = Q·Kᵀ  wgmma m64n128k16, A and B from shared memory (K-major);
//   O += P·V  wgmma m64n{D}k16, P from registers (the S accumulator converted in place), V from shared
//             memory read MN-major (no transpose pass);
//   K/V tiles of 128 keys, double-buffered with cp.async: tile i+1 loads while tile i computes.
// Shared tiles are stored as 64-column panels of 128-byte rows with the 128-byte swizzle (16-byte
// chunk c of row r at c ^ (r % 8)), the layout the wgmma descriptors name; panels start on 1024-byte
// boundaries. The two warpgroups are independent between barriers, so one's softmax overlaps the
// other's MMAs.
#pragma once

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/mask_policy.cuh"
#include "kernels/cuda/attention/prefill_mma.cuh"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/mma.cuh"
#include "kernels/cuda/common/wgmma.cuh"

namespace tessera::kernels::cuda {

template <int kHeadDim>
struct HopperPrefillConfig {
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kBlockM = 64 * kWarpgroups;
  static constexpr int kBlockN = 128;
  static constexpr int kPanels = kHeadDim / 64;  // 64-column panels per row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  static constexpr size_t kSmemBytes = kQBytes + 4 * kKVBytes + 1024;  // Q, 2 stages of K and V, alignment
};

// Byte offset of (row, 16-byte chunk) in a tile of `rows` rows stored as swizzled 64-column panels.
__device__ __forceinline__ uint32_t panel_offset(int rows, int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

template <typename T, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void load_panels_async(uint32_t smem, const T* base, int64_t row_stride, int row0,
                                                  int limit) {
  constexpr int kChunks = kHeadDim / 8;
#pragma unroll 4
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool in = row0 + r < limit;
    const T* src = base + (in ? static_cast<int64_t>(row0 + r) * row_stride + c * 8 : 0);
    cp_async16(smem + panel_offset(kRows, r, c), src, in);
  }
}

template <typename T, int kHeadDim, MaskKind kKind>
__device__ __forceinline__ void prefill_hopper_tile(const PrefillArgs& args, const MaskParams& mask, int seq,
                                                    int head, int q_tile, uint32_t smem) {
  using Cfg = HopperPrefillConfig<kHeadDim>;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kChunks = kHeadDim / 8;
  constexpr int kSRegs = kBN / 2, kORegs = kHeadDim / 2;
  const uint32_t s_q = smem;
  // Stage st: K at s_k + st * kKVBytes, V at s_v + st * kKVBytes.
  const uint32_t s_k = smem + Cfg::kQBytes, s_v = smem + Cfg::kQBytes + 2 * Cfg::kKVBytes;

  const int tid = threadIdx.x, wg = tid / 128, warp_in_wg = (tid % 128) / 32, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int q_begin = args.cu_seqlens_q[seq], q_len = args.cu_seqlens_q[seq + 1] - q_begin;
  const int k_begin = args.cu_seqlens_k[seq], kv_len = args.cu_seqlens_k[seq + 1] - k_begin;
  const int kv_head = head / (args.num_heads / args.num_kv_heads);
  const int row0 = q_tile * kBM;
  const int valid_rows = q_len - row0 < kBM ? q_len - row0 : kBM;
  const int offset = kv_len - q_len;
  const int q_first = offset + row0, q_last = offset + row0 + valid_rows - 1;

  const T* q_base = static_cast<const T*>(args.q) + static_cast<int64_t>(q_begin + row0) * args.q_row_stride +
                    head * kHeadDim;
  const T* k_base = static_cast<const T*>(args.k) + static_cast<int64_t>(k_begin) * args.k_row_stride +
                    kv_head * kHeadDim;
  const T* v_base = static_cast<const T*>(args.v) + static_cast<int64_t>(k_begin) * args.v_row_stride +
                    kv_head * kHeadDim;
  T* o_base = static_cast<T*>(args.out) + static_cast<int64_t>(q_begin + row0) * args.out_row_stride +
              head * kHeadDim;

  const MaskPolicy<kKind> policy{mask, kv_len};
  int lo = 0, hi = -1;
  if (kv_len > 0) policy.key_range(q_first, q_last, lo, hi);
  const int lead = policy.lead();
  int n_lead = 0, n_main = 0, main_first = 0;
  if (hi >= 0 && hi >= lo) {
    main_first = lo / kBN;
    n_main = hi / kBN - main_first + 1;
    n_lead = (lead + kBN - 1) / kBN < main_first ? (lead + kBN - 1) / kBN : main_first;
  }
  const int n_tiles = n_lead + n_main;
  if (n_tiles == 0) {
    for (int idx = tid; idx < valid_rows * kChunks; idx += Cfg::kThreads) {
      const int r = idx / kChunks, c = idx % kChunks;
      *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(r) * args.out_row_stride + c * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  auto tile_at = [&](int i) { return i < n_lead ? i : main_first + (i - n_lead); };

  // This thread's two rows: wg*64 + warp*16 + g (+8).
  const int my_row = wg * 64 + warp_in_wg * 16 + g;
  int row_hi[2], row_lo[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_hi[h] = policy.row_hi(q_first + my_row + 8 * h);
    row_lo[h] = policy.row_lo(q_first + my_row + 8 * h);
  }

  load_panels_async<T, kHeadDim, kBM, Cfg::kThreads>(s_q, q_base, args.q_row_stride, 0, valid_rows);
  load_panels_async<T, kHeadDim, kBN, Cfg::kThreads>(s_k, k_base, args.k_row_stride, tile_at(0) * kBN, kv_len);
  load_panels_async<T, kHeadDim, kBN, Cfg::kThreads>(s_v, v_base, args.v_row_stride, tile_at(0) * kBN, kv_len);
  cp_async_commit();

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float scale_log2 = args.softmax_scale * 1.4426950408889634f;
  T* type_tag = nullptr;

  for (int i = 0; i < n_tiles; ++i) {
    const int stage = i & 1;
    const int k0 = tile_at(i) * kBN;
    cp_async_wait<0>();
    fence_proxy_async_shared();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    __syncthreads();             // tile i is in; every warpgroup is done with tile i-1 (the other stage)
    if (i + 1 < n_tiles) {
      const int next = tile_at(i + 1) * kBN;
      load_panels_async<T, kHeadDim, kBN, Cfg::kThreads>(s_k + (stage ^ 1) * Cfg::kKVBytes, k_base, args.k_row_stride, next, kv_len);
      load_panels_async<T, kHeadDim, kBN, Cfg::kThreads>(s_v + (stage ^ 1) * Cfg::kKVBytes, v_base, args.v_row_stride, next, kv_len);
      cp_async_commit();
    }

    // S = Q · Kᵀ for this warpgroup's 64 rows.
    float s[kSRegs];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t a_addr = s_q + (kk >> 2) * kBM * 128 + wg * 64 * 128 + (kk & 3) * 32;
      const uint32_t b_addr = s_k + stage * Cfg::kKVBytes + (kk >> 2) * kBN * 128 + (kk & 3) * 32;
      wgmma_ss_m64n128k16(s, wgmma_desc_sw128(a_addr, 16, 1024), wgmma_desc_sw128(b_addr, 16, 1024), kk > 0 ? 1 : 0,
                          type_tag);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);

    // Accumulator layout: s[j*4 + h*2 + e] is (row my_row + 8h, key k0 + j*8 + 2t + e).
    if (!policy.tile_full(q_first, q_last, k0, k0 + kBN - 1)) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = k0 + j * 8 + 2 * t + e;
            if (!(key <= row_hi[h] && (key >= row_lo[h] || key < lead))) s[j * 4 + h * 2 + e] = -INFINITY;
          }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m_run[h];
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + h * 2], s[j * 4 + h * 2 + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
      const float alpha = fast_exp2(m_run[h] * scale_log2 - m_scaled);
      m_run[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        s[j * 4 + h * 2] = fast_exp2(fmaf(s[j * 4 + h * 2], scale_log2, -m_scaled));
        s[j * 4 + h * 2 + 1] = fast_exp2(fmaf(s[j * 4 + h * 2 + 1], scale_log2, -m_scaled));
        sum += s[j * 4 + h * 2] + s[j * 4 + h * 2 + 1];
      }
      l_run[h] = l_run[h] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        o[j * 4 + h * 2] *= alpha;
        o[j * 4 + h * 2 + 1] *= alpha;
      }
    }

    // O += P · V: P straight from the S accumulator (its layout is the A-fragment layout, k16 steps).
    // All of P is packed before the first MMA is issued, so no register the MMAs read changes under them.
    uint32_t pa[kBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pa[kk][0] = pack2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
      pa[kk][1] = pack2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
      pa[kk][2] = pack2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
      pa[kk][3] = pack2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
    }
    wgmma_fence_operands(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t b_addr = s_v + stage * Cfg::kKVBytes + kk * 16 * 128;
      // MN-major B: leading byte offset = next 64-column panel, stride byte offset = next 8 keys.
      if constexpr (kHeadDim == 128) {
        wgmma_rs_m64n128k16_tnspb(o, pa[kk], wgmma_desc_sw128(b_addr, kBN * 128, 1024), type_tag);
      } else {
        wgmma_rs_m64n64k16_tnspb(o, pa[kk], wgmma_desc_sw128(b_addr, kBN * 128, 1024), type_tag);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
  }

  // Normalise and stage through this warpgroup's own rows of the Q tile, then 16-byte stores.
  unsigned char* smem_ptr = nullptr;
  asm("cvta.shared.u64 %0, %1;" : "=l"(smem_ptr) : "l"(static_cast<uint64_t>(s_q)));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int r = my_row + 8 * h;
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      const uint32_t packed = pack2<T>(o[j * 4 + h * 2] * inv, o[j * 4 + h * 2 + 1] * inv);
      *reinterpret_cast<uint32_t*>(smem_ptr + panel_offset(kBM, r, j) + 4 * t) = packed;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < valid_rows * kChunks; idx += Cfg::kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(r) * args.out_row_stride + c * 8) =
        *reinterpret_cast<const uint4*>(smem_ptr + panel_offset(kBM, r, c));
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(HopperPrefillConfig<kHeadDim>::kThreads, 1)
    prefill_hopper_kernel(const __grid_constant__ PrefillArgs args) {
  extern __shared__ __align__(1024) unsigned char smem_hopper[];
  using Cfg = HopperPrefillConfig<kHeadDim>;
  const int seq = blockIdx.z, head = blockIdx.y;
  const int q_len = args.cu_seqlens_q[seq + 1] - args.cu_seqlens_q[seq];
  const int q_tile = gridDim.x - 1 - blockIdx.x;
  if (q_tile * Cfg::kBlockM >= q_len) return;
  // The swizzle is a function of address bits 4-9, so the tiles need 1024-byte alignment.
  const uint32_t smem = (smem_addr(smem_hopper) + 1023u) & ~1023u;
  const MaskParams mask = args.masks[seq];
  switch (mask.kind) {
    case MaskKind::kCausal:
      prefill_hopper_tile<T, kHeadDim, MaskKind::kCausal>(args, mask, seq, head, q_tile, smem);
      break;
    case MaskKind::kBidirectional:
      prefill_hopper_tile<T, kHeadDim, MaskKind::kBidirectional>(args, mask, seq, head, q_tile, smem);
      break;
    case MaskKind::kSlidingWindow:
      prefill_hopper_tile<T, kHeadDim, MaskKind::kSlidingWindow>(args, mask, seq, head, q_tile, smem);
      break;
    case MaskKind::kSegments:
      prefill_hopper_tile<T, kHeadDim, MaskKind::kSegments>(args, mask, seq, head, q_tile, smem);
      break;
  }
}

template <typename T, int kHeadDim>
cudaError_t launch_prefill_hopper_typed(const PrefillArgs& args, cudaStream_t stream) {
  using Cfg = HopperPrefillConfig<kHeadDim>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(prefill_hopper_kernel<T, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Cfg::kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid((args.max_seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, args.num_heads, args.num_seqs);
  prefill_hopper_kernel<T, kHeadDim><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
