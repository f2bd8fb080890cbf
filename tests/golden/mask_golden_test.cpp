// tests/golden/mask_golden_test.cpp: every mask policy of the CPU attention (varlen and paged) against
// a dense-mask reference computed here, from ARCHITECTURE.md's wording rather than from
// kernels/attention_mask.h: build the full [q, k] visibility matrix, softmax with -inf, sum.
// Several sequences with different policies share one packed batch, with GQA and bottom-right
// aligned queries (q_len < kv_len). Tolerance: max abs error 1e-5 (fp32, values O(1)).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend/mask_policy.h"
#include "kernels/cpu/attention.h"

namespace tessera::golden {
namespace {

struct Case {
  MaskPolicy policy;
  int32_t q_len;
  int32_t kv_len;
};

// Dense visibility from the policy's definition.
bool dense_visible(const MaskPolicy& p, int32_t q, int32_t k) {
  switch (p.kind) {
    case MaskPolicy::Kind::kBidirectional:
      return true;
    case MaskPolicy::Kind::kCausal:
      return k <= q;
    case MaskPolicy::Kind::kSlidingWindow:
      // window tokens counting q itself, plus the first `sinks` tokens; never the future
      return k <= q && (q - k < p.window || k < p.sinks);
    case MaskPolicy::Kind::kSegments: {
      if (k > q) return false;
      // segment id per position: -1 prefix, 0..n-1 segments, -2 tail
      auto segment_of = [&](int32_t pos) {
        if (pos < p.shared_prefix) return -1;
        int32_t end = p.shared_prefix;
        for (size_t i = 0; i < p.segment_lengths.size(); ++i) {
          end += p.segment_lengths[i];
          if (pos < end) return static_cast<int>(i);
        }
        return -2;
      };
      const int qs = segment_of(q), ks = segment_of(k);
      return qs == -2 || ks == -1 || ks == qs;
    }
  }
  return false;
}

struct Dims {
  int32_t heads = 6, kv_heads = 2, head_dim = 24;
};

std::vector<float> dense_reference(const std::vector<Case>& cases, const std::vector<float>& q,
                                   const std::vector<float>& k, const std::vector<float>& v, const Dims& d) {
  const int32_t group = d.heads / d.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  std::vector<float> out;
  int64_t q_row = 0, k_row = 0;
  for (const Case& c : cases) {
    for (int32_t i = 0; i < c.q_len; ++i) {
      const int32_t qpos = c.kv_len - c.q_len + i;
      for (int32_t h = 0; h < d.heads; ++h) {
        std::vector<double> scores(c.kv_len);
        double max_s = -std::numeric_limits<double>::infinity();
        for (int32_t kp = 0; kp < c.kv_len; ++kp) {
          if (!dense_visible(c.policy, qpos, kp)) {
            scores[kp] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double dot = 0;
          for (int32_t x = 0; x < d.head_dim; ++x) {
            dot += static_cast<double>(q[((q_row + i) * d.heads + h) * d.head_dim + x]) *
                   k[((k_row + kp) * d.kv_heads + h / group) * d.head_dim + x];
          }
          scores[kp] = dot * scale;
          max_s = std::max(max_s, scores[kp]);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - max_s));
        for (int32_t x = 0; x < d.head_dim; ++x) {
          double acc = 0;
          for (int32_t kp = 0; kp < c.kv_len; ++kp) {
            acc += scores[kp] / sum * v[((k_row + kp) * d.kv_heads + h / group) * d.head_dim + x];
          }
          out.push_back(static_cast<float>(acc));
        }
      }
    }
    q_row += c.q_len;
    k_row += c.kv_len;
  }
  return out;
}

std::vector<Case> all_cases() {
  return {
      {MaskPolicy::causal(), 37, 37},
      {MaskPolicy::bidirectional(), 21, 21},
      {MaskPolicy::sliding_window(16), 64, 64},
      {MaskPolicy::sliding_window(7, 3), 50, 50},            // window + sinks
      {MaskPolicy::sliding_window(5, 2), 4, 40},             // decode-like: queries at the end
      {MaskPolicy::segments({5, 9, 4}, 6), 30, 30},          // prefix + 3 segments + 6 tail tokens
      {MaskPolicy::segments({8, 8}, 0), 16, 16},             // no prefix, no tail
      {MaskPolicy::segments({3, 10}, 4), 5, 25},             // chunk of tail queries only
      {MaskPolicy::segments({6, 6}, 2), 9, 14},              // queries start inside segment 1
      {MaskPolicy::causal(), 1, 33},                         // one decode token
  };
}

class MaskGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    cases_ = all_cases();
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const Case& c : cases_) {
      total_q_ += c.q_len;
      total_k_ += c.kv_len;
    }
    q_.resize(static_cast<size_t>(total_q_) * d_.heads * d_.head_dim);
    k_.resize(static_cast<size_t>(total_k_) * d_.kv_heads * d_.head_dim);
    v_.resize(k_.size());
    for (float& x : q_) x = normal(rng);
    for (float& x : k_) x = normal(rng);
    for (float& x : v_) x = normal(rng);
    cu_q_.push_back(0);
    cu_k_.push_back(0);
    for (const Case& c : cases_) {
      masks_.push_back(c.policy.lower(segment_storage_.emplace_back()));
      cu_q_.push_back(cu_q_.back() + c.q_len);
      cu_k_.push_back(cu_k_.back() + c.kv_len);
      kv_lens_.push_back(c.kv_len);
    }
    // lower() pointed masks at vectors that emplace_back may have moved: re-lower in place.
    for (size_t i = 0; i < cases_.size(); ++i) masks_[i] = cases_[i].policy.lower(segment_storage_[i]);
    expected_ = dense_reference(cases_, q_, k_, v_, d_);
  }

  kernels::cpu::PackedQueries queries() const {
    kernels::cpu::PackedQueries pq;
    pq.q = q_.data();
    pq.q_row_stride = static_cast<int64_t>(d_.heads) * d_.head_dim;
    pq.cu_seqlens_q = cu_q_.data();
    pq.num_seqs = static_cast<int32_t>(cases_.size());
    pq.masks = masks_.data();
    return pq;
  }
  kernels::cpu::AttentionDims dims() const {
    return {d_.heads, d_.kv_heads, d_.head_dim, 1.0f / std::sqrt(static_cast<float>(d_.head_dim))};
  }
  float max_err(const std::vector<float>& got) const {
    float m = 0;
    for (size_t i = 0; i < got.size(); ++i) m = std::max(m, std::fabs(got[i] - expected_[i]));
    return m;
  }

  Dims d_;
  std::vector<Case> cases_;
  int64_t total_q_ = 0, total_k_ = 0;
  std::vector<float> q_, k_, v_, expected_;
  std::vector<int32_t> cu_q_, cu_k_, kv_lens_;
  std::vector<std::vector<int32_t>> segment_storage_;
  std::vector<kernels::MaskParams> masks_;
};

