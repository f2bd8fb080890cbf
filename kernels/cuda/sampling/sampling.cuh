// kernels/cuda/sampling/sampling.cuh: the sampling kernel (one CTA per row), its building blocks, and
// its launcher.
//
// Shape of the work: a row is 32k-256k logits, read many times (each selection level is one pass), so
// one CTA owns a row and every pass after the first finds it in L2 (a 152k bf16 row is 300 KB). Nothing
// is sorted. Top-k and the logprobs' top-n are a radix select of the k-th largest value by count; top-p
// is the same radix select by mass; min-p is one threshold; the draw is a prefix sum in id order.
//  - Values are ranked by an order-preserving 32-bit key of the fp32 value; a select takes four 8-bit
//    digits from the top, each one histogram pass over the candidates that match the digits so far.
//  - Masses are integers (weights in 2^-40 fixed point, u64): sums are then exact, so they do not
//    depend on the order atomics land in (the result is deterministic) and match the CPU's fp64 sums
//    to ~1e-10 of the total.
//  - Ties keep the CPU's order (lower id first): where a cut falls inside a run of equal values (common
//    with bf16 logits), the n-th tie in id order is found by the same ordered prefix sum as the draw.
//  - Rows with penalties get an fp32 copy in the workspace with the penalties scattered into it; other
//    rows are read straight from the logits, with the temperature applied on the fly.
#pragma once

#include <math_constants.h>

#include <climits>

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/common/kernel_attributes.cuh"
#include "kernels/cuda/sampling/sampling.h"

namespace tessera::kernels::cuda {
namespace sampling_detail {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;                // one 8-bit digit of the key
constexpr int kChunk = 256;               // elements per warp chunk of the ordered passes: 32 lanes x 8
constexpr int kMaxChunks = kMaxSamplingVocab / kChunk;
static_assert(kMaxChunks <= 2 * kThreads, "the chunk scan gives each thread at most two chunks");
// 2^40: a weight exp(x - max) <= 1 keeps 40 fractional bits (fp32 weights >= 2^-17 exactly), and
// vocab (<= 2^18) of them sum below 2^58.
constexpr float kFixedScale = 0x1p40f;
constexpr unsigned kFullMask = 0xffffffffu;

using u64 = unsigned long long;

struct Smem {
  // [bin][lane]: a copy per lane, so lanes of a warp never add to the same word (logits cluster in a
  // few exponent bins, and same-word shared atomics within a warp serialize).
  union {
    uint32_t count[kBins * 32];
    u64 mass[kBins * 32];
  } hist;
  u64 bin_total[kBins];
  u64 chunk[kMaxChunks];
  u64 warp_u64[kWarps];
  double warp_f64[kWarps];
  float warp_f32[kWarps];
  int warp_i32[kWarps];
  // Written by one thread, read by all after a barrier.
  u64 sel_above, sel_bin_weight, sel_target;
  int sel_bin;
  int found_chunk;
  u64 found_excl;
  int found_id;
  float min_p_threshold;
  int lp_count;
  float lp_value[kMaxTopLogprobs];
  int lp_id[kMaxTopLogprobs];
};

// ---- values and keys -------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ float load_logit(const T* p) {
  return DTypeTraits<T>::to_float(__ldg(p));
}
template <>
__device__ __forceinline__ float load_logit<float>(const float* p) {
  return __ldg(p);
}

// Monotone map of a float to uint32 (larger value, larger key). -0 and +0 get one key, since the CPU
// compares values and they are equal.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v == 0.f ? 0.f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ u64 to_fixed(float w) {
  return w > 0.f ? __float2ull_rn(w * kFixedScale) : 0ull;  // NaN and 0 weigh nothing
}

// exp(v - m) with the rounding of v - m compensated (TwoSum): the CPU's top-p takes exp(double(v) - m)
// in fp64, and an fp32 difference of ~20 would be off by ~1e-6 relative.
__device__ __forceinline__ float exp_below_max(float v, float m) {
  if (v == -CUDART_INF_F) return 0.f;
  const float s = __fsub_rn(v, m);
  const float bp = __fsub_rn(s, v);
  const float ap = __fsub_rn(s, bp);
  const float e = __fadd_rn(__fsub_rn(v, ap), __fsub_rn(-m, bp));
  const float ex = expf(s);
  return fmaf(ex, e, ex);
}

