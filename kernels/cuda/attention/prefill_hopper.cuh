// kernels/cuda/attention/prefill_hopper.cuh: varlen prefill on Hopper warpgroup MMA (wgmma, sm_90a),
// head dims 64, 128 and 256, every policy. Kernels, then the launcher.
//
// A work item = (query tile of 64 rows a consumer, query head, sequence). With tile
// counters (PrefillArgs::tile_counters) and more items than SMs, the grid is one persistent CTA per
// SM that takes items as they free, so one item's epilogue and the next one's first loads overlap
// and a short item never holds an SM; otherwise one CTA runs each item. A CTA has three warpgroups
// (four at head dim 64 past 128 queries), warp-specialised:
//   producer (warpgroup 0, registers lowered with setmaxnreg; one thread works): takes the items,
//     names each to the consumers, and issues TMA copies of its Q and of each K/V tile into a ring of
//     stages, a copy per 64-column panel. K, V and Q have a "full" mbarrier per stage that completes
//     when the bytes land; the producer refills a K (V) stage once every consumer has released it
//     ("empty" mbarrier) after its S (P·V) MMAs read it, and loads the next item's Q once the last
//     S of the current one is done. The K/V stream runs on across items without a break.
//     Copies by thread (cp.async) cost ~10 instructions per 16 bytes, more than a producer warpgroup
//     can issue beside two consumers at head dim 128 without leaving them waiting on "full";
//   two consumers (64 query rows each; three at head dim 64 past 128 queries; registers raised):
//     S = Q·Kᵀ  wgmma m64n{kBlockN}k16, A and B from shared memory (K-major);
//     O += P·V  wgmma m64n{D}k16, P from registers (the S accumulator converted in place), V from
//               shared memory read MN-major (no transpose pass);
//   each consumer issues S(i) and P(i-1)·V(i-1) together and runs the softmax of tile i while the
//   P·V MMA runs; the consumers take turns issuing (named barriers), so one's softmax overlaps the
//   other's MMAs. O goes from the accumulators straight to global memory.
// Shared tiles are 64-column panels of 128-byte rows with the 128-byte swizzle (16-byte chunk c of
// row r at c ^ (r % 8)), the layout the wgmma descriptors name and TMA's 128-byte swizzle writes;
// panels start on 1024-byte boundaries. TMA reads rows of the whole q / k / v matrices: rows past a
// sequence's end belong to the next one and are masked, rows past the matrix land as zeros.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <climits>
#include <new>

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

// head_dim 64 is softmax-heavy relative to its MMAs and light on registers: three consumers (192
// rows) share each K/V tile and hide each other's softmax; head_dim 128 and 256 need the registers
// for two. Sequences of at most 128 queries take two at head_dim 64 too (launch_with_tensor_maps):
// a third consumer would only work on rows past their end.
template <int kHeadDim>
inline constexpr int kDefaultHopperConsumers = kHeadDim == 64 ? 3 : 2;

template <int kHeadDim, int kConsumerWgs>
struct HopperPrefillConfig {
  static constexpr int kConsumers = kConsumerWgs;
  static constexpr int kThreads = (1 + kConsumers) * 128;  // producer + consumer warpgroups
  static constexpr int kBlockM = 64 * kConsumers;
  // head_dim 256: O alone is 128 registers a thread, so S takes 64 keys (32 registers, not 64), and
  // a K/V tile of 64 keys is as many bytes as hd128's of 128.
  static constexpr int kBlockN = kHeadDim == 256 ? 64 : 128;
  // hd128: 32 KB Q + 3 x 64 KB K/V = 224 KB of the 227 KB a block may use; hd256: 64 KB + 2 x 64 KB.
  static constexpr int kStages = kHeadDim == 256 ? 2 : 3;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  // Full and empty per stage for K and for V, then Q's full and empty (128 bytes); two hand-over slots
  // (HopperSmem).
  static constexpr int kBarrierBytes = 128 + 2 * 320;
  static constexpr size_t kSmemBytes = kQBytes + 2 * kStages * kKVBytes + kBarrierBytes + 1024;
  // 128 * (producer + kConsumers * consumer) must stay within the registers the launch gave the CTA
  // (kThreads times __launch_bounds__' per-thread count: 168 at three warpgroups, 128 at four), or
  // setmaxnreg.inc waits forever.
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

// A CTA's shared memory: the Q tile, the K and V rings, then the mbarriers and the slots through
// which the producer hands each work item to the consumers with what it already worked out about it,
// so that no consumer waits on a global load between items.
template <int kHeadDim, int kConsumerWgs>
struct HopperSmem {
  using Cfg = HopperPrefillConfig<kHeadDim, kConsumerWgs>;
  static constexpr int kStages = Cfg::kStages;
  // A hand-over slot: the item's number (-1: no work left), its mask kind, and at kTileOffset its
  // PrefillTile. Hand-over j uses slot j % 2, so the producer builds item j + 1's while the consumers
  // still wait to take item j's.
  static constexpr int kSlotBytes = 320, kTileOffset = 64;
  uint32_t q, k, v, bars;
  unsigned char* slots;

