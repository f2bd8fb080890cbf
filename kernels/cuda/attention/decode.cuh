// kernels/cuda/attention/decode.cuh: paged decode attention (one query token per sequence), kernel
// then launcher.
//
// One CTA = (KV split, KV head x query-head tile, sequence). It reads each K and V row of its split
// once for up to 8 query heads, so GQA costs no extra KV traffic. Both products run on tensor cores
// in a transposed form that puts tokens on the MMA's M side and the query heads on its N side:
//   S^T (16 tokens x 8 heads) = K (16 x head_dim) . Q^T        K straight from shared memory (ldmatrix)
//   O^T (head_dim x 8 heads) += V^T (head_dim x 16) . P^T      V through ldmatrix.trans; P^T is the
//                                                              S^T accumulator, moved into the B
//                                                              operand by movmatrix.trans
// so a 4-head GQA group wastes half of an 8-wide N instead of 12 of 16 rows of M, and each thread's
// softmax state (two heads) lines up with its O^T accumulator columns: no shuffles to rescale.
//   - each warp owns every 4th 16-token tile of the split and a private cp.async ring of kStages
//     tiles, so warps never wait for each other until the end;
//   - the split's physical rows are resolved from the block table once, into shared memory;
//   - before the programmatic-launch wait, each warp fills its whole ring, one tile at a time (every
//     row but the sequence's newest, which the previous kernel may be writing), and the CTA
//     prefetches the next kPrefetchTiles tiles into L2, so the KV stream runs while the previous
//     kernel finishes (see attention.h for what that asks of the caller). Later tiles need no
//     prefetch: the rings keep enough bytes in flight, and prefetching further ahead thrashed L2 at
//     16k. KV goes through L2 as evict-first, since it is read once per step. Dependents are released
//     only after the wait, so at most two decode grids share the GPU;
// With more than one split, each CTA writes partials (o / l in the activation dtype, which halves
// what the merging CTA pulls, and m, l in fp32) and the last CTA of a (sequence, KV head, head tile)
// to finish merges them: the reduction costs no second launch, which matters at batch 1 where the
// whole step is a few microseconds. Its counter returns to 0 after every merge.
#pragma once

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/kernel_attributes.cuh"
#include "kernels/cuda/common/fp8.cuh"
#include "kernels/cuda/common/mma.cuh"

#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <utility>

namespace tessera::kernels::cuda {

// kKvBytes: bytes of one cached value (2: the activation type; 1: an e4m3 cache).
template <int kHeadDim, int kKvBytes = 2>
struct DecodeConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTile = 16;         // tokens per warp step (the MMA's M)
  static constexpr int kHeadTile = 8;      // query heads per CTA (the MMA's N)
  static constexpr int kStages = 3;        // per-warp cp.async ring depth
  static constexpr int kPrefetchTiles = 4; // tiles past the rings prefetched before the wait (a multiple of kWarps)
  // Shared rows are padded by 16 bytes: 8 consecutive rows then start in 8 different bank groups,
  // so ldmatrix is conflict-free.
  static constexpr int kRowBytes = kHeadDim * 2 + 16;          // a row as ldmatrix reads it (activation type)
  static constexpr int kKvRowBytes = kHeadDim * kKvBytes + 16;  // a row as cp.async lands it (cache type)
  static constexpr int kStageBytes = 2 * kTile * kKvRowBytes;  // K rows, then V rows
  static constexpr int kWarpRingBytes = kStages * kStageBytes;
  // With an e4m3 cache each landed tile is widened into one stage of activation-type rows, which the
  // MMAs then read as they read a bf16 ring: the ring (and the DRAM stream) stays at one byte a value.
  static constexpr int kWidenBytes = kKvBytes == 2 ? 0 : 2 * kTile * kRowBytes;
  static constexpr int kWarpBytes = kWarpRingBytes + kWidenBytes;  // one warp's shared memory
  static constexpr int kMaxChunk = 1024;   // tokens per split (row-number table in shared memory)
  static constexpr int kMaxSplits = 512;   // partials merged by one CTA
  static constexpr int kSmemBytes = kWarps * kWarpBytes + kMaxChunk * 4;
  // The warps' results reuse their rings at the end.
  static_assert(kHeadTile * (kHeadDim + 2) * 4 <= kWarpBytes, "warp result must fit in its ring");
  static_assert(kHeadDim % 16 == 0, "the MMAs step through head dims 16 at a time");
  static_assert((kRowBytes / 16) % 2 == 1, "rows of an odd number of 16-byte chunks keep ldmatrix conflict-free");
  static_assert(kKvBytes == 1 || kKvBytes == 2, "a cached value is 2 bytes or e4m3");
  static_assert(kPrefetchTiles % kWarps == 0, "a warp prefetches its own tiles");
};

