// tests/gpu/backend/test_cuda_token_mask.cpp: constrained decoding's allowed-token bitmasks in
// CudaBackend::sample against the host sampler (sample_on_host) on the same logits: greedy and
// seeded draws pick the same allowed token, logprobs are those of the constrained distribution, and
// rows without a mask in the same call are untouched. Vocabulary widths that are not multiples of 32.
// Skips itself without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/sampler/sampler.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "tests/gpu/backend/backend_test_util.h"

namespace tessera {
namespace {

std::vector<int32_t> random_bitmask(int vocab, double keep, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution kept(keep);
  std::vector<int32_t> words(static_cast<size_t>((vocab + 31) / 32), 0);
  for (int t = 0; t < vocab; ++t) {
    if (kept(rng)) words[static_cast<size_t>(t / 32)] |= static_cast<int32_t>(1u << (t % 32));
  }
  return words;
}

bool allowed(const std::vector<int32_t>& words, int32_t token) {
  return ((static_cast<uint32_t>(words[static_cast<size_t>(token / 32)]) >> (token % 32)) & 1u) != 0;
}

TEST(CudaTokenMask, DeviceSamplerKeepsOnlyAllowedTokensAsTheHostDoes) {
  REQUIRE_GPU();
  CudaBackend gpu;
  for (const int vocab : {1000, 49155}) {
    const int rows = 6;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& x : logits) x = normal(rng);
    // Rows 0-3 constrained (one to a single token), 4-5 free; greedy and sampled, with logprobs.
    std::vector<std::vector<int32_t>> masks = {random_bitmask(vocab, 0.3, 1), random_bitmask(vocab, 0.01, 2),
                                               random_bitmask(vocab, 0.5, 3), std::vector<int32_t>((vocab + 31) / 32, 0)};
    masks[3][7 / 32] = 1 << 7;  // only token 7
    std::vector<SampleSpec> specs(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      specs[static_cast<size_t>(r)].temperature = r % 2 == 0 ? 0.0f : 0.8f;
      specs[static_cast<size_t>(r)].uniform = 0.37 + 0.1 * r;
      specs[static_cast<size_t>(r)].num_top_logprobs = 4;
      if (r < 4) specs[static_cast<size_t>(r)].allowed_tokens = masks[static_cast<size_t>(r)];
    }
    const Tensor device_logits = gpu.upload(logits, {rows, vocab}, "logits");
    const std::vector<SampleOutcome> got = gpu.sample(device_logits, specs);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row(logits.begin() + static_cast<int64_t>(r) * vocab,
                             logits.begin() + static_cast<int64_t>(r + 1) * vocab);
      const SampleOutcome want = sample_on_host(row, specs[static_cast<size_t>(r)]);
      EXPECT_EQ(got[static_cast<size_t>(r)].token, want.token) << "vocab " << vocab << " row " << r;
      EXPECT_NEAR(got[static_cast<size_t>(r)].logprob, want.logprob, 1e-3) << "vocab " << vocab << " row " << r;
      if (r < 4) {
        EXPECT_TRUE(allowed(masks[static_cast<size_t>(r)], got[static_cast<size_t>(r)].token)) << "row " << r;
        for (const auto& [id, lp] : got[static_cast<size_t>(r)].top) {
          if (std::isfinite(lp) && lp > -1e30f) {
            EXPECT_TRUE(allowed(masks[static_cast<size_t>(r)], id)) << "row " << r;
          }
        }
      }
    }
    EXPECT_EQ(got[3].token, 7);
    EXPECT_NEAR(got[3].logprob, 0.0f, 1e-5);
  }
}

}  // namespace
}  // namespace tessera