  // The swizzle is a function of address bits 4-9, so the tiles need 1024-byte alignment.
  __device__ explicit HopperSmem(unsigned char* raw) {
    const uint32_t raw_addr = smem_addr(raw);
    q = (raw_addr + 1023u) & ~1023u;
    k = q + Cfg::kQBytes;
    v = k + kStages * Cfg::kKVBytes;
    bars = v + kStages * Cfg::kKVBytes;
    static_assert(8 * (4 * kStages + 2) <= 128 && 128 + 2 * kSlotBytes <= Cfg::kBarrierBytes, "slots overlap");
    slots = raw + (bars + 128 - raw_addr);
  }
  __device__ int& item(int handover) const { return *reinterpret_cast<int*>(slots + (handover & 1) * kSlotBytes); }
  __device__ MaskKind& kind(int handover) const {
    return *reinterpret_cast<MaskKind*>(slots + (handover & 1) * kSlotBytes + 4);
  }
  template <typename Tile>
  __device__ Tile& tile(int handover) const {
    static_assert(sizeof(Tile) <= kSlotBytes - kTileOffset, "PrefillTile outgrew its slot");
    return *reinterpret_cast<Tile*>(slots + (handover & 1) * kSlotBytes + kTileOffset);
  }
  // K and V have barriers of their own: a K stage is free once S = Q·Kᵀ has read it, an iteration
  // before P·V releases the V tile of the same stage, so the next K load starts that much earlier.
  __device__ uint32_t full_k(int st) const { return bars + 8 * st; }
  __device__ uint32_t empty_k(int st) const { return bars + 8 * (kStages + st); }
  __device__ uint32_t full_v(int st) const { return bars + 8 * (2 * kStages + st); }
  __device__ uint32_t empty_v(int st) const { return bars + 8 * (3 * kStages + st); }
  __device__ uint32_t q_full() const { return bars + 8 * (4 * kStages); }
  __device__ uint32_t q_empty() const { return bars + 8 * (4 * kStages + 1); }
};

// Work items are (query tile, head, sequence). The (sequence, head) pairs go in groups small enough
// that the group's K/V stays in L2; inside a group the items are numbered longest query tile first,
// round the group's pairs. Taken in that order, the long causal tiles of the last group do not start
// at the end of the call and leave a half-empty last wave.
// With counters (the launcher passes PrefillArgs::tile_counters on when there are more items than
// SMs) a grid of one CTA per SM takes items as they free (the first by CTA index, the rest from
// counters[0]); without, each CTA runs the one item of its index.
struct HopperSchedule {
  int q_tiles;    // query tiles of the longest sequence
  int pairs;      // num_seqs * num_heads
  int group;      // pairs whose items interleave
  int items;      // q_tiles * pairs
  int* counters;  // [2]: items taken, CTAs done; 0 between calls
};
struct HopperItem {
  int seq, head, q_tile;
};
__device__ __forceinline__ HopperItem hopper_item(const HopperSchedule& schedule, int num_heads, int item) {
  const int first_pair = item / (schedule.group * schedule.q_tiles) * schedule.group;
  const int members = min(schedule.group, schedule.pairs - first_pair);
  const int within = item - first_pair * schedule.q_tiles;
  const int pair = first_pair + within % members;
  return {pair / num_heads, pair % num_heads, schedule.q_tiles - 1 - within / members};
}
__device__ __forceinline__ int next_hopper_item(const HopperSchedule& schedule) {
  return schedule.counters != nullptr ? static_cast<int>(gridDim.x) + atomicAdd(schedule.counters, 1)
                                      : schedule.items;
}
// The last CTA to finish returns the counters to 0 for the next call. A CTA gets here only after its
// producer's last fetch (the consumers saw the end through the Q barrier), so no fetch of this call
// is left once every CTA has counted itself.
__device__ __forceinline__ void finish_hopper_schedule(const HopperSchedule& schedule) {
  __threadfence();
  if (atomicAdd(schedule.counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
    atomicExch(schedule.counters, 0);
    atomicExch(schedule.counters + 1, 0);
  }
}

// Where a CTA is in its stream of tiles: the Q hand-overs so far and the K/V tiles loaded (producer)
// or consumed (consumers). Both sides count alike, which gives every mbarrier's phase.
struct HopperPipeline {
  int handovers = 0;
  int kv = 0;
};

// The producer's part of one work item: Q once (after the consumers released the previous item's),
// then each K/V tile into the next ring stage as soon as the consumers free it. Runs ahead into the
// next item while the consumers finish this one.
template <typename T, int kHeadDim, int kConsumerWgs, MaskKind kKind>
__device__ __forceinline__ void produce_tile(const PrefillArgs& args, const HopperTensorMaps& maps,
                                             const MaskParams& mask, const HopperItem& work, int item,
                                             const HopperSmem<kHeadDim, kConsumerWgs>& sm, HopperPipeline& pipe) {
  using Cfg = HopperPrefillConfig<kHeadDim, kConsumerWgs>;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kStages = Cfg::kStages, kPanels = kHeadDim / 64;
  // Built straight into its slot, whose last item's consumers copied it out before they released
  // that item's Q, which the previous hand-over waited for.
  using Tile = PrefillTile<T, kHeadDim, kKind, kBM, kBN>;
  const Tile& tile = *new (&sm.template tile<Tile>(pipe.handovers)) Tile(args, mask, work.seq, work.head, work.q_tile);
  sm.item(pipe.handovers) = item;
  sm.kind(pipe.handovers) = kKind;
  if (pipe.handovers > 0) mbar_wait(sm.q_empty(), (pipe.handovers - 1) & 1);
  ++pipe.handovers;
  if (tile.n_tiles == 0) {  // no query of the tile sees a key: nothing to load, the consumers write 0
    mbar_arrive(sm.q_full());
    return;
  }
  mbar_arrive_expect_tx(sm.q_full(), Cfg::kQBytes);
  for (int p = 0; p < kPanels; ++p)
    tma_load_2d(sm.q + p * kBM * 128, &maps.q, work.head * kHeadDim + p * 64, tile.q_row, sm.q_full());
  const int kv_column = tile.kv_head * kHeadDim;
  auto load = [&](bool key, int i) {
    const int n = pipe.kv + i, st = n % kStages;
    if (n >= kStages) mbar_wait(key ? sm.empty_k(st) : sm.empty_v(st), ((n / kStages) - 1) & 1);
    const uint32_t full = key ? sm.full_k(st) : sm.full_v(st);
    const uint32_t dst = (key ? sm.k : sm.v) + st * Cfg::kKVBytes;
    mbar_arrive_expect_tx(full, Cfg::kKVBytes);
    for (int p = 0; p < kPanels; ++p)
      tma_load_2d(dst + p * kBN * 128, key ? &maps.k : &maps.v, kv_column + p * 64,
                  tile.k_row + tile.tile_at(i) * kBN, full);
  };
  // K(i + 1) goes out before V(i): S(i + 1) needs it as soon as P·V(i) does.
  load(true, 0);
  for (int i = 0; i < tile.n_tiles; ++i) {
    if (i + 1 < tile.n_tiles) load(true, i + 1);
    load(false, i);
  }
  pipe.kv += tile.n_tiles;
}

// The consumers' part of one work item, after the Q hand-over: consumer c owns query rows
// c*64 .. c*64 + 63 of the tile.
template <typename T, int kHeadDim, int kConsumerWgs, MaskKind kKind>
__device__ __forceinline__ void consume_tile(const PrefillArgs& args, const HopperSmem<kHeadDim, kConsumerWgs>& sm,
                                             HopperPipeline& pipe) {
  using Cfg = HopperPrefillConfig<kHeadDim, kConsumerWgs>;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kChunks = kHeadDim / 8, kStages = Cfg::kStages;
  constexpr int kSRegs = kBN / 2, kORegs = kHeadDim / 2, kConsumers = Cfg::kConsumers;
  // A copy: the producer builds the item after next in this slot once this item's Q is released.
  const auto tile = sm.template tile<const PrefillTile<T, kHeadDim, kKind, kBM, kBN>>(pipe.handovers);
  const int q_first = tile.q_first, lead = tile.lead, n_tiles = tile.n_tiles, valid_rows = tile.valid_rows;
  const MaskPolicy<kKind>& policy = tile.policy;
  T* o_base = tile.o_base;
  const int tid = threadIdx.x, lane = tid & 31;
  const int consumer = tid / 128 - 1;
  ++pipe.handovers;
  if (n_tiles == 0) {
    for (int idx = tid % 128; idx < 64 * kChunks; idx += 128) {
      const int r = consumer * 64 + idx / kChunks, c = idx % kChunks;
      if (r < valid_rows)
        *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(r) * args.out_row_stride + c * 8) = make_uint4(0, 0, 0, 0);
    }
    if (lane == 0) mbar_arrive(sm.q_empty());
    return;
  }
  auto tile_at = [&](int i) { return tile.tile_at(i); };
  auto stage = [&](int i) { return (pipe.kv + i) % kStages; };
  auto phase = [&](int i) { return static_cast<uint32_t>(((pipe.kv + i) / kStages) & 1); };

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
  // Named barriers 1..kConsumers hand the MMA-issue turn round the consumers (the kernel starts it).
  const int my_turn = 1 + consumer, next_turn = 1 + (consumer + 1) % kConsumers;

  auto issue_s = [&](float (&s)[kSRegs], int st) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t a_addr = sm.q + (kk >> 2) * kBM * 128 + consumer * 64 * 128 + (kk & 3) * 32;
      const uint32_t b_addr = sm.k + st * Cfg::kKVBytes + (kk >> 2) * kBN * 128 + (kk & 3) * 32;
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
      const uint32_t b_addr = sm.v + st * Cfg::kKVBytes + kk * 16 * 128;
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
    if (!policy.tile_full(q_first, tile.q_last, k0, k0 + kBN - 1)) {
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
  // Q is read by S alone: once the last S is done the producer may load the next item's Q.
  auto release_q = [&] {
    if (lane == 0) mbar_arrive(sm.q_empty());
  };

  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
  uint32_t pa[kBN / 16][4];
  float alpha[2];

  mbar_wait(sm.full_k(stage(0)), phase(0));
  {
    float s[kSRegs];
    wgmma_fence_operands(s);
    wgmma_fence();
    issue_s(s, stage(0));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);
    if (lane == 0) mbar_arrive(sm.empty_k(stage(0)));
    if (n_tiles == 1) release_q();
    softmax(s, tile_at(0) * kBN, alpha);
    pack_p(s, pa);
  }

  // Each step issues S(i) = Q·K(i)ᵀ and then O += P(i-1)·V(i-1) as two MMA groups, runs the softmax of
  // S(i) while the second group is in flight, and packs P(i) once both are done.
  for (int i = 1; i < n_tiles; ++i) {
    const int st = stage(i), prev_st = stage(i - 1);
    mbar_wait(sm.full_k(st), phase(i));
    mbar_wait(sm.full_v(prev_st), phase(i - 1));
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
    if (lane == 0) mbar_arrive(sm.empty_k(st));
    if (i == n_tiles - 1) release_q();
    softmax(s, tile_at(i) * kBN, alpha);
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    if (lane == 0) mbar_arrive(sm.empty_v(prev_st));
    pack_p(s, pa);
  }
  const int last_st = stage(n_tiles - 1);
  mbar_wait(sm.full_v(last_st), phase(n_tiles - 1));
  rescale_o(o, alpha);
  wgmma_fence_operands(o);
  wgmma_fence();
  issue_pv(o, pa, last_st);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(o);
  if (lane == 0) mbar_arrive(sm.empty_v(last_st));
  pipe.kv += n_tiles;

  // Normalise and store straight from the accumulators (the Q buffer may already hold the next
  // item's queries): lanes t = 0..3 of a row write 16 contiguous bytes per 8 columns.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int r = my_row + 8 * h;
    if (r < valid_rows) {
      T* row = o_base + static_cast<int64_t>(r) * args.out_row_stride + 2 * t;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        *reinterpret_cast<uint32_t*>(row + j * 8) = pack2<T>(o[j * 4 + h * 2] * inv, o[j * 4 + h * 2 + 1] * inv);
    }
  }
}

