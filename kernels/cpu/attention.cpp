// kernels/cpu/attention.cpp: the reference attention (see attention.h). One (query row, head) pair is
// one work item; scores for the visible keys go to a per-thread buffer, then an exact softmax.
#include "kernels/cpu/attention.h"

#include "kernels/cpu/thread_pool.h"

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

// q . k with 8 independent partial sums, which the compiler turns into vector lanes: a single running
// sum is a chain of head_dim dependent adds per key, and made decode attention cost as much as a
// projection.
inline float dot_product(const float* a, const float* b, int32_t n) {
  float part[8] = {};
  int32_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int j = 0; j < 8; ++j) part[j] += a[d + j] * b[d + j];
  }
  float sum = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// KeyAt(s, p, kv_head) -> pointer to the key (or value) of position p of sequence s.
template <typename KeyAt, typename ValueAt>
void attend(const PackedQueries& queries, const int32_t* kv_lens_or_null,
            const int32_t* cu_seqlens_k_or_null, const AttentionDims& dims, float* out,
            KeyAt key_at, ValueAt value_at) {
  const int32_t* cu_q = queries.cu_seqlens_q;
  const int64_t total_q = cu_q[queries.num_seqs];
  const int64_t items = total_q * dims.num_heads;
  const int32_t group = dims.num_heads / dims.num_kv_heads;
  const int32_t hd = dims.head_dim;
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
      auto key_pos = [&](int32_t i) { return i < ranges.leading ? i : ranges.lowest + (i - ranges.leading); };
      float max_score = -std::numeric_limits<float>::infinity();
      for (int32_t i = 0; i < count; ++i) {
        scores[i] = dot_product(q, key_at(seq, key_pos(i), kv_head), hd) * dims.scale;
        max_score = std::max(max_score, scores[i]);
      }
      float sum = 0.0f;
      for (int32_t i = 0; i < count; ++i) {
        scores[i] = std::exp(scores[i] - max_score);
        sum += scores[i];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int32_t i = 0; i < count; ++i) {
        const float* v = value_at(seq, key_pos(i), kv_head);
        const float p = scores[i];
        for (int32_t d = 0; d < hd; ++d) acc[d] += p * v[d];
      }
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
  attend(
      queries, nullptr, cu_seqlens_k, dims, out,
      [&](int32_t s, int32_t p, int32_t h) {
        return k + (cu_seqlens_k[s] + static_cast<int64_t>(p)) * k_row_stride + static_cast<int64_t>(h) * hd;
      },
      [&](int32_t s, int32_t p, int32_t h) {
        return v + (cu_seqlens_k[s] + static_cast<int64_t>(p)) * v_row_stride + static_cast<int64_t>(h) * hd;
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
  auto slot_of = [&](int32_t s, int32_t p) {
    const int32_t block = kv.block_tables[static_cast<int64_t>(s) * kv.max_blocks_per_seq + p / kv.block_size];
    return static_cast<int64_t>(block) * kv.block_size + p % kv.block_size;
  };
  attend(
      queries, kv.context_lens, nullptr, dims, out,
      [&](int32_t s, int32_t p, int32_t h) { return kv.k_cache + slot_of(s, p) * kv_width + static_cast<int64_t>(h) * hd; },
      [&](int32_t s, int32_t p, int32_t h) { return kv.v_cache + slot_of(s, p) * kv_width + static_cast<int64_t>(h) * hd; });
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
