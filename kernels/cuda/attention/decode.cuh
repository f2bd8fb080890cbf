// kernels/cuda/attention/decode.cuh: paged decode attention (one query token per sequence), kernels
// then launcher.
//
// One CTA = (KV split, KV head [x group chunk], sequence). It reads each K and V row of its split
// once for the whole query group (up to 8 query heads), so GQA costs no extra KV traffic.
//   phase 1: scores s[g][t] = q_g · k_t for the split's tokens into shared memory (16-byte loads,
//            head_dim/8 lanes per token, several tokens in flight per thread);
//   phase 2: per-head max and exp2 in shared memory;
//   phase 3: o_g = sum_t p[g][t] v_t, reduced across lanes and warps.
// With more than one split, each CTA writes (o, m, l) partials and the last CTA of a (sequence, KV
// head) to finish merges them: the reduction costs no second launch, which matters at batch 1 where
// the whole step is a few microseconds. Its counter returns to 0 after every merge.
#pragma once

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

template <int kHeadDim>
struct DecodeConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLanesPerToken = kHeadDim / 8;
  static constexpr int kTokensPerWarp = 32 / kLanesPerToken;
  static constexpr int kMaxGroup = 8;    // query heads per CTA
  static constexpr int kMaxChunk = 512;  // tokens per split (shared score buffer)
  static constexpr int kUnroll = 4;      // token rows in flight per thread
};

// Where the split-KV partials live inside the caller's workspace.
struct DecodeSplitPlan {
  int num_splits = 1;
  int chunk = 512;          // visible tokens per split
  int group_chunks = 1;     // CTAs per KV head when the query group exceeds kMaxGroup
  size_t partial_o_offset = 0, partial_ml_offset = 0, counters_offset = 0, bytes = 0;
};