// Where the split-KV partials live inside the caller's workspace.
struct DecodeSplitPlan {
  int num_splits = 1;
  int chunk = 512;          // visible tokens per split
  int head_tiles = 1;       // CTAs per KV head when the query group exceeds kHeadTile
  size_t partial_o_offset = 0, partial_ml_offset = 0, bytes = 0;  // in DecodeWorkspace::partials
  int64_t counters = 0;  // merge counters used (DecodeWorkspace::counters), one per (sequence, gridDim.y)
};

__device__ __forceinline__ float decode_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// T: the activation type (q, out, partials); KvT: the cache's storage type (T, or e4m3_t).
template <typename T, typename KvT, int kHeadDim>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim, sizeof(KvT)>::kThreads)
    decode_kernel(const __grid_constant__ DecodeArgs args, DecodeSplitPlan plan,
                  T* partial_o,        // [num_seqs, num_heads, num_splits, head_dim], divided by l
                  float* partial_ml,   // [num_seqs, num_heads, num_splits, 2]: max (log2 domain), sum
                  int* counters) {     // [num_seqs, num_kv_heads * head_tiles], 0 between calls
  constexpr int kKvBytes = static_cast<int>(sizeof(KvT));
  constexpr bool kWiden = kKvBytes != static_cast<int>(sizeof(T));  // e4m3 rows widened before the MMAs
  using Cfg = DecodeConfig<kHeadDim, kKvBytes>;
  constexpr int kTile = Cfg::kTile, kW = Cfg::kWarps, kNT = Cfg::kHeadTile;
  constexpr int kKSteps = kHeadDim / 16;   // k-steps of S^T, m-tiles of O^T
  extern __shared__ __align__(16) unsigned char smem[];
  int32_t* rows = reinterpret_cast<int32_t*>(smem + kW * Cfg::kWarpBytes);  // physical row per local token
  __shared__ bool is_last;

  const int split = blockIdx.x, seq = blockIdx.z;
  const int kv_head = blockIdx.y / plan.head_tiles, head_tile = blockIdx.y % plan.head_tiles;
  const int group = args.num_heads / args.num_kv_heads;
  const int head0 = kv_head * group + head_tile * kNT;
  const int heads = group - head_tile * kNT < kNT ? group - head_tile * kNT : kNT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int block_shift = args.block_size == 16 ? 4 : 5;

  // Context length, mask and block table are read before the programmatic-launch wait (attention.h:
  // they must come from a non-PDL operation earlier in the stream). Without a mask a split's tokens
  // are v_begin + i whatever the context, so its table entries are loaded together with the context
  // length. Entries past the context are read (the row is max_blocks_per_seq wide), never used.
  const int32_t* table = args.block_tables + static_cast<int64_t>(seq) * args.max_blocks_per_seq;
  constexpr int kRowsPerThread = Cfg::kMaxChunk / Cfg::kThreads;
  const bool no_mask = args.masks == nullptr;
  const int v_begin = split * plan.chunk;
  int32_t blk[kRowsPerThread];
  if (no_mask) {
    const int table_tokens = args.max_blocks_per_seq << block_shift;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = threadIdx.x + r * Cfg::kThreads;
      blk[r] = i < plan.chunk && v_begin + i < table_tokens ? __ldg(table + ((v_begin + i) >> block_shift)) : 0;
    }
  }

  // The visible keys of the query at position ctx - 1: [0, lead) and [start, ctx).
  const int ctx = args.context_lens[seq];
  int lead = 0, start = 0;
  if (!no_mask && ctx > 0) {
    const MaskParams mask = args.masks[seq];
    lead = mask.leading_keys() < ctx ? mask.leading_keys() : ctx;
    start = mask.lowest_key(ctx - 1);
    if (start < lead) start = lead;
  }
  const int n_visible = lead + (ctx - start);
  const int splits_used = n_visible > 0 ? (n_visible + plan.chunk - 1) / plan.chunk : 1;
  if (split >= splits_used) return;
  const int n = n_visible - v_begin < plan.chunk ? n_visible - v_begin : plan.chunk;

  if (no_mask) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = threadIdx.x + r * Cfg::kThreads;
      if (i < n) rows[i] = (blk[r] << block_shift) + ((v_begin + i) & (args.block_size - 1));
    }
  } else {
    for (int i = threadIdx.x; i < n; i += Cfg::kThreads) {
      const int vi = v_begin + i;
      const int token = vi < lead ? vi : start + (vi - lead);
      rows[i] = (table[token >> block_shift] << block_shift) + (token & (args.block_size - 1));
    }
  }
  __syncthreads();

  const int64_t token_stride = static_cast<int64_t>(args.num_kv_heads) * kHeadDim;
  const KvT* k_head = static_cast<const KvT*>(args.k_cache) + kv_head * kHeadDim;
  const KvT* v_head = static_cast<const KvT*>(args.v_cache) + kv_head * kHeadDim;
  const int num_tiles = (n + kTile - 1) / kTile;

  // L2 prefetch of one tile's K and V rows (128-byte lines), by the warp that will load it. A row
  // starts at a multiple of its own size, so a row of whole lines, or one that divides a line, lies
  // in whole lines; any other (head dims 80, 96) may straddle one line more, which the prefetch of
  // its last element reaches.
  auto prefetch_tile = [&](int tile) {
    constexpr int kCachedRowBytes = kHeadDim * kKvBytes;
    constexpr bool kWholeLines = kCachedRowBytes % 128 == 0 || 128 % kCachedRowBytes == 0;
    constexpr int kLines = kWholeLines ? (kCachedRowBytes + 127) / 128 : kCachedRowBytes / 128 + 2;
    for (int j = lane; j < 2 * kTile * kLines; j += 32) {
      const int local = tile * kTile + j % kTile;
      if (local < n) {
        const KvT* base = (j / kTile) % 2 == 0 ? k_head : v_head;
        const int line = j / (2 * kTile);
        const int elem = line * (128 / kKvBytes);
        const int at = kWholeLines || elem < kHeadDim ? elem : kHeadDim - 1;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + rows[local] * token_stride + at));
      }
    }
  };

  // This warp's ring. Tokens past n are zero-filled: their scores are masked, and a zero V row keeps
  // 0 * V finite. `skip` (a local index, or -1) is a row left out: its slot is filled separately.
  unsigned char* ring = smem + warp * Cfg::kWarpBytes;
  const uint32_t ring_addr = smem_addr(ring);
  constexpr int kChunksPerRow = kHeadDim * kKvBytes / 16;  // 16-byte pieces of a cached row
  constexpr int kChunkElems = 16 / kKvBytes;
  const uint64_t stream_policy = l2_evict_first_policy();  // KV is read once per step: keep L2 for the rest
  auto issue_tile = [&](int tile, int slot, int skip) {
    const uint32_t stage = ring_addr + slot * Cfg::kStageBytes;
#pragma unroll
    for (int c = lane; c < kTile * kChunksPerRow; c += 32) {
      const int tok = c / kChunksPerRow, piece = c % kChunksPerRow;
      const int local = tile * kTile + tok;
      if (local == skip) continue;
      const bool valid = local < n;
      const int64_t off = valid ? rows[local] * token_stride + piece * kChunkElems : 0;
      cp_async16(stage + tok * Cfg::kKvRowBytes + piece * 16, k_head + off, valid, stream_policy);
      cp_async16(stage + (kTile + tok) * Cfg::kKvRowBytes + piece * 16, v_head + off, valid, stream_policy);
    }
  };

  // Fill the ring before the wait with every row but the sequence's newest (position ctx - 1, the
  // last visible key: local n - 1 of the last split), which the previous kernel may still be
  // writing; it is loaded after the wait. One tile per warp is in flight at a time: this kernel's KV
  // stream then runs beside the previous kernel at about the DRAM rate, instead of queueing ~100 KB
  // per SM at once behind which every round trip of that kernel's merge waited (H100, B1 4k, same
  // run: 9.3 us unpaced, 8.3 paced, 7.4 paced with the evict-first policy and the prefetch below).
  // One commit group per ring slot, empty ones included, so the loop's wait count is uniform.
  // A split that holds more of the keys the previous kernel writes than the newest (a speculative
  // verify's, DecodeArgs::step_keys) fills its ring only after the wait.
  const int my_tiles = warp < num_tiles ? (num_tiles - 1 - warp) / kW + 1 : 0;
  const bool fill_after_wait = args.step_keys > 1 && v_begin + n > n_visible - args.step_keys;
  const int newest = split == splits_used - 1 ? n - 1 : -1;
  const int newest_tile = newest >= 0 ? newest / kTile : -1;
  const bool newest_in_ring =
      !fill_after_wait && newest >= 0 && newest_tile % kW == warp && newest_tile / kW < Cfg::kStages;
  auto fill_ring = [&](int skip) {
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      if (s < my_tiles) issue_tile(warp + s * kW, s, skip);
      cp_async_commit();
      cp_async_wait<0>();
    }
  };
  if (!fill_after_wait) fill_ring(newest);
  constexpr int kRingTiles = kW * Cfg::kStages;  // tiles the rings hold before the wait
  for (int tile = kRingTiles + warp; tile < num_tiles && tile < kRingTiles + Cfg::kPrefetchTiles; tile += kW)
    prefetch_tile(tile);

  // Everything below may read what the previous kernel wrote (q, the newest K/V row) or write what
  // it reads (out, the workspace). The next kernel is released only now: released earlier, it could
  // start while the previous one still runs, so that its pre-wait reads race with that kernel's
  // writes (attention.h), and a third KV set would crowd L2.
  pdl_wait_previous();
  pdl_launch_dependents();
  // Row strides are resolved by the launcher (0 -> num_heads * head_dim), so q and out may be views.
  T* out = static_cast<T*>(args.out) + static_cast<int64_t>(seq) * args.out_row_stride + head0 * kHeadDim;
  if (n_visible == 0) {  // empty context: output 0
    for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) out[idx] = from_float<T>(0.f);
    return;
  }
  if (fill_after_wait) fill_ring(-1);
  if (newest_in_ring) {  // the newest row into its ring slot, through L2 (never a stale L1 line)
    unsigned char* stage = ring + (newest_tile / kW) * Cfg::kStageBytes;
    const int tok = newest % kTile;
    for (int c = lane; c < 2 * kChunksPerRow; c += 32) {
      const int piece = c % kChunksPerRow;
      const bool is_v = c >= kChunksPerRow;
      const KvT* src = (is_v ? v_head : k_head) + rows[newest] * token_stride + piece * kChunkElems;
      *reinterpret_cast<uint4*>(stage + ((is_v ? kTile : 0) + tok) * Cfg::kKvRowBytes + piece * 16) =
          __ldcg(reinterpret_cast<const uint4*>(src));
    }
  }

  // Q^T as the B operand (k = head dims, n = query heads): thread (g, t) = (lane / 4, lane % 4) holds
  // head g's dims 2t, 2t + 1 and 2t + 8, 2t + 9 of each 16-dim step. Heads past `heads` are zero:
  // their scores are finite and never written out.
  const int g = lane >> 2, t = lane & 3;
  uint32_t q_frag[kKSteps][2];
  {
    const T* q_row =
        static_cast<const T*>(args.q) + static_cast<int64_t>(seq) * args.q_row_stride + (head0 + g) * kHeadDim;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      q_frag[kk][0] = g < heads ? *reinterpret_cast<const uint32_t*>(q_row + kk * 16 + 2 * t) : 0u;
      q_frag[kk][1] = g < heads ? *reinterpret_cast<const uint32_t*>(q_row + kk * 16 + 8 + 2 * t) : 0u;
    }
  }
  const float scale_log2 = args.softmax_scale * 1.4426950408889634f;  // scores in the log2 domain

  // Online softmax state of heads 2t and 2t + 1 (m in the log2 domain; l is this thread's share,
  // summed across the warp at the end), and O^T: o[mt] holds dims mt*16 + g and mt*16 + g + 8 of
  // heads 2t and 2t + 1.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float o[kKSteps][4];