// Keeps key > `key`, and key == `key` up to id `last_tie`. The default keeps everything.
struct Cut {
  uint32_t key = 0;
  int32_t last_tie = INT_MAX;
  __device__ __forceinline__ bool keeps(uint32_t k, int id) const { return k > key || (k == key && id <= last_tie); }
};
// Keeps exactly the keys >= lo.
__device__ __forceinline__ Cut cut_at_or_above(uint32_t lo) {
  return lo == 0 ? Cut{0u, INT_MAX} : Cut{lo - 1, -1};
}

// The row as the passes read it: raw logits, or the penalized fp32 copy; value = after temperature.
template <typename T>
struct RowView {
  const T* raw;
  const float* pen;  // null without penalties; written by this CTA, so plain (coherent) loads
  float inv_temp;
  bool scaled;
  __device__ __forceinline__ float raw_at(int i) const { return load_logit(raw + i); }
  __device__ __forceinline__ float base_at(int i) const { return pen ? pen[i] : raw_at(i); }
  // The CPU multiplies by 1 / temperature (both rounded), not divides.
  __device__ __forceinline__ float value_at(int i) const {
    const float x = base_at(i);
    return scaled ? __fmul_rn(x, inv_temp) : x;
  }
};

// ---- warp and block reductions ---------------------------------------------------------------------

template <typename W>
__device__ __forceinline__ W warp_inclusive_scan(W v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const W o = __shfl_up_sync(kFullMask, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

template <typename W>
__device__ __forceinline__ W warp_total(W v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(kFullMask, v, d);
  return v;
}

struct ArgMax {
  float value;
  int id;
};
// Larger value first, lower id on ties: the CPU's argmax and its top-n order.
__device__ __forceinline__ bool precedes(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}
__device__ __forceinline__ void consider(ArgMax& a, float v, int id) {
  if (precedes(v, id, a.value, a.id)) a = {v, id};
}

// Every thread gets the same result: the warps' winners are combined in one fixed order.
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, Smem& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, a.value, d);
    const int id = __shfl_xor_sync(kFullMask, a.id, d);
    consider(a, v, id);
  }
  __syncthreads();
  if (lane == 0) {
    s.warp_f32[warp] = a.value;
    s.warp_i32[warp] = a.id;
  }
  __syncthreads();
  ArgMax r{-CUDART_INF_F, INT_MAX};
  for (int w = 0; w < kWarps; ++w) consider(r, s.warp_f32[w], s.warp_i32[w]);
  __syncthreads();
  return r;
}

__device__ __forceinline__ double block_sum_f64(double v, Smem& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_total(v);
  __syncthreads();
  if (lane == 0) s.warp_f64[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < kWarps; ++w) r += s.warp_f64[w];
  __syncthreads();
  return r;
}

__device__ __forceinline__ u64 block_exclusive_scan(u64 v, Smem& s, u64& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const u64 incl = warp_inclusive_scan(v);
  if (lane == 31) s.warp_u64[warp] = incl;
  __syncthreads();
  u64 before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    const u64 x = s.warp_u64[w];
    before += w < warp ? x : 0ull;
    all += x;
  }
  __syncthreads();
  total = all;
  return before + incl - v;
}

// ---- radix select ----------------------------------------------------------------------------------

template <typename W>
__device__ __forceinline__ W* hist_of(Smem& s);
template <>
__device__ __forceinline__ uint32_t* hist_of<uint32_t>(Smem& s) {
  return s.hist.count;
}
template <>
__device__ __forceinline__ u64* hist_of<u64>(Smem& s) {
  return s.hist.mass;
}

