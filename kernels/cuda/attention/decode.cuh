// kernels/cuda/attention/decode.cuh: paged decode attention (one query token per sequence), kernels
// then launcher.
//
// One CTA = (KV split, KV head [x group chunk], sequence). It reads each K and V row of its split
// once for the whole query group (up to 4 query heads), so GQA costs no extra KV traffic.
//   - head_dim/8 lanes share one token (16 bytes each); a warp covers 32*8/head_dim tokens per step;
//   - the split's physical row numbers are resolved from the block table once, into shared memory,
//     so no K/V load waits on a table load;
//   - each thread keeps two rounds of kU tokens' K and V loads in flight (memory parallelism); kU = 2
//     at 128 registers (4 CTAs/SM) by default, kU = 4 at 168 (3 CTAs/SM) on request;
//   - each lane group keeps an online softmax (running max, sum, accumulator) per query head; lane
//     groups and warps are merged at the end.
// With more than one split, each CTA writes (o, m, l) partials and the last CTA of a (sequence, KV
// head) to finish merges them: the reduction costs no second launch, which matters at batch 1 where
// the whole step is a few microseconds. Its counter returns to 0 after every merge.
#pragma once

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/common/device.cuh"

#include <cstdlib>

namespace tessera::kernels::cuda {

template <int kHeadDim>
struct DecodeConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLanesPerToken = kHeadDim / 8;
  static constexpr int kTokensPerWarp = 32 / kLanesPerToken;
  static constexpr int kMaxGroup = 4;     // query heads per CTA (GQA 32/8 and Llama-3/Mistral groups)
  static constexpr int kMaxChunk = 1024;  // tokens per split (row-number table in shared memory)
  static constexpr int kMaxSplits = 512;  // partials merged by one CTA
};

// Where the split-KV partials live inside the caller's workspace.
struct DecodeSplitPlan {
  int num_splits = 1;
  int unroll = 4;           // tokens per lane group per round: 4 (3 CTAs/SM) or 2 (4 CTAs/SM, small batch)
  int chunk = 512;          // visible tokens per split
  int group_chunks = 1;     // CTAs per KV head when the query group exceeds kMaxGroup
  size_t partial_o_offset = 0, partial_ml_offset = 0, counters_offset = 0, bytes = 0;
};

__device__ __forceinline__ float decode_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One level of a reduce-scatter across lanes: lanes that differ in bit kHalf swap halves of v[0, 2 kHalf)
// and add, keeping the half their bit selects in v[0, kHalf).
template <int kHalf, int kBit, int kN>
__device__ __forceinline__ void decode_halve(float (&v)[kN], int lane_d) {
  const bool upper = (lane_d & kBit) != 0;
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const float send = upper ? v[k] : v[k + kHalf];
    const float keep = upper ? v[k + kHalf] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, kBit);
  }
}