template <typename T, int kHeadDim, int kConsumerWgs>
__global__ void __launch_bounds__(HopperPrefillConfig<kHeadDim, kConsumerWgs>::kThreads, 1)
    prefill_hopper_kernel(const __grid_constant__ PrefillArgs args, const __grid_constant__ HopperTensorMaps maps,
                          const HopperSchedule schedule) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Built for another architecture: wgmma and setmaxnreg do not exist there, and the dispatch never
  // launches this kernel (hopper_prefill_supported checks TESSERA_CUDA_SM90A and the device).
  __trap();
#else
  extern __shared__ __align__(1024) unsigned char smem_hopper[];
  using Cfg = HopperPrefillConfig<kHeadDim, kConsumerWgs>;
  const HopperSmem<kHeadDim, kConsumerWgs> sm(smem_hopper);
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int st = 0; st < Cfg::kStages; ++st) {
      mbar_init(sm.full_k(st), 1);  // the producer's arrive with the tile's bytes
      mbar_init(sm.full_v(st), 1);
      mbar_init(sm.empty_k(st), 4 * Cfg::kConsumers);  // lane 0 of every consumer warp
      mbar_init(sm.empty_v(st), 4 * Cfg::kConsumers);
    }
    mbar_init(sm.q_full(), 1);
    mbar_init(sm.q_empty(), 4 * Cfg::kConsumers);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (tid < 128) {
    // ---------------------------------------------------------------- producer (one thread works)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg::kProducerRegs));
    if (tid != 0) return;
    HopperPipeline pipe;
    for (int item = blockIdx.x; item < schedule.items; item = next_hopper_item(schedule)) {
      const HopperItem work = hopper_item(schedule, args.num_heads, item);
      const int q_len = args.cu_seqlens_q[work.seq + 1] - args.cu_seqlens_q[work.seq];
      if (work.q_tile * Cfg::kBlockM >= q_len) continue;  // past a shorter sequence's end
      const MaskParams mask = args.masks[work.seq];
      with_mask_kind(mask.kind, [&](auto kind) {
        produce_tile<T, kHeadDim, kConsumerWgs, decltype(kind)::value>(args, maps, mask, work, item, sm, pipe);
      });
    }
    if (pipe.handovers > 0) mbar_wait(sm.q_empty(), (pipe.handovers - 1) & 1);
    sm.item(pipe.handovers) = -1;
    mbar_arrive(sm.q_full());
    return;
  }

  // ---------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg::kConsumerRegs));
  const int consumer = tid / 128 - 1;
  // The MMA-issue turn goes round the consumers over every item of the CTA; consumer 0 goes first.
  if (consumer == Cfg::kConsumers - 1) named_barrier_arrive(1, 256);
  HopperPipeline pipe;
  for (;;) {
    mbar_wait(sm.q_full(), pipe.handovers & 1);
    if (sm.item(pipe.handovers) < 0) break;
    with_mask_kind(sm.kind(pipe.handovers), [&](auto kind) {
      consume_tile<T, kHeadDim, kConsumerWgs, decltype(kind)::value>(args, sm, pipe);
    });
  }
  // Consume the last outstanding hand-over to consumer 0 (the initial one when no item had two tiles).
  if (consumer == 0) named_barrier_sync(1, 256);
  if (schedule.counters != nullptr && tid == 128) finish_hopper_schedule(schedule);
