// tests/unit/kernels_cpu/kernels_cpu_test.cpp: each fp32 kernel against a straightforward reference
// written here (computed before any in-place kernel runs), at awkward sizes (1, 111, 769, 5125) so
// every remainder path runs. Tolerances are relative to the values' scale and stated per test.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace tessera::kernels::cpu {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class AwkwardDims : public ::testing::TestWithParam<int64_t> {};

TEST_P(AwkwardDims, AddRmsNormMatchesReference) {
  const int64_t dim = GetParam(), rows = 3;
  const float eps = 1e-6f;
  std::vector<float> x = random_vector(rows * dim, 1), residual = random_vector(rows * dim, 2), w = random_vector(dim, 3);
  // Reference first: the kernel works in place.
  std::vector<float> ref_res(rows * dim), ref_x(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) {
      ref_res[r * dim + j] = x[r * dim + j] + residual[r * dim + j];
      ss += static_cast<double>(ref_res[r * dim + j]) * ref_res[r * dim + j];
    }
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j) ref_x[r * dim + j] = static_cast<float>(ref_res[r * dim + j] * inv * w[j]);
  }
  std::vector<float> plain(rows * dim);
  ASSERT_EQ(rms_norm(ref_res.data(), w.data(), plain.data(), rows, dim, eps), Status::kOk);
  EXPECT_LE(max_abs_diff(plain, ref_x), 1e-5f);
  ASSERT_EQ(add_rms_norm(x.data(), residual.data(), w.data(), rows, dim, eps), Status::kOk);
  EXPECT_LE(max_abs_diff(residual, ref_res), 1e-6f);
  EXPECT_LE(max_abs_diff(x, ref_x), 1e-5f);
}

TEST_P(AwkwardDims, LayerNormWithResidualMatchesReference) {
  const int64_t dim = GetParam(), rows = 2;
  const float eps = 1e-12f;
  std::vector<float> x = random_vector(rows * dim, 4, 3.0f), res = random_vector(rows * dim, 5), w = random_vector(dim, 6),
                     b = random_vector(dim, 7);
  std::vector<float> ref(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < dim; ++j) mean += x[r * dim + j] + res[r * dim + j];
    mean /= dim;
    for (int64_t j = 0; j < dim; ++j) var += std::pow(x[r * dim + j] + res[r * dim + j] - mean, 2);
    var /= dim;
    for (int64_t j = 0; j < dim; ++j) {
      ref[r * dim + j] = static_cast<float>((x[r * dim + j] + res[r * dim + j] - mean) / std::sqrt(var + eps) * w[j] + b[j]);
    }
  }
  ASSERT_EQ(layer_norm(x.data(), res.data(), w.data(), b.data(), rows, dim, eps), Status::kOk);
  EXPECT_LE(max_abs_diff(x, ref), 2e-5f);
}

TEST_P(AwkwardDims, GemmMatchesNaive) {
  const int64_t n = GetParam(), k = 111;
  for (int64_t m : {1, 7}) {
    const std::vector<float> x = random_vector(m * k, 8), w = random_vector(n * k, 9), bias = random_vector(n, 10);
    std::vector<float> ref(m * n), y(m * n, NAN);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = bias[j];
        for (int64_t t = 0; t < k; ++t) acc += static_cast<double>(x[i * k + t]) * w[j * k + t];
        ref[i * n + j] = static_cast<float>(acc);
      }
    }
    ASSERT_EQ(gemm_xwt(x.data(), w.data(), bias.data(), y.data(), m, n, k), Status::kOk);
    EXPECT_LE(max_abs_diff(y, ref), 1e-4f) << "m " << m;  // sums of 111 products of N(0,1): values ~10
  }
}

TEST_P(AwkwardDims, SiluMulAndGeluMatchFormulas) {
  const int64_t dim = GetParam(), rows = 2;
  const std::vector<float> gate_up = random_vector(rows * 2 * dim, 11, 2.0f);
  std::vector<float> out(rows * dim), ref(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) {
      const double g = gate_up[r * 2 * dim + j], u = gate_up[r * 2 * dim + dim + j];
      ref[r * dim + j] = static_cast<float>(g / (1 + std::exp(-g)) * u);
    }
  }
  ASSERT_EQ(silu_mul(gate_up.data(), out.data(), rows, dim), Status::kOk);
  EXPECT_LE(max_abs_diff(out, ref), 1e-5f);
  std::vector<float> g = random_vector(dim, 12, 3.0f), gref(dim);
  for (int64_t j = 0; j < dim; ++j) gref[j] = static_cast<float>(0.5 * g[j] * (1 + std::erf(g[j] / std::numbers::sqrt2)));
  ASSERT_EQ(gelu_erf(g.data(), dim), Status::kOk);
  EXPECT_LE(max_abs_diff(g, gref), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Sizes, AwkwardDims, ::testing::Values(1, 8, 111, 769, 5125));