#pragma unroll
  for (int mt = 0; mt < kKSteps; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;

  // ldmatrix row addresses: K as the A operand (rows = tokens), V transposed (rows = tokens, read as
  // columns of V^T).
  const uint32_t k_lane = (((lane & 7) + ((lane >> 3) & 1) * 8) * Cfg::kRowBytes) + (lane >> 4) * 16;
  const uint32_t v_lane = (kTile + (lane & 7) + (lane >> 4) * 8) * Cfg::kRowBytes + ((lane >> 3) & 1) * 16;

  for (int i = 0; i < my_tiles; ++i) {
    const int tile = warp + i * kW;
    cp_async_wait<Cfg::kStages - 1>();  // kStages + i groups committed: tile i's has landed
    __syncwarp();
    uint32_t stage = ring_addr + (i % Cfg::kStages) * Cfg::kStageBytes;
    if constexpr (kWiden) {
      // e4m3 -> T for the tile's 2 * kTile rows, 16 cached bytes a lane at a time, into the widening
      // stage after the ring (exact: kernels/cuda/common/fp8.cuh). The barrier at the end of the
      // previous iteration ordered every lane's reads of it before these writes.
      const unsigned char* landed = ring + (i % Cfg::kStages) * Cfg::kStageBytes;
      unsigned char* wide = ring + Cfg::kWarpRingBytes;
#pragma unroll
      for (int c = lane; c < 2 * kTile * kChunksPerRow; c += 32) {
        const int r = c / kChunksPerRow, piece = c % kChunksPerRow;
        const uint4 in = *reinterpret_cast<const uint4*>(landed + r * Cfg::kKvRowBytes + piece * 16);
        uint4* out = reinterpret_cast<uint4*>(wide + r * Cfg::kRowBytes + piece * 32);
        out[0] = vec8_from_e4m3x8<T>(make_uint2(in.x, in.y));
        out[1] = vec8_from_e4m3x8<T>(make_uint2(in.z, in.w));
      }
      __syncwarp();
      stage = ring_addr + Cfg::kWarpRingBytes;
    }

    // S^T = K Q^T, two accumulators to halve the dependent MMA chain.
    float s_even[4] = {0.f, 0.f, 0.f, 0.f}, s_odd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, stage + k_lane + kk * 32);
      mma_16816<T>(kk % 2 == 0 ? s_even : s_odd, a, q_frag[kk][0], q_frag[kk][1]);
    }
    // Thread (g, t) has tokens g and g + 8 of heads 2t and 2t + 1.
    const bool valid_lo = tile * kTile + g < n, valid_hi = tile * kTile + g + 8 < n;
    const float x0 = valid_lo ? (s_even[0] + s_odd[0]) * scale_log2 : -INFINITY;
    const float x1 = valid_lo ? (s_even[1] + s_odd[1]) * scale_log2 : -INFINITY;
    const float x2 = valid_hi ? (s_even[2] + s_odd[2]) * scale_log2 : -INFINITY;
    const float x3 = valid_hi ? (s_even[3] + s_odd[3]) * scale_log2 : -INFINITY;
    float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {  // across the 8 token rows (lanes with the same t)
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    // Every tile has a visible token, so the new maxima are finite.
    const float new0 = fmaxf(m0, mx0), new1 = fmaxf(m1, mx1);
    const float r0 = decode_exp2(m0 - new0), r1 = decode_exp2(m1 - new1);  // 0 on the first tile
    const float p0 = decode_exp2(x0 - new0), p1 = decode_exp2(x1 - new1);
    const float p2 = decode_exp2(x2 - new0), p3 = decode_exp2(x3 - new1);
    m0 = new0;
    m1 = new1;
    l0 = fmaf(l0, r0, p0 + p2);
    l1 = fmaf(l1, r1, p1 + p3);
    const uint32_t b0 = movmatrix_trans(pack2<T>(p0, p1)), b1 = movmatrix_trans(pack2<T>(p2, p3));
#pragma unroll
    for (int mt = 0; mt < kKSteps; ++mt) {
      o[mt][0] *= r0;
      o[mt][1] *= r1;
      o[mt][2] *= r0;
      o[mt][3] *= r1;
      uint32_t a[4];
      ldmatrix_x4_trans(a, stage + v_lane + mt * 32);
      mma_16816<T>(o[mt], a, b0, b1);
    }
    __syncwarp();  // every lane is done with the slot before it is refilled
    const int ahead = i + Cfg::kStages;
    if (ahead < my_tiles) issue_tile(warp + ahead * kW, i % Cfg::kStages, -1);
    cp_async_commit();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }

  // Each warp's (o, m, l) per head into its own ring, then the warps are combined.
  __syncwarp();
  float* warp_o = reinterpret_cast<float*>(ring);   // [kHeadTile][kHeadDim]
  float* warp_ml = warp_o + kNT * kHeadDim;         // [kHeadTile][2]