template <typename T, int kHeadDim, int kBlockSize, int kU>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim>::kThreads, kU == 2 ? 4 : 3)
    decode_kernel(const __grid_constant__ DecodeArgs args, DecodeSplitPlan plan,
                  float* partial_o,    // [num_seqs, num_heads, num_splits, head_dim]
                  float* partial_ml,   // [num_seqs, num_heads, num_splits, 2]: max (log2 domain), sum
                  int* counters) {     // [num_seqs, num_kv_heads * group_chunks], 0 between calls
  using Cfg = DecodeConfig<kHeadDim>;
  constexpr int kL = Cfg::kLanesPerToken, kTPW = Cfg::kTokensPerWarp, kG = Cfg::kMaxGroup;
  constexpr int kStep = Cfg::kWarps * kTPW;  // tokens per CTA-wide step
  __shared__ int32_t rows[Cfg::kMaxChunk];   // physical row (block * block_size + slot) per local token
  __shared__ float warp_o[Cfg::kWarps][kG][kHeadDim];
  __shared__ float warp_ml[Cfg::kWarps][kG][2];
  __shared__ bool is_last;

  // Programmatic dependent launch: the next kernel may begin launching; nothing here is read before
  // the previous kernel in the stream has completed (no-ops without PDL).
  pdl_launch_dependents();
  pdl_wait_previous();
  const int split = blockIdx.x, seq = blockIdx.z;
  const int kv_head = blockIdx.y / plan.group_chunks, group_chunk = blockIdx.y % plan.group_chunks;
  const int group = args.num_heads / args.num_kv_heads;
  const int head0 = kv_head * group + group_chunk * kG;
  const int heads = group - group_chunk * kG < kG ? group - group_chunk * kG : kG;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_tok = lane / kL, lane_d = lane % kL;

  // Issued together before any is used (one memory round trip instead of three): q, the context
  // length and, without a mask (a split's tokens are then v_begin + i whatever the context), the
  // split's block-table entries. Entries past the context are read (the table row is
  // max_blocks_per_seq wide) but never dereferenced.
  const T* q = static_cast<const T*>(args.q) + (static_cast<int64_t>(seq) * args.num_heads + head0) * kHeadDim;
  uint4 q_raw[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g)
    q_raw[g] = g < heads ? *reinterpret_cast<const uint4*>(q + g * kHeadDim + lane_d * 8) : make_uint4(0, 0, 0, 0);
  const int32_t* table = args.block_tables + static_cast<int64_t>(seq) * args.max_blocks_per_seq;
  constexpr int kRowsPerThread = Cfg::kMaxChunk / Cfg::kThreads;
  const bool no_mask = args.masks == nullptr;
  const int v_begin = split * plan.chunk;
  int32_t blk[kRowsPerThread];
  if (no_mask) {
    const int table_tokens = args.max_blocks_per_seq * kBlockSize;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = threadIdx.x + r * Cfg::kThreads;
      blk[r] = i < plan.chunk && v_begin + i < table_tokens ? __ldg(table + (v_begin + i) / kBlockSize) : 0;
    }
  }

  // The visible keys of the query at position ctx - 1: [0, lead) and [start, ctx).
  const int ctx = args.context_lens[seq];
  int lead = 0, start = 0;
  if (args.masks != nullptr && ctx > 0) {
    const MaskParams mask = args.masks[seq];
    lead = mask.leading_keys() < ctx ? mask.leading_keys() : ctx;
    start = mask.lowest_key(ctx - 1);
    if (start < lead) start = lead;
  }
  const int n_visible = lead + (ctx - start);
  const int splits_used = n_visible > 0 ? (n_visible + plan.chunk - 1) / plan.chunk : 1;
  if (split >= splits_used) return;
  const int n = n_visible - v_begin < plan.chunk ? n_visible - v_begin : plan.chunk;
  const float scale_log2 = args.softmax_scale * 1.4426950408889634f;

  T* out = static_cast<T*>(args.out) + (static_cast<int64_t>(seq) * args.num_heads + head0) * kHeadDim;
  if (n_visible == 0) {  // empty context: output 0
    for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) out[idx] = from_float<T>(0.f);
    return;
  }

  if (no_mask) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = threadIdx.x + r * Cfg::kThreads;
      if (i < n) rows[i] = blk[r] * kBlockSize + (v_begin + i) % kBlockSize;
    }
  } else {
    for (int i = threadIdx.x; i < n; i += Cfg::kThreads) {
      const int vi = v_begin + i;
      const int token = vi < lead ? vi : start + (vi - lead);
      rows[i] = table[token / kBlockSize] * kBlockSize + token % kBlockSize;
    }
  }

  // Query heads past `heads` are zero: their scores are finite and never written out.
  float qf[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    Vec8<T> v;
    v.raw = q_raw[g];
    vec8_to_float(v, qf[g]);
#pragma unroll
    for (int e = 0; e < 8; ++e) qf[g][e] *= scale_log2;  // scores come out in the log2 domain
  }
  __syncthreads();

  const int64_t token_stride = static_cast<int64_t>(args.num_kv_heads) * kHeadDim;
  const T* k_head = static_cast<const T*>(args.k_cache) + kv_head * kHeadDim + lane_d * 8;
  const T* v_head = static_cast<const T*>(args.v_cache) + kv_head * kHeadDim + lane_d * 8;

  float m_run[kG], l_run[kG], acc[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m_run[g] = -INFINITY;
    l_run[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  // Round r covers local tokens [r * kStep * kU, (r + 1) * kStep * kU). The next round's K and V
  // loads are issued before this round's arithmetic, so memory and math overlap within a thread.
  uint4 k_cur[kU], v_cur[kU], k_next[kU], v_next[kU];
  auto issue_round = [&](int base, uint4 (&k_rows)[kU], uint4 (&v_rows)[kU]) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int local = base + u * kStep + warp * kTPW + lane_tok;
      if (local < n) {
        const int64_t off = static_cast<int64_t>(rows[local]) * token_stride;
        k_rows[u] = __ldg(reinterpret_cast<const uint4*>(k_head + off));
        v_rows[u] = __ldg(reinterpret_cast<const uint4*>(v_head + off));
      } else {
        k_rows[u] = v_rows[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  // L2 prefetch of a later round: it costs no registers, so far more bytes are in flight than the
  // register buffers alone would allow.
  auto prefetch_round = [&](int base) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int local = base + u * kStep + warp * kTPW + lane_tok;
      if (local < n && lane_d == 0) {
        const int64_t off = static_cast<int64_t>(rows[local]) * token_stride;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(k_head + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(v_head + off));
        if constexpr (kHeadDim == 128) {  // a 256-byte row spans two 128-byte lines
          asm volatile("prefetch.global.L2 [%0];" ::"l"(k_head + off + 64));
          asm volatile("prefetch.global.L2 [%0];" ::"l"(v_head + off + 64));
        }
      }
    }
  };
  constexpr int kRound = kStep * kU;
  issue_round(0, k_cur, v_cur);
  prefetch_round(kRound);
  prefetch_round(2 * kRound);
  for (int base = 0; base < n; base += kRound) {
    if (base + kRound < n) issue_round(base + kRound, k_next, v_next);
    if (base + 3 * kRound < n) prefetch_round(base + 3 * kRound);
    // Scores of this round's tokens (log2 domain), reduced across the lane group.
    float sc[kU][kG];
    if constexpr (kL == 16 && kG == 4 && (kU == 4 || kU == 2)) {
      // head_dim 128: the 16 (token, head) partial dots of a lane are reduced across the 16-lane group
      // by halving exchanges (8 + 4 + 2 + 1 = 15 shuffles instead of 64), leaving lane d with the full
      // score of (u, g) = (d / 4, d % 4). The lane then does the softmax step of that one score (two
      // exponentials instead of twenty) and the 16 weights and 4 rescales are gathered back.
      float v[kU * kG];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        Vec8<T> kv;
        kv.raw = k_cur[u];
        float kf[8];
        vec8_to_float(kv, kf);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d = fmaf(qf[g][e], kf[e], d);
          v[u * kG + g] = d;
        }
      }
      // 16 values: lane d ends with j = d. 8 values (kU = 2): three halvings on lane bits 8, 4, 2 and a
      // full sum over bit 1; lane d ends with j = d / 2.
      constexpr int kShift = kU == 4 ? 0 : 1;
      if constexpr (kU == 4) {
        decode_halve<8, 8>(v, lane_d);
        decode_halve<4, 4>(v, lane_d);
        decode_halve<2, 2>(v, lane_d);
        decode_halve<1, 1>(v, lane_d);
      } else {
        decode_halve<4, 8>(v, lane_d);
        decode_halve<2, 4>(v, lane_d);
        decode_halve<1, 2>(v, lane_d);
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
      }
      const int my_j = lane_d >> kShift;
      const int my_u = my_j >> 2, my_g = my_j & 3;
      const float s = base + my_u * kStep + warp * kTPW + lane_tok < n ? v[0] : -INFINITY;
      float mx = s;
#pragma unroll
      for (int off = kG << kShift; off < 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      float m_old = m_run[0];
#pragma unroll
      for (int g = 1; g < kG; ++g) m_old = my_g == g ? m_run[g] : m_old;
      const float m_new = fmaxf(m_old, mx);
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      const float p = decode_exp2(s - m_ref);
      const float rs = decode_exp2(m_old - m_ref);
      const int src0 = lane & 16;  // first lane of this lane group
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float rescale = __shfl_sync(0xffffffffu, rs, src0 + (g << kShift));
        m_run[g] = __shfl_sync(0xffffffffu, m_new, src0 + (g << kShift));
        l_run[g] *= rescale;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] *= rescale;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          sc[u][g] = __shfl_sync(0xffffffffu, p, src0 + ((u * kG + g) << kShift));
          l_run[g] += sc[u][g];
        }
    } else {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool valid = base + u * kStep + warp * kTPW + lane_tok < n;
      Vec8<T> kv;
      kv.raw = k_cur[u];
      float kf[8];
      vec8_to_float(kv, kf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float d = 0.f;
        if (g < heads) {
#pragma unroll
          for (int e = 0; e < 8; ++e) d = fmaf(qf[g][e], kf[e], d);
#pragma unroll
          for (int off = kL / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        }
        sc[u][g] = valid ? d : -INFINITY;
      }
    }
    // One rescale per round: new max over the round, then p = 2^(s - max).
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < heads) {
        float mx = m_run[g];
#pragma unroll
        for (int u = 0; u < kU; ++u) mx = fmaxf(mx, sc[u][g]);
        const float m_ref = mx == -INFINITY ? 0.f : mx;
        const float rescale = decode_exp2(m_run[g] - m_ref);
        m_run[g] = mx;
        l_run[g] *= rescale;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] *= rescale;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const float p = decode_exp2(sc[u][g] - m_ref);
          sc[u][g] = p;
          l_run[g] += p;
        }
      }
    }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      Vec8<T> vv;
      vv.raw = v_cur[u];
      float vf[8];
      vec8_to_float(vv, vf);
