// kernels/cpu/attention.cpp: the reference attention (see attention.h). One (query row, head) pair is
// one work item; scores for the visible keys go to a per-thread buffer, then an exact softmax.
#include "kernels/cpu/attention.h"

#include "kernels/cpu/quant/isa.h"
#include "kernels/cpu/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tessera::kernels::cpu {

namespace {

// Visible keys of the query at position q in a sequence of kv_len keys: [0, leading) then
// [lowest, highest]. leading <= lowest, so the ranges never overlap.
struct KeyRanges {
  int32_t leading = 0;
  int32_t lowest = 0;
  int32_t highest = -1;
};

inline KeyRanges visible_ranges(const MaskParams& mask, int32_t q, int32_t kv_len) {
  KeyRanges r;
  r.highest = mask.kind == MaskKind::kBidirectional ? kv_len - 1 : std::min(q, kv_len - 1);
  r.lowest = std::min(mask.lowest_key(q), r.highest + 1);
  r.leading = std::min(mask.leading_keys(), r.lowest);
  return r;
}

Status check_common(const PackedQueries& queries, const AttentionDims& dims, const float* out) {
  if (dims.num_heads <= 0 || dims.num_kv_heads <= 0 || dims.head_dim <= 0 ||
      dims.num_heads % dims.num_kv_heads != 0 || queries.num_seqs < 0) {
    return Status::kInvalidShape;
  }
  if (queries.q_row_stride < static_cast<int64_t>(dims.num_heads) * dims.head_dim) {
    return Status::kInvalidShape;
  }
  if (queries.q == nullptr || queries.cu_seqlens_q == nullptr || queries.masks == nullptr ||
      out == nullptr) {
    return Status::kInvalidArgument;
  }
  for (int32_t s = 0; s < queries.num_seqs; ++s) {
    if (queries.cu_seqlens_q[s + 1] < queries.cu_seqlens_q[s]) return Status::kInvalidShape;
    const MaskParams& m = queries.masks[s];
    if (m.kind == MaskKind::kSlidingWindow && m.window <= 0) return Status::kInvalidArgument;
    if (m.kind == MaskKind::kSegments && m.num_segments > 0 && m.segment_ends == nullptr) {
      return Status::kInvalidArgument;
    }
  }
  return Status::kOk;
}

// The two inner loops over a run of keys at a fixed stride, portable and AVX2 (picked once from the
// CPU's features; a target attribute, not a global flag, so the binary runs on any x86-64):
//   scores[t] = scale * (q . k_t)        (dot_run)
//   acc += sum_t p[t] * v_t              (axpy_run)
// Portable q . k uses 8 independent partial sums, which the compiler turns into vector lanes: a
// single running sum is a chain of head_dim dependent adds per key, and made decode attention cost
// as much as a projection.
void dot_run_portable(const float* q, const float* k, int64_t stride, int32_t n, int32_t hd, float scale,
                      float* scores) {
  for (int32_t t = 0; t < n; ++t, k += stride) {
    float part[8] = {};
    int32_t d = 0;
    for (; d + 8 <= hd; d += 8) {
      for (int j = 0; j < 8; ++j) part[j] += q[d + j] * k[d + j];
    }
    float sum = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    for (; d < hd; ++d) sum += q[d] * k[d];
    scores[t] = sum * scale;
  }
}

void axpy_run_portable(float* acc, const float* p, const float* v, int64_t stride, int32_t n, int32_t hd) {
  for (int32_t t = 0; t < n; ++t, v += stride) {
    for (int32_t d = 0; d < hd; ++d) acc[d] += p[t] * v[d];
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void dot_run_avx2(const float* q, const float* k, int64_t stride, int32_t n,
                                                      int32_t hd, float scale, float* scores) {
  if (hd % 8 != 0) return dot_run_portable(q, k, stride, n, hd, scale, scores);
  for (int32_t t = 0; t < n; ++t, k += stride) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int32_t d = 0;
    for (; d + 16 <= hd; d += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), a1);
    }
    if (d < hd) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    const __m256 a = _mm256_add_ps(a0, a1);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    scores[t] = _mm_cvtss_f32(s4) * scale;
  }
}

__attribute__((target("avx2,fma"))) void axpy_run_avx2(float* acc, const float* p, const float* v, int64_t stride,
                                                       int32_t n, int32_t hd) {
  if (hd % 8 != 0) return axpy_run_portable(acc, p, v, stride, n, hd);
  // Up to 128 values of acc stay in 16 registers for the whole run.
  for (int32_t d0 = 0; d0 < hd; d0 += 128) {
    const int32_t lanes = std::min(128, hd - d0) / 8;
    __m256 r[16];
    for (int j = 0; j < lanes; ++j) r[j] = _mm256_loadu_ps(acc + d0 + 8 * j);
    const float* vt = v + d0;
    for (int32_t t = 0; t < n; ++t, vt += stride) {
      const __m256 pt = _mm256_set1_ps(p[t]);
      for (int j = 0; j < lanes; ++j) r[j] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * j), r[j]);
    }
    for (int j = 0; j < lanes; ++j) _mm256_storeu_ps(acc + d0 + 8 * j, r[j]);
  }
}
#endif