#pragma unroll
  for (int mt = 0; mt < kKSteps; ++mt) {
    warp_o[(2 * t) * kHeadDim + mt * 16 + g] = o[mt][0];
    warp_o[(2 * t + 1) * kHeadDim + mt * 16 + g] = o[mt][1];
    warp_o[(2 * t) * kHeadDim + mt * 16 + g + 8] = o[mt][2];
    warp_o[(2 * t + 1) * kHeadDim + mt * 16 + g + 8] = o[mt][3];
  }
  if (g == 0) {
    warp_ml[4 * t] = m0;
    warp_ml[4 * t + 1] = l0;
    warp_ml[4 * t + 2] = m1;
    warp_ml[4 * t + 3] = l1;
  }
  __syncthreads();

  // This split's (o, m, l) for head h, dim d; o unnormalised.
  auto split_result = [&](int h, int d, float& o_out, float& m, float& l) {
    auto warp_base = [&](int w) { return reinterpret_cast<const float*>(smem + w * Cfg::kWarpBytes); };
    m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kW; ++w) m = fmaxf(m, warp_base(w)[kNT * kHeadDim + 2 * h]);
    o_out = 0.f;
    l = 0.f;
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      const float* wb = warp_base(w);
      const float mw = wb[kNT * kHeadDim + 2 * h];
      const float s = mw == -INFINITY ? 0.f : decode_exp2(mw - m);
      o_out += wb[h * kHeadDim + d] * s;
      l += wb[kNT * kHeadDim + 2 * h + 1] * s;
    }
  };

  if (splits_used == 1) {
    for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) {
      float ov, m, l;
      split_result(idx / kHeadDim, idx % kHeadDim, ov, m, l);
      out[idx] = from_float<T>(ov / l);
    }
    return;
  }

  const int64_t part_row = static_cast<int64_t>(seq) * args.num_heads + head0;  // (seq, head0)
  for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) {
    const int h = idx / kHeadDim, d = idx % kHeadDim;
    float ov, m, l;
    split_result(h, d, ov, m, l);
    partial_o[((part_row + h) * plan.num_splits + split) * kHeadDim + d] = from_float<T>(ov / l);
    if (d == 0) {
      partial_ml[((part_row + h) * plan.num_splits + split) * 2] = m;
      partial_ml[((part_row + h) * plan.num_splits + split) * 2 + 1] = l;
    }
  }
  // Counted with one acquire-release atomic: the barrier orders every thread's partial writes before
  // thread 0's release, and the last CTA's acquire makes all splits' partials visible to it.
  __syncthreads();
  int* counter = counters + static_cast<int64_t>(seq) * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) {
    int ticket;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(ticket) : "l"(counter) : "memory");
    is_last = ticket == splits_used - 1;
  }
  __syncthreads();
  if (!is_last) return;

  // Merge: out_h = sum_s w_s o_s / sum_s w_s with w_s = l_s 2^(m_s - M) (o_s already divided by l_s),
  // one pass with a running max. Each thread owns 4 outputs and issues 16 splits' (m, l) and o loads
  // before using any.
  constexpr int kQuads = kHeadDim / 4, kBatch = 16;
  for (int idx = threadIdx.x; idx < heads * kQuads; idx += Cfg::kThreads) {
    const int h = idx / kQuads, d4 = idx % kQuads;
    const float2* ml = reinterpret_cast<const float2*>(partial_ml + (part_row + h) * plan.num_splits * 2);
    const uint2* po = reinterpret_cast<const uint2*>(partial_o + (part_row + h) * plan.num_splits * kHeadDim) + d4;
    float m_all = -INFINITY, den = 0.f;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < splits_used; s0 += kBatch) {
      float2 mls[kBatch];
      uint2 ps[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        if (s0 + k < splits_used) {
          mls[k] = __ldcg(ml + s0 + k);
          ps[k] = __ldcg(po + static_cast<int64_t>(s0 + k) * kQuads);
        } else {
          mls[k] = make_float2(-INFINITY, 0.f);
          ps[k] = make_uint2(0u, 0u);
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const float m_new = fmaxf(m_all, mls[k].x);
        const float m_ref = m_new == -INFINITY ? 0.f : m_new;
        const float a = decode_exp2(m_all - m_ref), b = mls[k].y * decode_exp2(mls[k].x - m_ref);
        const float2 o01 = unpack2<T>(ps[k].x), o23 = unpack2<T>(ps[k].y);
        den = fmaf(den, a, b);
        sum.x = fmaf(sum.x, a, o01.x * b);
        sum.y = fmaf(sum.y, a, o01.y * b);
        sum.z = fmaf(sum.z, a, o23.x * b);
        sum.w = fmaf(sum.w, a, o23.y * b);
        m_all = m_new;
      }
    }
    const float inv = 1.f / den;
    T* dst = out + h * kHeadDim + d4 * 4;
    dst[0] = from_float<T>(sum.x * inv);
    dst[1] = from_float<T>(sum.y * inv);
    dst[2] = from_float<T>(sum.z * inv);
    dst[3] = from_float<T>(sum.w * inv);
  }
  if (threadIdx.x == 0) *counter = 0;
}

