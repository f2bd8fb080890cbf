// kernels/cuda/attention/prefill_hopper.cuh: varlen prefill on Hopper warpgroup MMA (wgmma, sm_90a),
// head dims 64, 128 and 256, every policy. Kernels, then the launcher.
//
// One CTA = (query tile of 128 rows, query head, sequence), three warpgroups, warp-specialised:
//   producer (warpgroup 0, registers lowered with setmaxnreg; one thread works): TMA copies of Q once
//     and of each K/V tile into a ring of stages, a copy per 64-column panel; K and V have a "full"
//     mbarrier per stage that completes when the tile's bytes land, and the producer refills a K (V)
//     stage once both consumers have released it ("empty" mbarrier) after their S (P·V) MMAs read it.
//     Copies by thread (cp.async) cost ~10 instructions per 16 bytes, more than a producer warpgroup
//     can issue beside two consumers at head dim 128 without leaving them waiting on "full";
//   two consumers (64 query rows each, registers raised):
//     S = Q·Kᵀ  wgmma m64n{kBlockN}k16, A and B from shared memory (K-major);
//     O += P·V  wgmma m64n{D}k16, P from registers (the S accumulator converted in place), V from
//               shared memory read MN-major (no transpose pass);
//   each consumer issues S(i) and P(i-1)·V(i-1) together and runs the softmax of tile i while the
//   P·V MMA runs; the two consumers take turns issuing (named barriers), so one's softmax overlaps the
//   other's MMAs.
// Shared tiles are 64-column panels of 128-byte rows with the 128-byte swizzle (16-byte chunk c of
// row r at c ^ (r % 8)), the layout the wgmma descriptors name and TMA's 128-byte swizzle writes;
// panels start on 1024-byte boundaries. TMA reads rows of the whole q / k / v matrices: rows past a
// sequence's end belong to the next one and are masked, rows past the matrix land as zeros.
#pragma once

#include <cuda.h>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/mask_policy.cuh"
#include "kernels/cuda/attention/prefill_tile.cuh"
#include "kernels/cuda/attention/prefill_mma.cuh"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/kernel_attributes.cuh"
#include "kernels/cuda/common/mma.cuh"
#include "kernels/cuda/common/wgmma.cuh"