using DotRunFn = void (*)(const float*, const float*, int64_t, int32_t, int32_t, float, float*);
using AxpyRunFn = void (*)(float*, const float*, const float*, int64_t, int32_t, int32_t);

struct RunKernels {
  DotRunFn dot = dot_run_portable;
  AxpyRunFn axpy = axpy_run_portable;
};

const RunKernels& run_kernels() {
  static const RunKernels kernels = [] {
    RunKernels k;
#if defined(__x86_64__)
    if (isa_supported(Isa::kAvx2)) k = RunKernels{dot_run_avx2, axpy_run_avx2};
#endif
    return k;
  }();
  return kernels;
}

// Keys (and values) of one sequence and kv head that sit at a fixed stride from position p on:
// the whole sequence when K/V are packed, the rest of p's block in a paged cache.
struct KeyRun {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  int32_t length = 0;
};

// RunAt(s, p, kv_head) -> the KeyRun starting at position p of sequence s. Walking runs instead of
// computing each key's address keeps the paged path from dividing by the block size per key.
template <typename RunAt>
void attend(const PackedQueries& queries, const int32_t* kv_lens_or_null,
            const int32_t* cu_seqlens_k_or_null, const AttentionDims& dims, float* out, RunAt run_at) {
  const int32_t* cu_q = queries.cu_seqlens_q;
  const int64_t total_q = cu_q[queries.num_seqs];
  const int64_t items = total_q * dims.num_heads;
  const int32_t group = dims.num_heads / dims.num_kv_heads;
  const int32_t hd = dims.head_dim;
  const RunKernels& kernels = run_kernels();
  // Work items are (query row, head) pairs; parallel_for hands out chunks dynamically because rows see
  // very different numbers of keys (causal, windows, segments).
  parallel_for(items, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(hd);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row = item / dims.num_heads;
      const int32_t head = static_cast<int32_t>(item % dims.num_heads);
      const int32_t kv_head = head / group;
      const int32_t seq =
          static_cast<int32_t>(std::upper_bound(cu_q, cu_q + queries.num_seqs + 1, row) - cu_q) - 1;
      const int32_t q_len = cu_q[seq + 1] - cu_q[seq];
      const int32_t kv_len = kv_lens_or_null != nullptr
                                 ? kv_lens_or_null[seq]
                                 : cu_seqlens_k_or_null[seq + 1] - cu_seqlens_k_or_null[seq];
      const int32_t q_pos = kv_len - q_len + static_cast<int32_t>(row - cu_q[seq]);
      const KeyRanges ranges = visible_ranges(queries.masks[seq], q_pos, kv_len);
      const float* q = queries.q + row * queries.q_row_stride + static_cast<int64_t>(head) * hd;
      float* o = out + row * static_cast<int64_t>(dims.num_heads) * hd + static_cast<int64_t>(head) * hd;

      const int32_t main_count = std::max(0, ranges.highest - ranges.lowest + 1);
      const int32_t count = ranges.leading + main_count;
      if (count == 0) {  // no visible key (only possible with an empty sequence): output zeros
        std::memset(o, 0, sizeof(float) * hd);
        continue;
      }
      scores.resize(count);
      // fn(i, run, n) for the visible keys in runs, i = index of the run's first key among them.
      auto for_each_run = [&](auto&& fn) {
        int32_t i = 0;
        auto range = [&](int32_t p, int32_t stop) {
          while (p < stop) {
            const KeyRun run = run_at(seq, p, kv_head);
            const int32_t n = std::min(run.length, stop - p);
            fn(i, run, n);
            i += n;
            p += n;
          }
        };
        range(0, ranges.leading);
        range(ranges.lowest, ranges.highest + 1);
      };
      for_each_run([&](int32_t i, const KeyRun& run, int32_t n) {
        kernels.dot(q, run.k, run.k_stride, n, hd, dims.scale, scores.data() + i);
      });
      const float max_score = *std::max_element(scores.begin(), scores.end());
      float sum = 0.0f;
      for (int32_t i = 0; i < count; ++i) {
        scores[i] = std::exp(scores[i] - max_score);
        sum += scores[i];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for_each_run([&](int32_t i, const KeyRun& run, int32_t n) {
        kernels.axpy(acc.data(), scores.data() + i, run.v, run.v_stride, n, hd);
      });
      const float inv = 1.0f / sum;
      for (int32_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  });
}

}  // namespace