template <typename W>
struct Selection {
  uint32_t key;    // the key reached; with whole_range, the lowest key of the selected range
  bool whole_range;  // exactly the candidates with key >= `key` are selected
  W need;          // otherwise: weight still needed from the candidates whose key equals `key`
  W tie_weight;    // ... of their total weight
};

// Descending from the largest key, finds where the candidates' cumulative weight first reaches the
// target (target_of(total weight), in [1, total]). cand(i, v, key) gives element i's value and key and
// says whether it is a candidate; weight(v) its weight (count: 1; mass: fixed-point exp).
template <typename W, typename Cand, typename Weight, typename TargetOf>
__device__ Selection<W> radix_select(int n, Cand cand, Weight weight, TargetOf target_of, Smem& s) {
  W* hist = hist_of<W>(s);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0;
  W target = 0;
  for (int level = 0; level < 4; ++level) {
    const int shift = 24 - 8 * level;
    const uint32_t high = level == 0 ? 0u : ~((1u << (shift + 8)) - 1u);  // the digits chosen so far
    constexpr int kVecs = kBins * 32 * static_cast<int>(sizeof(W)) / 16;
    for (int j = tid; j < kVecs; j += kThreads) reinterpret_cast<uint4*>(hist)[j] = make_uint4(0, 0, 0, 0);
    __syncthreads();
#pragma unroll 4
    for (int i = tid; i < n; i += kThreads) {
      float v;
      uint32_t key;
      if (!cand(i, v, key) || (key & high) != prefix) continue;
      const W w = weight(v);
      if (w != 0) atomicAdd(&hist[((key >> shift) & 255u) * 32 + lane], w);
    }
    __syncthreads();
    if (tid < kBins) {
      W sum = 0;
      for (int l = 0; l < 32; ++l) sum += hist[tid * 32 + ((l + tid) & 31)];  // rotated: no bank conflicts
      s.bin_total[tid] = sum;
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 255 - 8l .. 248 - 8l, largest first.
      W mine[8];
      W lane_sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mine[j] = static_cast<W>(s.bin_total[kBins - 1 - 8 * lane - j]);
        lane_sum += mine[j];
      }
      const W incl = warp_inclusive_scan(lane_sum);
      if (level == 0) target = target_of(static_cast<W>(__shfl_sync(kFullMask, incl, 31)));
      W above = incl - lane_sum;
      int found = -1;
      W found_above = 0, found_weight = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (found < 0 && above < target && target <= above + mine[j]) {
          found = j;
          found_above = above;
          found_weight = mine[j];
        }
        above += mine[j];
      }
      const unsigned hit = __ballot_sync(kFullMask, found >= 0);
      if (lane == (hit ? __ffs(hit) - 1 : 0)) {  // no hit only for an empty or NaN-weighted row
        s.sel_bin = found >= 0 ? kBins - 1 - 8 * lane - found : 0;
        s.sel_above = found_above;
        s.sel_bin_weight = found_weight;
        s.sel_target = target;
      }
    }
    __syncthreads();
    if (level == 0) target = static_cast<W>(s.sel_target);
    target -= static_cast<W>(s.sel_above);
    const W bin_weight = static_cast<W>(s.sel_bin_weight);
    prefix |= static_cast<uint32_t>(s.sel_bin) << shift;
    // The target is met exactly by the whole bin: keep all of it and nothing below (saves the
    // remaining levels; common for top-k).
    if (target == bin_weight) return {prefix, true, 0, 0};
    if (level == 3) return {prefix, false, target, bin_weight};
  }
  return {prefix, true, 0, 0};  // not reached
}

// ---- ordered prefix sums ---------------------------------------------------------------------------