template <typename T, int kHeadDim, int kBlockSize>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim>::kThreads)
    decode_kernel(const __grid_constant__ DecodeArgs args, DecodeSplitPlan plan,
                  float* partial_o,    // [num_seqs, num_heads, num_splits, head_dim]
                  float* partial_ml,   // [num_seqs, num_heads, num_splits, 2]: max (log2 domain), sum
                  int* counters) {     // [num_seqs, num_kv_heads * group_chunks], 0 between calls
  using Cfg = DecodeConfig<kHeadDim>;
  constexpr int kL = Cfg::kLanesPerToken, kTPW = Cfg::kTokensPerWarp, kG = Cfg::kMaxGroup;
  constexpr int kStep = Cfg::kWarps * kTPW;  // tokens per CTA-wide step
  __shared__ float scores[kG][Cfg::kMaxChunk];
  __shared__ float reduce_buf[Cfg::kWarps][kG][kHeadDim];
  __shared__ float head_max[kG], head_sum[kG];
  __shared__ bool is_last;

  const int split = blockIdx.x, seq = blockIdx.z;
  const int kv_head = blockIdx.y / plan.group_chunks, group_chunk = blockIdx.y % plan.group_chunks;
  const int group = args.num_heads / args.num_kv_heads;
  const int head0 = kv_head * group + group_chunk * kG;
  const int heads = group - group_chunk * kG < kG ? group - group_chunk * kG : kG;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane_tok = lane / kL, lane_d = lane % kL;

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
  const int v_begin = split * plan.chunk;
  const int n = n_visible - v_begin < plan.chunk ? n_visible - v_begin : plan.chunk;
  const float scale_log2 = args.softmax_scale * 1.4426950408889634f;

  T* out = static_cast<T*>(args.out) + (static_cast<int64_t>(seq) * args.num_heads + head0) * kHeadDim;
  if (n_visible == 0) {  // empty context: output 0
    for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) out[idx] = from_float<T>(0.f);
    return;
  }

  float qf[kG][8];
  const T* q = static_cast<const T*>(args.q) + (static_cast<int64_t>(seq) * args.num_heads + head0) * kHeadDim;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g < heads) {
      Vec8<T> v;
      v.raw = *reinterpret_cast<const uint4*>(q + g * kHeadDim + lane_d * 8);
      vec8_to_float(v, qf[g]);
    }
  }

  const int32_t* table = args.block_tables + static_cast<int64_t>(seq) * args.max_blocks_per_seq;
  const int64_t token_stride = static_cast<int64_t>(args.num_kv_heads) * kHeadDim;
  const T* k_head = static_cast<const T*>(args.k_cache) + kv_head * kHeadDim + lane_d * 8;
  const T* v_head = static_cast<const T*>(args.v_cache) + kv_head * kHeadDim + lane_d * 8;
  auto row_offset = [&](int local) -> int64_t {
    const int vi = v_begin + local;
    const int token = vi < lead ? vi : start + (vi - lead);
    const int64_t block = table[token / kBlockSize];
    return (block * kBlockSize + token % kBlockSize) * token_stride;
  };

  // Phase 1: scores.
  for (int base = 0; base < n; base += kStep * Cfg::kUnroll) {
    uint4 rows[Cfg::kUnroll];
#pragma unroll
    for (int u = 0; u < Cfg::kUnroll; ++u) {
      const int local = base + u * kStep + warp * kTPW + lane_tok;
      rows[u] = local < n ? __ldg(reinterpret_cast<const uint4*>(k_head + row_offset(local))) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < Cfg::kUnroll; ++u) {
      const int local = base + u * kStep + warp * kTPW + lane_tok;
      Vec8<T> kv;
      kv.raw = rows[u];
      float kf[8];
      vec8_to_float(kv, kf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g < heads) {
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d = fmaf(qf[g][e], kf[e], d);
#pragma unroll
          for (int off = kL / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
          if (lane_d == 0 && local < n) scores[g][local] = d * scale_log2;
        }
      }
    }
  }
  __syncthreads();

  // Phase 2: per-head max, exp2, sum.
  for (int g = warp; g < heads; g += Cfg::kWarps) {
    float mx = -INFINITY;
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, scores[g][i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float p = exp2f(scores[g][i] - mx);
      scores[g][i] = p;
      sum += p;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      head_max[g] = mx;
      head_sum[g] = sum;
    }
  }
  __syncthreads();

  // Phase 3: o_g = sum_t p[g][t] v_t.
  float acc[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  for (int base = 0; base < n; base += kStep * Cfg::kUnroll) {
    uint4 rows[Cfg::kUnroll];
#pragma unroll
    for (int u = 0; u < Cfg::kUnroll; ++u) {
      const int local = base + u * kStep + warp * kTPW + lane_tok;
      rows[u] = local < n ? __ldg(reinterpret_cast<const uint4*>(v_head + row_offset(local))) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < Cfg::kUnroll; ++u) {
      const int local = base + u * kStep + warp * kTPW + lane_tok;
      if (local < n) {
        Vec8<T> vv;
        vv.raw = rows[u];
        float vf[8];
        vec8_to_float(vv, vf);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          if (g < heads) {
            const float p = scores[g][local];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
#pragma unroll
      for (int off = kL; off < 32; off <<= 1) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], off);
    }
  if (lane_tok == 0) {
#pragma unroll
    for (int g = 0; g < kG; ++g)
      if (g < heads)
#pragma unroll
        for (int e = 0; e < 8; ++e) reduce_buf[warp][g][lane_d * 8 + e] = acc[g][e];
  }
  __syncthreads();

  if (splits_used == 1) {
    for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) {
      const int g = idx / kHeadDim, d = idx % kHeadDim;
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) o += reduce_buf[w][g][d];
      out[idx] = from_float<T>(o / head_sum[g]);
    }
    return;
  }

  const int64_t part_row = static_cast<int64_t>(seq) * args.num_heads + head0;  // (seq, head0) row
  for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) {
    const int g = idx / kHeadDim, d = idx % kHeadDim;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) o += reduce_buf[w][g][d];
    partial_o[((part_row + g) * plan.num_splits + split) * kHeadDim + d] = o;
  }
  if (threadIdx.x < heads) {
    partial_ml[((part_row + threadIdx.x) * plan.num_splits + split) * 2] = head_max[threadIdx.x];
    partial_ml[((part_row + threadIdx.x) * plan.num_splits + split) * 2 + 1] = head_sum[threadIdx.x];
  }
  __threadfence();  // partials visible device-wide before this CTA is counted
  __syncthreads();
  int* counter = counters + static_cast<int64_t>(seq) * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == splits_used - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // Merge: out_g = sum_s o_s 2^(m_s - M) / sum_s l_s 2^(m_s - M).
  for (int idx = threadIdx.x; idx < heads * kHeadDim; idx += Cfg::kThreads) {
    const int g = idx / kHeadDim, d = idx % kHeadDim;
    const float* ml = partial_ml + (part_row + g) * plan.num_splits * 2;
    const float* po = partial_o + (part_row + g) * plan.num_splits * kHeadDim + d;
    float m_all = -INFINITY;
    for (int s = 0; s < splits_used; ++s) m_all = fmaxf(m_all, __ldcg(ml + 2 * s));
    float num = 0.f, den = 0.f;
    for (int s = 0; s < splits_used; ++s) {
      const float w = exp2f(__ldcg(ml + 2 * s) - m_all);
      den = fmaf(__ldcg(ml + 2 * s + 1), w, den);
      num = fmaf(__ldcg(po + static_cast<int64_t>(s) * kHeadDim), w, num);
    }
    out[idx] = from_float<T>(num / den);
  }
  if (threadIdx.x == 0) *counter = 0;
}

inline DecodeSplitPlan plan_decode_split(const DecodeArgs& args, int num_sms) {
  constexpr int kMaxGroup = 8;
  DecodeSplitPlan plan;
  const int group = args.num_heads / args.num_kv_heads;
  plan.group_chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t base_ctas = static_cast<int64_t>(args.num_seqs) * args.num_kv_heads * plan.group_chunks;
  const int max_ctx = args.max_context_len > 1 ? args.max_context_len : 1;
  // Smaller splits until the grid covers the GPU about twice: small batches need the split for
  // memory parallelism, large ones only for the shared score buffer's size.
  plan.chunk = 512;
  while (plan.chunk > 64 && base_ctas * ((max_ctx + plan.chunk - 1) / plan.chunk) < 2LL * num_sms) plan.chunk /= 2;
  plan.num_splits = (max_ctx + plan.chunk - 1) / plan.chunk;
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
  decode_kernel<T, kHeadDim, kBlockSize><<<grid, Cfg::kThreads, 0, stream>>>(
      args, plan, reinterpret_cast<float*>(ws + plan.partial_o_offset),
      reinterpret_cast<float*>(ws + plan.partial_ml_offset), reinterpret_cast<int*>(ws + plan.counters_offset));
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