#endif
}

// The grid: one CTA per SM when the call brings tile counters and has more items than SMs, else one
// per work item.
template <typename T, int kHeadDim, int kConsumerWgs>
cudaError_t launch_prefill_hopper_typed(const PrefillArgs& args, const HopperTensorMaps& maps, int num_sms,
                                        cudaStream_t stream) {
  using Cfg = HopperPrefillConfig<kHeadDim, kConsumerWgs>;
  const auto kernel = prefill_hopper_kernel<T, kHeadDim, kConsumerWgs>;
  const cudaError_t attr = allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel),
                                                       static_cast<int>(Cfg::kSmemBytes));
  if (attr != cudaSuccess) return attr;
  HopperSchedule schedule;
  schedule.q_tiles = (args.max_seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t items = static_cast<int64_t>(schedule.q_tiles) * args.num_heads * args.num_seqs;
  if (items > INT32_MAX) return cudaErrorInvalidValue;
  schedule.items = static_cast<int>(items);
  schedule.pairs = args.num_heads * args.num_seqs;
  // A group's K and V (2 bytes a value, without counting what GQA shares) within 16 MiB, a third of
  // the H100's L2; more than 16 pairs gains nothing more on the tail.
  const int64_t pair_bytes = static_cast<int64_t>(std::max(args.max_seqlen_q, 1)) * kHeadDim * 4;
  schedule.group = static_cast<int>(std::clamp<int64_t>((int64_t{16} << 20) / pair_bytes, 1, 16));
  // With no more items than SMs every item has a CTA from the start, and handing items out through
  // the counters only adds their round trips: about 1 us on one sequence of 128 or 512 tokens (H200,
  // hd64 and hd128), where one CTA an item ran 0.3-1 us faster.
  schedule.counters = schedule.items > num_sms ? args.tile_counters : nullptr;
  const int grid = schedule.counters != nullptr ? num_sms : schedule.items;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args, maps, schedule);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