Status attention_varlen(const PackedQueries& queries, const float* k, int64_t k_row_stride,
                        const float* v, int64_t v_row_stride, const int32_t* cu_seqlens_k,
                        const AttentionDims& dims, float* out) {
  if (Status st = check_common(queries, dims, out); st != Status::kOk) return st;
  if (k == nullptr || v == nullptr || cu_seqlens_k == nullptr) return Status::kInvalidArgument;
  const int64_t kv_width = static_cast<int64_t>(dims.num_kv_heads) * dims.head_dim;
  if (k_row_stride < kv_width || v_row_stride < kv_width) return Status::kInvalidShape;
  for (int32_t s = 0; s < queries.num_seqs; ++s) {
    const int32_t q_len = queries.cu_seqlens_q[s + 1] - queries.cu_seqlens_q[s];
    const int32_t kv_len = cu_seqlens_k[s + 1] - cu_seqlens_k[s];
    if (kv_len < q_len) return Status::kInvalidShape;
  }
  const int32_t hd = dims.head_dim;
  attend(queries, nullptr, cu_seqlens_k, dims, out, [&](int32_t s, int32_t p, int32_t h) {
    const int64_t at = cu_seqlens_k[s] + static_cast<int64_t>(p);
    return KeyRun{k + at * k_row_stride + static_cast<int64_t>(h) * hd, v + at * v_row_stride + static_cast<int64_t>(h) * hd,
                  k_row_stride, v_row_stride, cu_seqlens_k[s + 1] - cu_seqlens_k[s] - p};
  });
  return Status::kOk;
}

Status attention_paged(const PackedQueries& queries, const PagedKv& kv, const AttentionDims& dims,
                       float* out) {
  if (Status st = check_common(queries, dims, out); st != Status::kOk) return st;
  if (kv.k_cache == nullptr || kv.v_cache == nullptr || kv.block_tables == nullptr ||
      kv.context_lens == nullptr) {
    return Status::kInvalidArgument;
  }
  if (kv.block_size <= 0 || kv.num_blocks <= 0 || kv.max_blocks_per_seq <= 0) return Status::kInvalidShape;
  for (int32_t s = 0; s < queries.num_seqs; ++s) {
    const int32_t q_len = queries.cu_seqlens_q[s + 1] - queries.cu_seqlens_q[s];
    const int32_t kv_len = kv.context_lens[s];
    if (kv_len < q_len) return Status::kInvalidShape;
    const int32_t blocks_needed = (kv_len + kv.block_size - 1) / kv.block_size;
    if (blocks_needed > kv.max_blocks_per_seq) return Status::kInvalidShape;
    for (int32_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = kv.block_tables[static_cast<int64_t>(s) * kv.max_blocks_per_seq + b];
      if (id < 0 || id >= kv.num_blocks) {
        // A block wholly outside every query's visible range may have been evicted (sliding
        // window); the kernel never reads it, but every other block must be valid.
        const MaskParams& m = queries.masks[s];
        const int32_t first_q = kv_len - q_len;
        const int32_t block_end = (b + 1) * kv.block_size;  // exclusive
        const bool never_read = m.kind == MaskKind::kSlidingWindow &&
                                b * kv.block_size >= m.sinks &&
                                block_end <= first_q - m.window + 1;
        if (!never_read) return Status::kInvalidArgument;
      }
    }
  }
  const int64_t kv_width = static_cast<int64_t>(dims.num_kv_heads) * dims.head_dim;
  const int32_t hd = dims.head_dim;
  attend(queries, kv.context_lens, nullptr, dims, out, [&](int32_t s, int32_t p, int32_t h) {
    const int32_t block = kv.block_tables[static_cast<int64_t>(s) * kv.max_blocks_per_seq + p / kv.block_size];
    const int64_t at = (static_cast<int64_t>(block) * kv.block_size + p % kv.block_size) * kv_width +
                       static_cast<int64_t>(h) * hd;
    return KeyRun{kv.k_cache + at, kv.v_cache + at, kv_width, kv_width, kv.block_size - p % kv.block_size};
  });
  return Status::kOk;
}

Status kv_cache_write(const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
                      const int32_t* slot_mapping, int64_t rows, int32_t num_kv_heads,
                      int32_t head_dim, float* k_cache, float* v_cache, int64_t num_slots) {
  if (rows < 0 || num_kv_heads <= 0 || head_dim <= 0) return Status::kInvalidShape;
  const int64_t width = static_cast<int64_t>(num_kv_heads) * head_dim;
  if (k_row_stride < width || v_row_stride < width) return Status::kInvalidShape;
  for (int64_t r = 0; r < rows; ++r) {
    if (slot_mapping[r] >= num_slots) return Status::kInvalidArgument;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t slot = slot_mapping[r];
    if (slot < 0) continue;
    std::memcpy(k_cache + slot * width, k + r * k_row_stride, sizeof(float) * width);
    std::memcpy(v_cache + slot * width, v + r * v_row_stride, sizeof(float) * width);
  }
  return Status::kOk;
}

}  // namespace tessera::kernels::cpu