namespace tessera::kernels::cuda {

// The TMA descriptors of q, k and v: 2-D (columns, rows) over the whole matrices, boxes of 64 columns
// (128 bytes, one swizzled panel) by a tile's rows. Built on the host for each call.
struct HopperTensorMaps {
  CUtensorMap q, k, v;
};

template <int kHeadDim>
struct HopperPrefillConfig {
  // head_dim 64 is softmax-heavy relative to its MMAs and light on registers: three consumers (192
  // rows) share each K/V tile and hide each other's softmax; head_dim 128 and 256 need the registers
  // for two.
  static constexpr int kConsumers = kHeadDim == 64 ? 3 : 2;
  static constexpr int kThreads = (1 + kConsumers) * 128;  // producer + consumer warpgroups
  static constexpr int kBlockM = 64 * kConsumers;
  // head_dim 256: O alone is 128 registers a thread, so S takes 64 keys (32 registers, not 64), and
  // a K/V tile of 64 keys is as many bytes as hd128's of 128.
  static constexpr int kBlockN = kHeadDim == 256 ? 64 : 128;
  // hd128: 32 KB Q + 3 x 64 KB K/V = 224 KB of the 227 KB a block may use; hd256: 64 KB + 2 x 64 KB.
  static constexpr int kStages = kHeadDim == 256 ? 2 : 3;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  static constexpr int kBarrierBytes = 128;  // full and empty per stage for K and for V, then Q's
  static constexpr size_t kSmemBytes = kQBytes + 2 * kStages * kKVBytes + kBarrierBytes + 1024;
  // 128 * producer + kConsumers * 128 * consumer <= 65536 registers.
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : 40;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 232;
};

// Byte offset of (row, 16-byte chunk) in a tile of `rows` rows stored as swizzled 64-column panels.
__device__ __forceinline__ uint32_t panel_offset(int rows, int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrives on `bar` and adds `bytes` to the transaction count its phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// TMA: the box at (column, row) of `map` into shared memory at `dst`; its bytes count on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int column, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <typename T, int kHeadDim, MaskKind kKind>
__device__ __forceinline__ void prefill_hopper_tile(const PrefillArgs& args, const HopperTensorMaps& maps,
                                                    const MaskParams& mask, int seq, int head, int q_tile,
                                                    uint32_t smem) {
  using Cfg = HopperPrefillConfig<kHeadDim>;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kChunks = kHeadDim / 8, kStages = Cfg::kStages;
  constexpr int kSRegs = kBN / 2, kORegs = kHeadDim / 2;
  // Stage st: K at s_k + st * kKVBytes, V at s_v + st * kKVBytes. Barriers after the tiles. K and V
  // have barriers of their own: a K stage is free once S = Q·Kᵀ has read it, an iteration before
  // P·V releases the V tile of the same stage, so the next K load starts that much earlier.
  const uint32_t s_q = smem;
  const uint32_t s_k = smem + Cfg::kQBytes, s_v = s_k + kStages * Cfg::kKVBytes;
  const uint32_t bars = s_v + kStages * Cfg::kKVBytes;
  auto full_k = [&](int st) { return bars + 8 * st; };
  auto empty_k = [&](int st) { return bars + 8 * (kStages + st); };
  auto full_v = [&](int st) { return bars + 8 * (2 * kStages + st); };
  auto empty_v = [&](int st) { return bars + 8 * (3 * kStages + st); };
  const uint32_t q_bar = bars + 8 * (4 * kStages);

  const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31;
  const PrefillTile<T, kHeadDim, kKind, kBM, kBN> tile(args, mask, seq, head, q_tile);
  const int valid_rows = tile.valid_rows;
  const int q_first = tile.q_first, q_last = tile.q_last, lead = tile.lead, n_tiles = tile.n_tiles;
  T* o_base = tile.o_base;
  const MaskPolicy<kKind>& policy = tile.policy;
  if (n_tiles == 0) {  // no query of this tile sees any key
    for (int idx = tid; idx < valid_rows * kChunks; idx += Cfg::kThreads) {
      const int r = idx / kChunks, c = idx % kChunks;
      *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(r) * args.out_row_stride + c * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  auto tile_at = [&](int i) { return tile.tile_at(i); };

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbar_init(full_k(st), 1);  // the producer's arrive with the tile's bytes
      mbar_init(full_v(st), 1);
      mbar_init(empty_k(st), 4 * Cfg::kConsumers);  // lane 0 of every consumer warp
      mbar_init(empty_v(st), 4 * Cfg::kConsumers);
    }
    mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg::kProducerRegs));
    if (tid != 0) return;
    constexpr int kPanels = kHeadDim / 64;
    const int q_column = head * kHeadDim, kv_column = tile.kv_head * kHeadDim;
    mbar_arrive_expect_tx(q_bar, Cfg::kQBytes);
    for (int p = 0; p < kPanels; ++p) tma_load_2d(s_q + p * kBM * 128, &maps.q, q_column + p * 64, tile.q_row, q_bar);
    // K(i + 1) goes out before V(i): S(i + 1) needs it as soon as P·V(i) does.
    auto load = [&](bool key, int i) {
      const int st = i % kStages;
      if (i >= kStages) mbar_wait(key ? empty_k(st) : empty_v(st), ((i / kStages) - 1) & 1);
      const uint32_t full = key ? full_k(st) : full_v(st);
      const uint32_t dst = (key ? s_k : s_v) + st * Cfg::kKVBytes;
      mbar_arrive_expect_tx(full, Cfg::kKVBytes);
      for (int p = 0; p < kPanels; ++p)
        tma_load_2d(dst + p * kBN * 128, key ? &maps.k : &maps.v, kv_column + p * 64, tile.k_row + tile_at(i) * kBN,
                    full);
    };
    load(true, 0);
    for (int i = 0; i < n_tiles; ++i) {
      if (i + 1 < n_tiles) load(true, i + 1);
      load(false, i);
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg::kConsumerRegs));
  constexpr int kConsumers = Cfg::kConsumers;
  const int consumer = wg - 1;  // rows consumer*64 .. +63
  const int warp_in_wg = (tid % 128) / 32;
  const int g = lane >> 2, t = lane & 3;
  const int my_row = consumer * 64 + warp_in_wg * 16 + g;
  int row_hi[2], row_lo[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_hi[h] = policy.row_hi(q_first + my_row + 8 * h);
    row_lo[h] = policy.row_lo(q_first + my_row + 8 * h);
  }
  const float scale_log2 = args.softmax_scale * 1.4426950408889634f;
  T* type_tag = nullptr;
  // Named barriers 1..kConsumers hand the MMA-issue turn round the consumers; consumer 0 goes first.
  const int my_turn = 1 + consumer, next_turn = 1 + (consumer + 1) % kConsumers;
  if (consumer == kConsumers - 1) named_barrier_arrive(1, 256);