// The head dims the kernel is instantiated for (decode.cu), each for every (activation, cache) pair.
using DecodeHeadDims = std::integer_sequence<int, 32, 64, 80, 96, 128, 256>;

// Calls f(std::integral_constant<int, D>{}) for the listed head dim D equal to head_dim; false if none is.
template <typename F, int... kDims>
bool with_head_dim_of(std::integer_sequence<int, kDims...>, int head_dim, F&& f) {
  return ((head_dim == kDims && (f(std::integral_constant<int, kDims>{}), true)) || ...);
}
template <typename F>
bool with_decode_head_dim(int head_dim, F&& f) {
  return with_head_dim_of(DecodeHeadDims{}, head_dim, f);
}

// Shared memory of the head-dim instance for a cache of kKvBytes a value (0 for a head dim not built).
template <int kKvBytes>
int decode_smem_bytes(int head_dim) {
  int bytes = 0;
  with_decode_head_dim(head_dim, [&](auto dim) { bytes = DecodeConfig<decltype(dim)::value, kKvBytes>::kSmemBytes; });
  return bytes;
}

// CTAs of one (head-dim, cache type) instance that fit on an SM at once (shared memory is the limit:
// 228 KB per SM, 1 KB of it reserved per CTA).
inline int decode_ctas_per_sm(int head_dim, KvDType kv_dtype) {
  const int smem = kv_dtype == KvDType::kFp8E4M3 ? decode_smem_bytes<1>(head_dim) : decode_smem_bytes<2>(head_dim);
  const int fit = (228 * 1024) / (smem + 1024);
  return fit < 1 ? 1 : (fit > 8 ? 8 : fit);
}