// The first id (in id order) at which the inclusive prefix sum of weight(i) reaches target_of(total),
// or -1 when the target is not in [1, total]. One pass of per-warp chunk sums (chunk c holds ids
// [256c, 256c + 256)), one block scan over the chunks, then one warp walks the chunk that crosses.
template <typename Weight, typename TargetOf>
__device__ int find_ordered(int n, Weight weight, TargetOf target_of, Smem& s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int chunks = (n + kChunk - 1) / kChunk;
  for (int c = warp; c < chunks; c += kWarps) {
    const int base = c * kChunk;
    u64 sum = 0;
#pragma unroll
    for (int j = 0; j < kChunk / 32; ++j) {
      const int i = base + j * 32 + lane;
      if (i < n) sum += weight(i);
    }
    sum = warp_total(sum);
    if (lane == 0) s.chunk[c] = sum;
  }
  __syncthreads();
  if (tid == 0) s.found_chunk = -1;  // the scan's barriers order this before any thread's find
  const int c0 = 2 * tid, c1 = c0 + 1;
  const u64 a = c0 < chunks ? s.chunk[c0] : 0ull, b = c1 < chunks ? s.chunk[c1] : 0ull;
  u64 total;
  const u64 excl = block_exclusive_scan(a + b, s, total);
  const u64 target = target_of(total);
  if (c0 < chunks && excl < target && target <= excl + a) {
    s.found_chunk = c0;
    s.found_excl = excl;
  } else if (c1 < chunks && excl + a < target && target <= excl + a + b) {
    s.found_chunk = c1;
    s.found_excl = excl + a;
  }
  __syncthreads();
  if (warp == 0) {
    const int c = s.found_chunk;
    int id = -1;
    if (c >= 0) {
      u64 run = s.found_excl;
      const int base = c * kChunk;
      for (int j = 0; j < kChunk / 32; ++j) {
        const int i = base + j * 32 + lane;
        const u64 incl = warp_inclusive_scan(i < n ? weight(i) : 0ull);
        const unsigned hit = __ballot_sync(kFullMask, run + incl >= target);
        if (hit) {
          id = base + j * 32 + __ffs(hit) - 1;
          break;
        }
        run += __shfl_sync(kFullMask, incl, 31);
      }
    }
    if (lane == 0) s.found_id = id;
  }
  __syncthreads();
  return s.found_id;
}

// ---- the filters' thresholds -----------------------------------------------------------------------

// The smallest fp32 t with exp(double(t) - m) >= min_p: the CPU masks a token when
// exp(double(x) - m) < min_p (fp64). One thread; m + log(min_p) is within a few ulps, then stepped.
__device__ inline float min_p_threshold(float m, float min_p) {
  const double md = m, pd = min_p;
  auto reaches = [&](float t) { return exp(static_cast<double>(t) - md) >= pd; };
  float t = static_cast<float>(md + log(pd));
  for (int guard = 0; guard < 64 && !reaches(t); ++guard) t = nextafterf(t, CUDART_INF_F);
  for (int guard = 0; guard < 64; ++guard) {
    const float below = nextafterf(t, -CUDART_INF_F);
    if (!reaches(below)) break;
    t = below;
  }
  return t;
}

// top_p * total, rounded up (an integer prefix sum reaches it exactly when it reaches the real value).
__device__ __forceinline__ u64 top_p_target(float top_p, u64 total) {
  const double t = ceil(static_cast<double>(top_p) * static_cast<double>(total));
  const u64 r = t < 1.0 ? 1ull : static_cast<u64>(t);
  return r < total ? r : total;
}

// The CPU picks the first token whose cumulative weight exceeds u * total: the integer prefix sum
// must reach floor(u * total) + 1. u >= 1 (a double u that rounded up to 1.0f) takes the last token.
__device__ __forceinline__ u64 draw_target(float uniform, u64 total) {
  const double u = uniform > 0.f ? static_cast<double>(uniform) : 0.0;  // NaN -> 0
  const u64 r = static_cast<u64>(floor(u * static_cast<double>(total))) + 1ull;
  return r < total ? r : total;
}

// ---- the kernel ------------------------------------------------------------------------------------