  auto issue_s = [&](float (&s)[kSRegs], int st) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t a_addr = s_q + (kk >> 2) * kBM * 128 + consumer * 64 * 128 + (kk & 3) * 32;
      const uint32_t b_addr = s_k + st * Cfg::kKVBytes + (kk >> 2) * kBN * 128 + (kk & 3) * 32;
      const uint64_t a_desc = wgmma_desc_sw128(a_addr, 16, 1024), b_desc = wgmma_desc_sw128(b_addr, 16, 1024);
      if constexpr (kBN == 128) {
        wgmma_ss_m64n128k16(s, a_desc, b_desc, kk > 0 ? 1 : 0, type_tag);
      } else {
        wgmma_ss_m64n64k16(s, a_desc, b_desc, kk > 0 ? 1 : 0, type_tag);
      }
    }
  };
  auto issue_pv = [&](float (&o)[kORegs], const uint32_t (&pa)[kBN / 16][4], int st) {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t b_addr = s_v + st * Cfg::kKVBytes + kk * 16 * 128;
      // MN-major B: leading byte offset = next 64-column panel, stride byte offset = next 8 keys.
      const uint64_t b_desc = wgmma_desc_sw128(b_addr, kBN * 128, 1024);
      if constexpr (kHeadDim == 256) {
        wgmma_rs_m64n256k16_tnspb(o, pa[kk], b_desc, type_tag);
      } else if constexpr (kHeadDim == 128) {
        wgmma_rs_m64n128k16_tnspb(o, pa[kk], b_desc, type_tag);
      } else {
        wgmma_rs_m64n64k16_tnspb(o, pa[kk], b_desc, type_tag);
      }
    }
  };
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  // Masks tile i's scores and turns them into P in place (fp32), updating the running max and sum;
  // alpha is the factor by which O must be rescaled before P·V of this tile is added.
  auto softmax = [&](float (&s)[kSRegs], int k0, float (&alpha)[2]) {
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
      // A row that has seen only masked keys keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
      const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
      alpha[h] = fast_exp2(m_run[h] * scale_log2 - m_scaled);
      m_run[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        s[j * 4 + h * 2] = fast_exp2(fmaf(s[j * 4 + h * 2], scale_log2, -m_scaled));
        s[j * 4 + h * 2 + 1] = fast_exp2(fmaf(s[j * 4 + h * 2 + 1], scale_log2, -m_scaled));
        sum += s[j * 4 + h * 2] + s[j * 4 + h * 2 + 1];
      }
      l_run[h] = l_run[h] * alpha[h] + sum;
    }
  };
  // P in the A-fragment layout of m64k16 steps: two n8 accumulator tiles per k16 step.
  auto pack_p = [&](const float (&s)[kSRegs], uint32_t (&pa)[kBN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pa[kk][0] = pack2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
      pa[kk][1] = pack2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
      pa[kk][2] = pack2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
      pa[kk][3] = pack2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
    }
  };
  auto rescale_o = [&](float (&o)[kORegs], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      o[j * 4 + 0] *= alpha[0];
      o[j * 4 + 1] *= alpha[0];
      o[j * 4 + 2] *= alpha[1];
      o[j * 4 + 3] *= alpha[1];
    }
  };

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
  uint32_t pa[kBN / 16][4];
  float alpha[2];

  mbar_wait(q_bar, 0);
  mbar_wait(full_k(0), 0);
  {
    float s[kSRegs];
    wgmma_fence_operands(s);
    wgmma_fence();
    issue_s(s, 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);
    if (lane == 0) mbar_arrive(empty_k(0));
    softmax(s, tile_at(0) * kBN, alpha);
    pack_p(s, pa);
  }

  // Each step issues S(i) = Q·K(i)ᵀ and then O += P(i-1)·V(i-1) as two MMA groups, runs the softmax of
  // S(i) while the second group is in flight, and packs P(i) once both are done.
  for (int i = 1; i < n_tiles; ++i) {
    const int st = i % kStages, prev_st = (i - 1) % kStages;
    mbar_wait(full_k(st), (i / kStages) & 1);
    mbar_wait(full_v(prev_st), ((i - 1) / kStages) & 1);
    named_barrier_sync(my_turn, 256);
    float s[kSRegs];
    wgmma_fence_operands(s);
    wgmma_fence();
    issue_s(s, st);
    wgmma_commit();
    wgmma_fence_operands(s);
    rescale_o(o, alpha);
    wgmma_fence_operands(o);
    wgmma_fence();
    issue_pv(o, pa, prev_st);
    wgmma_commit();
    wgmma_fence_operands(o);
    named_barrier_arrive(next_turn, 256);
    wgmma_wait<1>();  // S(i) done; P(i-1)·V(i-1) may still run
    wgmma_fence_operands(s);
    if (lane == 0) mbar_arrive(empty_k(st));
    softmax(s, tile_at(i) * kBN, alpha);
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    if (lane == 0) mbar_arrive(empty_v(prev_st));
    pack_p(s, pa);
  }
  const int last_st = (n_tiles - 1) % kStages;
  mbar_wait(full_v(last_st), ((n_tiles - 1) / kStages) & 1);
  rescale_o(o, alpha);
  wgmma_fence_operands(o);
  wgmma_fence();
  issue_pv(o, pa, last_st);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(o);
  if (lane == 0) mbar_arrive(empty_v(last_st));
  // Consume the last outstanding hand-over to consumer 0 (the initial one when there was one tile).
  if (consumer == 0) named_barrier_sync(1, 256);

  // Normalise and stage through this consumer's own rows of the Q tile, then 16-byte stores.
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
  named_barrier_sync(1 + kConsumers + consumer, 128);
  const int my_rows_begin = consumer * 64;
  const int my_rows = valid_rows - my_rows_begin < 64 ? valid_rows - my_rows_begin : 64;
  for (int idx = tid % 128; idx < my_rows * kChunks; idx += 128) {
    const int r = my_rows_begin + idx / kChunks, c = idx % kChunks;
    *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(r) * args.out_row_stride + c * 8) =
        *reinterpret_cast<const uint4*>(smem_ptr + panel_offset(kBM, r, c));
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(HopperPrefillConfig<kHeadDim>::kThreads, 1)
    prefill_hopper_kernel(const __grid_constant__ PrefillArgs args, const __grid_constant__ HopperTensorMaps maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Built for another architecture: wgmma and setmaxnreg do not exist there, and the dispatch never
  // launches this kernel (hopper_prefill_supported checks TESSERA_CUDA_SM90A and the device).
  __trap();
#else
  extern __shared__ __align__(1024) unsigned char smem_hopper[];
  using Cfg = HopperPrefillConfig<kHeadDim>;
  const int seq = blockIdx.z, head = blockIdx.y;
  const int q_len = args.cu_seqlens_q[seq + 1] - args.cu_seqlens_q[seq];
  const int q_tile = gridDim.x - 1 - blockIdx.x;
  if (q_tile * Cfg::kBlockM >= q_len) return;
  // The swizzle is a function of address bits 4-9, so the tiles need 1024-byte alignment.
  const uint32_t smem = (smem_addr(smem_hopper) + 1023u) & ~1023u;
  const MaskParams mask = args.masks[seq];
  with_mask_kind(mask.kind, [&](auto kind) {
    prefill_hopper_tile<T, kHeadDim, decltype(kind)::value>(args, maps, mask, seq, head, q_tile, smem);
  });
#endif
}

template <typename T, int kHeadDim>
cudaError_t launch_prefill_hopper_typed(const PrefillArgs& args, const HopperTensorMaps& maps, cudaStream_t stream) {
  using Cfg = HopperPrefillConfig<kHeadDim>;
  const cudaError_t attr = allow_dynamic_shared_memory(reinterpret_cast<const void*>(prefill_hopper_kernel<T, kHeadDim>),
                                                       static_cast<int>(Cfg::kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid((args.max_seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, args.num_heads, args.num_seqs);
  prefill_hopper_kernel<T, kHeadDim><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args, maps);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