inline DecodeSplitPlan plan_decode_split(const DecodeArgs& args, int num_sms) {
  constexpr int kHeadTile = DecodeConfig<128>::kHeadTile, kMaxChunk = DecodeConfig<128>::kMaxChunk;
  constexpr int kMaxSplits = DecodeConfig<128>::kMaxSplits;
  DecodeSplitPlan plan;
  const int group = args.num_heads / args.num_kv_heads;
  plan.head_tiles = (group + kHeadTile - 1) / kHeadTile;
  const int64_t base_ctas = static_cast<int64_t>(args.num_seqs) * args.num_kv_heads * plan.head_tiles;
  const int64_t planned_ctas = args.split_as_one_sequence ? base_ctas / args.num_seqs : base_ctas;
  const int max_ctx = args.max_context_len > 1 ? args.max_context_len : 1;
  // Split length. When every split of the batch fits with one CTA per SM, the shortest such split
  // wins: the other half of each SM then holds the next kernel's CTAs, which fill their rings while
  // this one runs, so the step costs its KV stream rather than its prologue, merge and launch gap.
  // Once such a split reaches kMaxChunk tokens, one CTA an SM keeps too few bytes in flight: two an SM
  // of half the length, still one wave, streamed 92% of copy bandwidth at a 16k context on the H100
  // where one an SM of 1,024 streamed 78% (at 4k, splits of 128 two an SM lost to 256 one an SM).
  // Otherwise a small cost model in token-equivalents: `resident` CTAs fit on the GPU, each costs its
  // tokens plus a fixed ~256 (prologue, partial write, merge share), and the grid runs in waves of
  // `resident`. Chunks are multiples of 32 so that the split count can make the last wave nearly
  // full. TESSERA_DECODE_CHUNK (benchmarking only) forces a chunk.
  auto splits_of = [&](int chunk) { return (max_ctx + chunk - 1) / chunk; };
  static const int forced_chunk = [] {
    const char* e = std::getenv("TESSERA_DECODE_CHUNK");
    const int c = e != nullptr ? std::atoi(e) : 0;
    return c >= 32 && c <= kMaxChunk ? c : 0;
  }();
  const int64_t splits_one_per_sm = num_sms / planned_ctas;
  const int64_t resident = static_cast<int64_t>(decode_ctas_per_sm(args.head_dim, args.kv_dtype)) * num_sms;
  int64_t one_per_sm_chunk = 0;
  if (splits_one_per_sm >= 1 && resident >= 2 * num_sms) {
    // Shorter splits cost more in merging than they save; where that turns over depends on the model
    // and the GPU, so the caller may choose (DecodeArgs::min_split_tokens).
    const int64_t min_chunk = args.min_split_tokens > 0 ? args.min_split_tokens : kDefaultMinSplitTokens;
    const int64_t even = (max_ctx + splits_one_per_sm - 1) / splits_one_per_sm;
    one_per_sm_chunk = std::max<int64_t>(min_chunk, (even + 31) / 32 * 32);
    const int64_t splits_two_per_sm = 2 * num_sms / planned_ctas;
    if (one_per_sm_chunk >= kMaxChunk && planned_ctas * splits_two_per_sm <= resident) {
      const int64_t half = (max_ctx + splits_two_per_sm - 1) / splits_two_per_sm;
      one_per_sm_chunk = std::max<int64_t>(min_chunk, (half + 31) / 32 * 32);
    }
  }
  if (one_per_sm_chunk > 0 && one_per_sm_chunk <= kMaxChunk) {
    plan.chunk = static_cast<int>(one_per_sm_chunk);
  } else {
    double best_cost = 0;
    for (int chunk = 64; chunk <= kMaxChunk; chunk += 32) {
      if (splits_of(chunk) > kMaxSplits) continue;
      const int64_t ctas = planned_ctas * splits_of(chunk);
      const double cost = static_cast<double>((ctas + resident - 1) / resident) * (chunk + 256.0);
      if (best_cost == 0 || cost < best_cost) {
        best_cost = cost;
        plan.chunk = chunk;
      }
    }
  }
  if (forced_chunk > 0 && splits_of(forced_chunk) <= kMaxSplits) plan.chunk = forced_chunk;
  plan.num_splits = splits_of(plan.chunk);
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(args.num_seqs) * args.num_heads * plan.num_splits;
    plan.partial_o_offset = 0;
    plan.partial_ml_offset = rows * args.head_dim * 2;  // bf16 or fp16
    plan.bytes = plan.partial_ml_offset + rows * 2 * sizeof(float);
    plan.counters = base_ctas;
  }
  return plan;
}