TEST(Rope, RotateHalfMatchesReferenceOnStridedRows) {
  const int32_t heads = 3, head_dim = 10, rows = 5;
  const int64_t stride = heads * head_dim + 7;  // q inside a wider fused row
  std::vector<float> x = random_vector(rows * stride, 13);
  const std::vector<int32_t> positions{0, 1, 7, 100, 4095};
  RopeFrequencyParams p;
  p.head_dim = head_dim;
  p.theta = 500000.0;
  std::vector<float> inv_freq(head_dim / 2);
  ASSERT_EQ(rope_inv_freq(p, inv_freq.data()), Status::kOk);
  for (int32_t i = 0; i < head_dim / 2; ++i) {
    EXPECT_NEAR(inv_freq[i], std::pow(500000.0, -2.0 * i / head_dim), 1e-6 * inv_freq[i] + 1e-12);
  }
  std::vector<float> ref = x;
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t i = 0; i < head_dim / 2; ++i) {
        const double a = static_cast<double>(positions[r]) * inv_freq[i];
        const float x1 = x[r * stride + h * head_dim + i], x2 = x[r * stride + h * head_dim + i + head_dim / 2];
        ref[r * stride + h * head_dim + i] = static_cast<float>(x1 * std::cos(a) - x2 * std::sin(a));
        ref[r * stride + h * head_dim + i + head_dim / 2] = static_cast<float>(x2 * std::cos(a) + x1 * std::sin(a));
      }
    }
  }
  ASSERT_EQ(rope_rotate_half(x.data(), stride, positions.data(), inv_freq.data(), rows, heads, head_dim), Status::kOk);
  EXPECT_LE(max_abs_diff(x, ref), 2e-3f);  // angles up to 4095 rad: fp32 angle rounding dominates
  EXPECT_EQ(rope_rotate_half(x.data(), heads * head_dim - 1, positions.data(), inv_freq.data(), rows, heads, head_dim),
            Status::kInvalidShape);
}

TEST(Rope, Llama3ScalingKeepsHighAndDividesLowFrequencies) {
  RopeFrequencyParams p;
  p.head_dim = 128;
  p.theta = 500000.0;
  std::vector<float> plain(64), scaled(64);
  ASSERT_EQ(rope_inv_freq(p, plain.data()), Status::kOk);
  p.llama3 = true;
  p.factor = 8.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position_embeddings = 8192;
  ASSERT_EQ(rope_inv_freq(p, scaled.data()), Status::kOk);
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i]) << i;
    } else if (wavelen > 8192.0) {
      EXPECT_NEAR(scaled[i], plain[i] / 8.0, 1e-6 * plain[i]) << i;
    } else {
      EXPECT_LT(scaled[i], plain[i]) << i;
      EXPECT_GT(scaled[i], plain[i] / 8.0) << i;
    }
  }
}