template <typename T>
__device__ ArgMax argmax_raw(const T* raw, int n) {
  ArgMax a{-CUDART_INF_F, INT_MAX};
  constexpr int kPerVec = 16 / static_cast<int>(sizeof(T));
  int head = 0;
  if ((reinterpret_cast<uintptr_t>(raw) & 15u) == 0) {
    const int vecs = n / kPerVec;
    const uint4* v = reinterpret_cast<const uint4*>(raw);
#pragma unroll 4
    for (int j = threadIdx.x; j < vecs; j += kThreads) {
      const uint4 q = __ldg(v + j);
      const T* e = reinterpret_cast<const T*>(&q);
#pragma unroll
      for (int t = 0; t < kPerVec; ++t) {
        if constexpr (sizeof(T) == 4) {
          consider(a, e[t], j * kPerVec + t);
        } else {
          consider(a, DTypeTraits<T>::to_float(e[t]), j * kPerVec + t);
        }
      }
    }
    head = vecs * kPerVec;
  }
  for (int i = head + threadIdx.x; i < n; i += kThreads) consider(a, load_logit(raw + i), i);
  return a;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    sample_rows_kernel(const T* __restrict__ logits, int64_t row_stride, int vocab,
                       const SamplingRowParams* __restrict__ params, const int32_t* __restrict__ penalty_tokens,
                       const int32_t* __restrict__ penalty_counts, float* workspace, int64_t ws_stride,
                       SampledRow* __restrict__ out, float* __restrict__ filtered) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x;
  const int row = blockIdx.x;
  const int n = vocab;
  const SamplingRowParams p = params[row];
  const T* raw = logits + row * row_stride;
  SampledRow& o = out[row];
  float* filtered_row = filtered ? filtered + static_cast<int64_t>(row) * n : nullptr;

  const bool greedy = !(p.temperature > 0.f);
  const bool want_lp = p.num_top_logprobs >= 0;
  const bool has_pen = p.penalty_end > p.penalty_begin &&
                       (p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f);

  // Fast path, the common case: greedy, no logprobs, no penalties: one argmax pass.
  if (greedy && !want_lp && !has_pen) {
    const ArgMax best = block_argmax(argmax_raw(raw, n), s);
    if (tid < kMaxTopLogprobs) {
      o.top_ids[tid] = -1;
      o.top_logprobs[tid] = CUDART_NAN_F;
    }
    if (tid == 0) {
      o.token = best.id < n ? best.id : 0;  // an all-NaN row: the CPU's argmax stays at 0
      o.logprob = CUDART_NAN_F;
    }
    if (filtered_row)
      for (int i = tid; i < n; i += kThreads) filtered_row[i] = load_logit(raw + i);
    return;
  }

  float* pen = has_pen ? workspace + static_cast<int64_t>(row) * ws_stride : nullptr;
  const bool scaled = !greedy && p.temperature != 1.f;
  const RowView<T> view{raw, pen, scaled ? __fdiv_rn(1.f, p.temperature) : 1.f, scaled};

  // Pass 1: the raw argmax (its value is the raw max, for logprobs and the unpenalized max), and the
  // copy that the penalties are applied to.
  ArgMax raw_best{-CUDART_INF_F, INT_MAX};
#pragma unroll 4
  for (int i = tid; i < n; i += kThreads) {
    const float x = view.raw_at(i);
    consider(raw_best, x, i);
    if (pen) pen[i] = x;
  }
  raw_best = block_argmax(raw_best, s);  // its barriers also publish the copy

  if (has_pen) {
    const float r = p.repetition_penalty;
    for (int j = p.penalty_begin + tid; j < p.penalty_end; j += kThreads) {
      const int t = penalty_tokens[j];
      if (t < 0 || t >= n) continue;
      float x = pen[t];
      if (r != 1.f) x = x > 0.f ? __fdiv_rn(x, r) : __fmul_rn(x, r);
      const int c = penalty_counts ? penalty_counts[j] : 0;
      // Rounded as the CPU rounds it: x - (frequency * count + presence), no fused multiply-add.
      if (c > 0)
        x = __fsub_rn(x, __fadd_rn(__fmul_rn(p.frequency_penalty, static_cast<float>(c)), p.presence_penalty));
      pen[t] = x;
    }
    __syncthreads();
  }

  // log-sum-exp of the raw row: fp32 exps summed in fp64 (the CPU's is all fp64; this is ~1e-7 off).
  double lse = 0.0;
  if (want_lp) {
    const float m_raw = raw_best.value;
    double sum = 0.0;
#pragma unroll 4
    for (int i = tid; i < n; i += kThreads) sum += static_cast<double>(expf(__fsub_rn(view.raw_at(i), m_raw)));
    lse = static_cast<double>(m_raw) + log(block_sum_f64(sum, s));
  }

  int token;
  Cut cut_k, cut_p;
  float t_min = -CUDART_INF_F;
  if (greedy) {
    if (has_pen) {
      ArgMax best{-CUDART_INF_F, INT_MAX};
      for (int i = tid; i < n; i += kThreads) consider(best, view.base_at(i), i);
      best = block_argmax(best, s);
      token = best.id < n ? best.id : 0;
    } else {
      token = raw_best.id < n ? raw_best.id : 0;
    }
  } else {
    float m;
    if (has_pen) {
      ArgMax best{-CUDART_INF_F, INT_MAX};
      for (int i = tid; i < n; i += kThreads) consider(best, view.base_at(i), i);
      m = block_argmax(best, s).value;
    } else {
      m = raw_best.value;
    }
    if (scaled) m = __fmul_rn(m, view.inv_temp);  // the max of x * c is (max x) * c: rounding is monotone
    if (!(m > -CUDART_INF_F)) {
      // Every logit is -inf: the CPU's weights are all NaN and its walk ends on the last token.
      token = n - 1;
    } else {
      if (p.top_k > 0 && p.top_k < n) {
        const auto sel = radix_select<uint32_t>(
            n,
            [&](int i, float& v, uint32_t& key) {
              v = view.value_at(i);
              key = order_key(v);
              return true;
            },
            [](float) { return 1u; }, [&](uint32_t) { return static_cast<uint32_t>(p.top_k); }, s);
        cut_k = sel.whole_range ? cut_at_or_above(sel.key) : Cut{sel.key, INT_MAX};  // ties all kept
      }
      if (p.top_p < 1.f) {
        auto mass = [&](float v) { return to_fixed(exp_below_max(v, m)); };
        const auto sel = radix_select<u64>(
            n,
            [&](int i, float& v, uint32_t& key) {
              v = view.value_at(i);
              key = order_key(v);
              return cut_k.keeps(key, i);
            },
            mass, [&](u64 total) { return top_p_target(p.top_p, total); }, s);
        if (sel.whole_range) {
          cut_p = cut_at_or_above(sel.key);
        } else {
          // Equal values weigh the same: the ties needed are a count, taken lower id first.
          const u64 w = mass(key_value(sel.key));
          const u64 ties = w ? sel.tie_weight / w : 0ull;
          const u64 keep = w ? (sel.need + w - 1) / w : 0ull;
          cut_p = Cut{sel.key, INT_MAX};
          if (keep < ties) {
            const uint32_t k = sel.key;
            cut_p.last_tie = find_ordered(
                n, [&](int i) { return order_key(view.value_at(i)) == k ? 1ull : 0ull; },
                [&](u64) { return keep; }, s);
          }
        }
      }
      if (p.min_p > 0.f) {
        if (tid == 0) s.min_p_threshold = min_p_threshold(m, p.min_p);
        __syncthreads();
        t_min = s.min_p_threshold;
      }
      // The draw: weights as the CPU computes them, exp(v - m) in fp32, summed exactly.
      const float uniform = p.uniform;
      token = find_ordered(
          n,
          [&](int i) {
            const float v = view.value_at(i);
            const uint32_t key = order_key(v);
            if (!cut_k.keeps(key, i) || !cut_p.keeps(key, i) || !(v >= t_min)) return 0ull;
            return to_fixed(expf(__fsub_rn(v, m)));
          },
          [&](u64 total) { return total ? draw_target(uniform, total) : 0ull; }, s);
      if (token < 0) token = n - 1;
    }
  }

  if (tid == 0) {
    o.token = token;
    o.logprob = want_lp ? static_cast<float>(static_cast<double>(view.raw_at(token)) - lse) : CUDART_NAN_F;
  }

  // The top-n raw logprobs: the n-th largest raw value by a count select, ties at it taken lower id
  // first, then the n (<= 20) collected and sorted by one thread.
  const int top_n = want_lp ? min(p.num_top_logprobs, min(kMaxTopLogprobs, n)) : 0;
  if (top_n > 0) {
    const auto sel = radix_select<uint32_t>(
        n,
        [&](int i, float& v, uint32_t& key) {
          v = view.raw_at(i);
          key = order_key(v);
          return true;
        },
        [](float) { return 1u; }, [&](uint32_t) { return static_cast<uint32_t>(top_n); }, s);
    Cut cut = sel.whole_range ? cut_at_or_above(sel.key) : Cut{sel.key, INT_MAX};
    if (!sel.whole_range && sel.need < sel.tie_weight) {
      const uint32_t k = sel.key;
      const u64 need = sel.need;
      cut.last_tie = find_ordered(
          n, [&](int i) { return order_key(view.raw_at(i)) == k ? 1ull : 0ull; }, [&](u64) { return need; }, s);
    }
    if (tid == 0) s.lp_count = 0;
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      const float x = view.raw_at(i);
      if (!cut.keeps(order_key(x), i)) continue;
      const int slot = atomicAdd(&s.lp_count, 1);
      if (slot < kMaxTopLogprobs) {
        s.lp_value[slot] = x;
        s.lp_id[slot] = i;
      }
    }
    __syncthreads();
    if (tid == 0) {
      const int count = min(s.lp_count, top_n);
      for (int a = 1; a < count; ++a) {  // insertion sort: the order atomics filled the slots varies
        const float v = s.lp_value[a];
        const int id = s.lp_id[a];
        int b = a - 1;
        for (; b >= 0 && precedes(v, id, s.lp_value[b], s.lp_id[b]); --b) {
          s.lp_value[b + 1] = s.lp_value[b];
          s.lp_id[b + 1] = s.lp_id[b];
        }
        s.lp_value[b + 1] = v;
        s.lp_id[b + 1] = id;
      }
      s.lp_count = count;
    }
    __syncthreads();
  }
  if (tid < kMaxTopLogprobs) {
    const bool has = tid < top_n && tid < s.lp_count;
    o.top_ids[tid] = has ? s.lp_id[tid] : -1;
    o.top_logprobs[tid] = has ? static_cast<float>(static_cast<double>(s.lp_value[tid]) - lse) : CUDART_NAN_F;
  }

  if (filtered_row) {
    for (int i = tid; i < n; i += kThreads) {
      if (greedy) {
        filtered_row[i] = view.base_at(i);
      } else {
        const float v = view.value_at(i);
        const uint32_t key = order_key(v);
        const bool kept = cut_k.keeps(key, i) && cut_p.keeps(key, i) && v >= t_min;
        filtered_row[i] = kept ? v : -CUDART_INF_F;
      }
    }
  }
}

}  // namespace sampling_detail

template <typename T>
cudaError_t launch_sample_rows(const T* logits, int64_t row_stride, int rows, int vocab,
                               const SamplingRowParams* params, const int32_t* penalty_tokens,
                               const int32_t* penalty_counts, float* workspace, SampledRow* out, float* filtered,
                               cudaStream_t stream) {
  using namespace sampling_detail;
  if (rows == 0) return cudaSuccess;
  constexpr int kSmemBytes = static_cast<int>(sizeof(Smem));
  const cudaError_t attribute_status =
      allow_dynamic_shared_memory(reinterpret_cast<const void*>(sample_rows_kernel<T>), kSmemBytes);
  if (attribute_status != cudaSuccess) return attribute_status;
  const int64_t ws_stride = (static_cast<int64_t>(vocab) + 63) / 64 * 64;
  sample_rows_kernel<T><<<rows, kThreads, kSmemBytes, stream>>>(logits, row_stride, vocab, params, penalty_tokens,
                                                                penalty_counts, workspace, ws_stride, out, filtered);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