template <typename T, typename KvT, int kHeadDim>
cudaError_t launch_decode(const DecodeArgs& args, const DecodeSplitPlan& plan, const DecodeWorkspace& workspace,
                          cudaStream_t stream) {
  using Cfg = DecodeConfig<kHeadDim, sizeof(KvT)>;
  auto kernel = decode_kernel<T, KvT, kHeadDim>;
  // The kernel addresses q and out through their row strides only; 0 means contiguous rows.
  DecodeArgs resolved = args;
  const int64_t contiguous = static_cast<int64_t>(args.num_heads) * kHeadDim;
  if (resolved.q_row_stride == 0) resolved.q_row_stride = contiguous;
  if (resolved.out_row_stride == 0) resolved.out_row_stride = contiguous;
  const cudaError_t attribute_status =
      allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), static_cast<int>(Cfg::kSmemBytes));
  if (attribute_status != cudaSuccess) return attribute_status;
  const dim3 grid(plan.num_splits, args.num_kv_heads * plan.head_tiles, args.num_seqs);
  char* ws = static_cast<char*>(workspace.partials);
  // Launched with programmatic dependent launch: at batch 1 the launch latency is a large part of the
  // step, and this lets it (and the KV prefetch) overlap the previous kernel's tail.
  return launch_with_pdl(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, resolved, plan,
                         reinterpret_cast<T*>(ws + plan.partial_o_offset),
                         reinterpret_cast<float*>(ws + plan.partial_ml_offset),
                         workspace.counters);
}

}  // namespace tessera::kernels::cuda