#pragma unroll
      for (int g = 0; g < kG; ++g)
        if (g < heads)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(sc[u][g], vf[e], acc[g][e]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      k_cur[u] = k_next[u];
      v_cur[u] = v_next[u];
    }
  }

  // Merge the lane groups of this warp (same lane_d, different tokens), then the warps.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int off = kL; off < 32; off <<= 1) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m_run[g], off);
      const float l_other = __shfl_xor_sync(0xffffffffu, l_run[g], off);
      const float m_new = fmaxf(m_run[g], m_other);
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      const float a = decode_exp2(m_run[g] - m_ref), b = decode_exp2(m_other - m_ref);
      l_run[g] = l_run[g] * a + l_other * b;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] = acc[g][e] * a + __shfl_xor_sync(0xffffffffu, acc[g][e], off) * b;
      m_run[g] = m_new;
    }
  }
  if (lane_tok == 0) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < heads) {
#pragma unroll
        for (int e = 0; e < 8; ++e) warp_o[warp][g][lane_d * 8 + e] = acc[g][e];
        if (lane_d == 0) {
          warp_ml[warp][g][0] = m_run[g];
          warp_ml[warp][g][1] = l_run[g];
        }
      }
    }
  }
  __syncthreads();

  // This split's (o, m, l) per head, o unnormalised.
  auto split_result = [&](int g, int d, float& o, float& m, float& l) {
    m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) m = fmaxf(m, warp_ml[w][g][0]);
    o = 0.f;
    l = 0.f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float s = warp_ml[w][g][0] == -INFINITY ? 0.f : decode_exp2(warp_ml[w][g][0] - m);
      o += warp_o[w][g][d] * s;
      l += warp_ml[w][g][1] * s;
    }
  };

  if (splits_used == 1) {
    for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) {
      float o, m, l;
      split_result(idx / kHeadDim, idx % kHeadDim, o, m, l);
      out[idx] = from_float<T>(o / l);
    }
    return;
  }

  const int64_t part_row = static_cast<int64_t>(seq) * args.num_heads + head0;  // (seq, head0)
  for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) {
    const int g = idx / kHeadDim, d = idx % kHeadDim;
    float o, m, l;
    split_result(g, d, o, m, l);
    partial_o[((part_row + g) * plan.num_splits + split) * kHeadDim + d] = o;
    if (d == 0) {
      partial_ml[((part_row + g) * plan.num_splits + split) * 2] = m;
      partial_ml[((part_row + g) * plan.num_splits + split) * 2 + 1] = l;
    }
  }
  __threadfence();  // partials visible device-wide before this CTA is counted
  __syncthreads();
  int* counter = counters + static_cast<int64_t>(seq) * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == splits_used - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // Merge: out_g = sum_s o_s 2^(m_s - M) / sum_s l_s 2^(m_s - M), one pass with a running max. Each
  // thread owns 4 outputs and issues 16 splits' (m, l) and o loads before using any.
  constexpr int kQuads = kHeadDim / 4, kBatch = 16;
  for (int idx = threadIdx.x; idx < heads * kQuads; idx += Cfg::kThreads) {
    const int g = idx / kQuads, d4 = idx % kQuads;
    const float2* ml = reinterpret_cast<const float2*>(partial_ml + (part_row + g) * plan.num_splits * 2);
    const float4* po = reinterpret_cast<const float4*>(partial_o + (part_row + g) * plan.num_splits * kHeadDim) + d4;
    float m_all = -INFINITY, den = 0.f;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < splits_used; s0 += kBatch) {
      float2 mls[kBatch];
      float4 ps[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        if (s0 + k < splits_used) {
          mls[k] = __ldcg(ml + s0 + k);
          ps[k] = __ldcg(po + static_cast<int64_t>(s0 + k) * kQuads);
        } else {
          mls[k] = make_float2(-INFINITY, 0.f);
          ps[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const float m_new = fmaxf(m_all, mls[k].x);
        const float m_ref = m_new == -INFINITY ? 0.f : m_new;
        const float a = decode_exp2(m_all - m_ref), b = decode_exp2(mls[k].x - m_ref);
        den = fmaf(den, a, mls[k].y * b);
        sum.x = fmaf(sum.x, a, ps[k].x * b);
        sum.y = fmaf(sum.y, a, ps[k].y * b);
        sum.z = fmaf(sum.z, a, ps[k].z * b);
        sum.w = fmaf(sum.w, a, ps[k].w * b);
        m_all = m_new;
      }
    }
    const float inv = 1.f / den;
    T* o = out + g * kHeadDim + d4 * 4;
    o[0] = from_float<T>(sum.x * inv);
    o[1] = from_float<T>(sum.y * inv);
    o[2] = from_float<T>(sum.z * inv);
    o[3] = from_float<T>(sum.w * inv);
  }
  if (threadIdx.x == 0) *counter = 0;
}