TEST_F(MaskGolden, VarlenMatchesDenseMaskReference) {
  std::vector<float> out(expected_.size(), -1.0f);
  const int64_t kv_stride = static_cast<int64_t>(d_.kv_heads) * d_.head_dim;
  ASSERT_EQ(kernels::cpu::attention_varlen(queries(), k_.data(), kv_stride, v_.data(), kv_stride, cu_k_.data(), dims(),
                                           out.data()),
            kernels::cpu::Status::kOk);
  const float err = max_err(out);
  std::printf("[golden] masks (causal, bidirectional, window, window+sinks, segments) varlen: max abs error %.3g\n", err);
  EXPECT_LE(err, 1e-5f);
}

TEST_F(MaskGolden, PagedMatchesDenseMaskReference) {
  // Scatter every sequence's keys over shuffled blocks of size 5 (not a divisor of any length).
  const int32_t block_size = 5;
  const int64_t width = static_cast<int64_t>(d_.kv_heads) * d_.head_dim;
  int32_t max_blocks = 0;
  for (const Case& c : cases_) max_blocks = std::max(max_blocks, (c.kv_len + block_size - 1) / block_size);
  const int32_t num_blocks = static_cast<int32_t>(cases_.size()) * max_blocks;
  std::vector<int32_t> block_ids(num_blocks);
  for (int32_t i = 0; i < num_blocks; ++i) block_ids[i] = i;
  std::shuffle(block_ids.begin(), block_ids.end(), std::mt19937(11));
  std::vector<int32_t> tables(static_cast<size_t>(cases_.size()) * max_blocks, -1);
  std::vector<float> k_cache(static_cast<size_t>(num_blocks) * block_size * width, NAN);
  std::vector<float> v_cache(k_cache.size(), NAN);
  int32_t next = 0;
  for (size_t s = 0; s < cases_.size(); ++s) {
    const int32_t blocks = (cases_[s].kv_len + block_size - 1) / block_size;
    for (int32_t b = 0; b < blocks; ++b) tables[s * max_blocks + b] = block_ids[next++];
    std::vector<int32_t> slots;
    for (int32_t p = 0; p < cases_[s].kv_len; ++p) {
      slots.push_back(tables[s * max_blocks + p / block_size] * block_size + p % block_size);
    }
    ASSERT_EQ(kernels::cpu::kv_cache_write(k_.data() + cu_k_[s] * width, width, v_.data() + cu_k_[s] * width, width,
                                           slots.data(), cases_[s].kv_len, d_.kv_heads, d_.head_dim, k_cache.data(),
                                           v_cache.data(), static_cast<int64_t>(num_blocks) * block_size),
              kernels::cpu::Status::kOk);
  }
  kernels::cpu::PagedKv kv;
  kv.k_cache = k_cache.data();
  kv.v_cache = v_cache.data();
  kv.num_blocks = num_blocks;
  kv.block_size = block_size;
  kv.block_tables = tables.data();
  kv.max_blocks_per_seq = max_blocks;
  kv.context_lens = kv_lens_.data();
  std::vector<float> out(expected_.size(), -1.0f);
  ASSERT_EQ(kernels::cpu::attention_paged(queries(), kv, dims(), out.data()), kernels::cpu::Status::kOk);
  const float err = max_err(out);  // unwritten slots are NaN: reading one would poison the result
  std::printf("[golden] masks paged (block size %d): max abs error %.3g\n", block_size, err);
  EXPECT_LE(err, 1e-5f);
}

}  // namespace
}  // namespace tessera::golden