TEST(SoftmaxPoolNormalize, MatchReferences) {
  std::vector<float> x = random_vector(3 * 769, 14, 5.0f), ref = x;
  for (int r = 0; r < 3; ++r) {
    const float m = *std::max_element(ref.begin() + r * 769, ref.begin() + (r + 1) * 769);
    double sum = 0;
    for (int j = 0; j < 769; ++j) sum += std::exp(ref[r * 769 + j] - m);
    for (int j = 0; j < 769; ++j) ref[r * 769 + j] = static_cast<float>(std::exp(ref[r * 769 + j] - m) / sum);
  }
  ASSERT_EQ(softmax(x.data(), 3, 769), Status::kOk);
  EXPECT_LE(max_abs_diff(x, ref), 1e-6f);

  const std::vector<float> h = random_vector(7 * 5, 15);
  const std::vector<int32_t> cu{0, 2, 7};
  std::vector<float> mean(2 * 5), first(2 * 5);
  ASSERT_EQ(pool_sequences(h.data(), cu.data(), mean.data(), 2, 5, PoolKind::kMean), Status::kOk);
  ASSERT_EQ(pool_sequences(h.data(), cu.data(), first.data(), 2, 5, PoolKind::kFirst), Status::kOk);
  for (int j = 0; j < 5; ++j) {
    EXPECT_NEAR(mean[j], (h[j] + h[5 + j]) / 2, 1e-6);
    float s = 0;
    for (int r = 2; r < 7; ++r) s += h[r * 5 + j];
    EXPECT_NEAR(mean[5 + j], s / 5, 1e-6);
    EXPECT_EQ(first[5 + j], h[2 * 5 + j]);
  }
  ASSERT_EQ(l2_normalize(mean.data(), 2, 5), Status::kOk);
  for (int r = 0; r < 2; ++r) {
    double n = 0;
    for (int j = 0; j < 5; ++j) n += mean[r * 5 + j] * mean[r * 5 + j];
    EXPECT_NEAR(n, 1.0, 1e-6);
  }
  const std::vector<int32_t> empty_seq{0, 0};
  EXPECT_EQ(pool_sequences(h.data(), empty_seq.data(), mean.data(), 1, 5, PoolKind::kMean), Status::kInvalidShape);
}

TEST(Embedding, GathersAndRejectsOutOfRangeIds) {
  const std::vector<float> table = random_vector(10 * 3, 16);
  const std::vector<int32_t> ids{9, 0, 4};
  std::vector<float> out(9, 1.0f);
  ASSERT_EQ(embedding_gather(ids.data(), table.data(), out.data(), 3, 10, 3, /*accumulate=*/true), Status::kOk);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(out[i * 3 + j], 1.0f + table[ids[i] * 3 + j]);
  const std::vector<int32_t> bad{10};
  EXPECT_EQ(embedding_gather(bad.data(), table.data(), out.data(), 1, 10, 3, false), Status::kInvalidArgument);
}

TEST(Attention, RejectsInvalidMasksAndEvictedBlocksThatWouldBeRead) {
  const int32_t hd = 4;
  const std::vector<float> q = random_vector(8 * hd, 17), kv = random_vector(64 * hd, 18);
  std::vector<float> out(8 * hd);
  const std::vector<int32_t> cu{0, 1};
  MaskParams mask;
  mask.kind = MaskKind::kSlidingWindow;
  mask.window = 0;
  PackedQueries pq{q.data(), hd, cu.data(), 1, &mask};
  const AttentionDims dims{1, 1, hd, 0.5f};
  EXPECT_EQ(attention_varlen(pq, kv.data(), hd, kv.data(), hd, cu.data(), dims, out.data()), Status::kInvalidArgument);
  // Paged: 12 keys in blocks of 4; block 0 evicted. A window of 4 at query 11 sees 8..11: fine.
  mask.window = 4;
  const std::vector<int32_t> table{-1, 1, 2};
  const std::vector<int32_t> context{12};
  PagedKv paged{kv.data(), kv.data(), 16, 4, table.data(), 3, context.data()};
  EXPECT_EQ(attention_paged(pq, paged, dims, out.data()), Status::kOk);
  // A window of 9 would read position 3 in the evicted block.
  mask.window = 9;
  EXPECT_EQ(attention_paged(pq, paged, dims, out.data()), Status::kInvalidArgument);
  // GQA needs num_kv_heads to divide num_heads.
  const AttentionDims bad{3, 2, hd, 0.5f};
  mask.kind = MaskKind::kCausal;
  EXPECT_EQ(attention_varlen(pq, kv.data(), hd, kv.data(), hd, cu.data(), bad, out.data()), Status::kInvalidShape);
}

TEST(ThreadPool, ManyCallsCoverEveryIndexOnceIncludingNestedCalls) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int call = 0; call < 300; ++call) {
      const int64_t n = 1 + call % 97;
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int64_t> nested{0};
      parallel_for(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          hits[i]++;
          parallel_for(3, 1, [&](int64_t b, int64_t e) { nested += e - b; });  // runs inline on the worker
        }
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " call " << call;
      ASSERT_EQ(nested.load(), 3 * n);
    }
  }
  set_num_threads(0);
  EXPECT_GE(num_threads(), 1);
}

}  // namespace
}  // namespace tessera::kernels::cpu