inline DecodeSplitPlan plan_decode_split(const DecodeArgs& args, int num_sms) {
  constexpr int kMaxGroup = DecodeConfig<128>::kMaxGroup, kMaxChunk = DecodeConfig<128>::kMaxChunk;
  constexpr int kMaxSplits = DecodeConfig<128>::kMaxSplits;
  DecodeSplitPlan plan;
  const int group = args.num_heads / args.num_kv_heads;
  plan.group_chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t base_ctas = static_cast<int64_t>(args.num_seqs) * args.num_kv_heads * plan.group_chunks;
  const int max_ctx = args.max_context_len > 1 ? args.max_context_len : 1;
  // Split length from a small cost model in token-equivalents: `resident` CTAs fit on the GPU (4 or 3
  // per SM by the variant's registers), each CTA costs its tokens plus a fixed ~256 (prologue, partial write,
  // merge share), and the grid runs in waves of `resident` CTAs. Chunks are multiples of 32 so that
  // the split count can make the last wave nearly full (512 CTAs at batch 1 would take two waves of
  // 396 where 376 longer ones take one). TESSERA_DECODE_CHUNK (benchmarking only) forces a chunk.
  auto splits_of = [&](int chunk) { return (max_ctx + chunk - 1) / chunk; };
  // The 2-token-round variant capped at 128 registers (4 CTAs per SM) measured faster than the
  // 4-token one at 168 registers (3 per SM) on every benchmark row but batch 1 context 4k (16.1 vs
  // 15.9 us): more warps per SM hide the per-warp dependency chains. TESSERA_DECODE_UNROLL=4
  // (benchmarking only) selects the other variant.
  static const int forced_unroll = [] {
    const char* e = std::getenv("TESSERA_DECODE_UNROLL");
    const int u = e != nullptr ? std::atoi(e) : 0;
    return u == 2 || u == 4 ? u : 0;
  }();
  plan.unroll = forced_unroll != 0 ? forced_unroll : 2;
  const int64_t resident = (plan.unroll == 2 ? 4LL : 3LL) * num_sms;
  static const int forced_chunk = [] {
    const char* e = std::getenv("TESSERA_DECODE_CHUNK");
    const int c = e != nullptr ? std::atoi(e) : 0;
    return c >= 32 && c <= kMaxChunk ? c : 0;
  }();
  double best_cost = 0;
  for (int chunk = 64; chunk <= kMaxChunk; chunk += 32) {
    if (splits_of(chunk) > kMaxSplits) continue;
    const int64_t ctas = base_ctas * splits_of(chunk);
    const double cost = static_cast<double>((ctas + resident - 1) / resident) * (chunk + 256.0);
    if (best_cost == 0 || cost < best_cost) {
      best_cost = cost;
      plan.chunk = chunk;
    }
  }
  if (forced_chunk > 0 && splits_of(forced_chunk) <= kMaxSplits) plan.chunk = forced_chunk;
  plan.num_splits = splits_of(plan.chunk);
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(args.num_seqs) * args.num_heads * plan.num_splits;
    plan.partial_o_offset = 0;
    plan.partial_ml_offset = rows * args.head_dim * sizeof(float);
    plan.counters_offset = plan.partial_ml_offset + rows * 2 * sizeof(float);
    plan.bytes = plan.counters_offset + static_cast<size_t>(base_ctas) * sizeof(int);
  }
  return plan;
}

template <typename T, int kHeadDim, int kBlockSize>
cudaError_t launch_decode(const DecodeArgs& args, const DecodeSplitPlan& plan, void* workspace,
                          cudaStream_t stream) {
  using Cfg = DecodeConfig<kHeadDim>;
  const dim3 grid(plan.num_splits, args.num_kv_heads * plan.group_chunks, args.num_seqs);
  char* ws = static_cast<char*>(workspace);
  // Launched with programmatic dependent launch: at batch 1 the launch latency is a large part of the
  // step, and this lets it overlap the previous kernel's tail.
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(Cfg::kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  auto kernel = plan.unroll == 2 ? decode_kernel<T, kHeadDim, kBlockSize, 2> : decode_kernel<T, kHeadDim, kBlockSize, 4>;
  return cudaLaunchKernelEx(&config, kernel, args, plan,
                            reinterpret_cast<float*>(ws + plan.partial_o_offset),
                            reinterpret_cast<float*>(ws + plan.partial_ml_offset),
                            reinterpret_cast<int*>(ws + plan.counters_offset));
}

}  // namespace tessera::kernels::cuda
