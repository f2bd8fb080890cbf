// tests/gpu/test_elementwise.cpp: RoPE (plain and llama3-scaled, from the shared frequency table),
// SiLU-mul, bias+GELU and the embedding gather against CPU references, on vector and scalar paths.
#include "gpu_test_util.h"
#include "kernels/cuda/activation/activation.h"
#include "kernels/cuda/embedding/embedding.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/rope_frequencies.h"

namespace tessera::gpu_test {
namespace {

using kernels::RopeFrequencyParams;

RopeFrequencyParams rope_params(int head_dim, bool llama3) {
  RopeFrequencyParams p;
  p.head_dim = head_dim;
  p.theta = llama3 ? 500000.0 : 10000.0;
  if (llama3) {  // Llama 3.1's config
    p.llama3 = true;
    p.factor = 8.0;
    p.low_freq_factor = 1.0;
    p.high_freq_factor = 4.0;
    p.original_max_position_embeddings = 8192.0;
  }
  return p;
}

// HF's inv_freq (and llama3's _compute_llama3_parameters), all in double.
double reference_inv_freq(const RopeFrequencyParams& p, int i) {
  double inv = 1.0 / std::pow(p.theta, 2.0 * i / p.head_dim);
  if (p.llama3) {
    const double wavelen = 2 * M_PI / inv;
    const double low = p.original_max_position_embeddings / p.low_freq_factor;
    const double high = p.original_max_position_embeddings / p.high_freq_factor;
    if (wavelen > low) {
      inv /= p.factor;
    } else if (wavelen >= high) {
      const double smooth = (p.original_max_position_embeddings / wavelen - p.low_freq_factor) /
                            (p.high_freq_factor - p.low_freq_factor);
      inv = (1 - smooth) * inv / p.factor + smooth * inv;
    }
  }
  return inv;
}

// The shared table (kernels/rope_frequencies.h) against the formula in double: fp32 rounding only.
TEST(Rope, SharedFrequencyTableMatchesTransformers) {
  for (int head_dim : {64, 128}) {
    for (bool llama3 : {false, true}) {
      const RopeFrequencyParams p = rope_params(head_dim, llama3);
      std::vector<float> table(head_dim / 2);
      ASSERT_TRUE(kernels::rope_inv_freqs(p, table.data()));
      for (int i = 0; i < head_dim / 2; ++i) {
        const double want = reference_inv_freq(p, i);
        EXPECT_NEAR(table[i], want, 2e-6 * want) << "head_dim " << head_dim << " llama3 " << llama3 << " i " << i;
      }
    }
  }
  RopeFrequencyParams bad = rope_params(64, true);
  bad.high_freq_factor = bad.low_freq_factor;
  EXPECT_FALSE(kernels::rope_frequencies_valid(bad));
  bad = rope_params(63, false);
  EXPECT_FALSE(kernels::rope_frequencies_valid(bad));
}

TEST(Rope, PlainAndLlama3OnFusedQkv) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int head_dim : {32, 64, 128}) {
      for (bool llama3 : {false, true}) {
        std::mt19937 rng(head_dim + llama3);
        const int tokens = 13, H = 6, KV = 2;
        const int64_t stride = static_cast<int64_t>(H + 2 * KV) * head_dim;  // fused QKV rows
        const RopeFrequencyParams p = rope_params(head_dim, llama3);
        std::vector<float> inv_freq(head_dim / 2);
        ASSERT_TRUE(kernels::rope_inv_freqs(p, inv_freq.data()));
        HostTensor qkv = HostTensor::random(dtype, tokens * stride, rng);
        std::vector<int32_t> pos(tokens);
        std::uniform_int_distribution<int> pd(0, 6000);
        for (auto& v : pos) v = pd(rng);
        pos[0] = 0;
        // The same table, the angle formed in fp32 as the kernels do, then cos/sin in double.
        std::vector<float> ref = qkv.values;
        const int half = head_dim / 2;
        for (int t = 0; t < tokens; ++t)
          for (int h = 0; h < H + KV; ++h)
            for (int i = 0; i < half; ++i) {
              const double ang = static_cast<float>(pos[t]) * inv_freq[i];
              const size_t a = t * stride + h * head_dim + i, b = a + half;
              ref[a] = static_cast<float>(qkv.values[a] * std::cos(ang) - qkv.values[b] * std::sin(ang));
              ref[b] = static_cast<float>(qkv.values[b] * std::cos(ang) + qkv.values[a] * std::sin(ang));
            }
        DeviceBuffer d_qkv, d_pos, d_inv;
        upload(d_qkv, qkv.bits);
        upload(d_pos, pos);
        upload(d_inv, inv_freq);
        uint16_t* q = d_qkv.as<uint16_t>();
        CUDA_OK(kernels::cuda::rope_inplace(dtype, q, q + H * head_dim, d_pos.as<int32_t>(), tokens, H, KV, head_dim,
                                            stride, stride, d_inv.as<float>(), nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_qkv, qkv.size()), dtype), ref), tolerance(dtype))
            << name(dtype) << " head_dim " << head_dim << " llama3 " << llama3;
        // The V columns are not RoPE's: untouched.
        const std::vector<uint16_t> out = download<uint16_t>(d_qkv, qkv.size());
        for (int t = 0; t < tokens; ++t)
          for (int64_t c = (H + KV) * head_dim; c < stride; ++c)
            ASSERT_EQ(out[t * stride + c], qkv.bits[t * stride + c]) << "V column " << c << " of token " << t;
      }
    }
  }
}

TEST(Rope, ReportsUnsupportedValuesByName) {
  EXPECT_NE(kernels::cuda::rope_unsupported(1, 4, 4, 63, 4 * 63, 4 * 63).find("head_dim"), std::string::npos);
  EXPECT_NE(kernels::cuda::rope_unsupported(1, 4, 4, 64, 4 * 64, 3 * 64).find("k_stride"), std::string::npos);
}

TEST(Activation, SiluMul) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int inter : {8, 111, 768, 5125}) {
      std::mt19937 rng(inter);
      const int tokens = 9;
      HostTensor gu = HostTensor::random(dtype, static_cast<size_t>(tokens) * 2 * inter, rng, -4.f, 4.f);
      std::vector<float> ref(static_cast<size_t>(tokens) * inter);
      for (int t = 0; t < tokens; ++t)
        for (int i = 0; i < inter; ++i) {
          const double g = gu.values[static_cast<size_t>(t) * 2 * inter + i];
          const double u = gu.values[static_cast<size_t>(t) * 2 * inter + inter + i];
          ref[static_cast<size_t>(t) * inter + i] = static_cast<float>(g / (1 + std::exp(-g)) * u);
        }
      DeviceBuffer d_gu, d_out(ref.size() * 2 + 16);
      upload(d_gu, gu.bits);
      poison(d_out);
      CUDA_OK(kernels::cuda::silu_mul(dtype, d_out.get(), d_gu.get(), tokens, inter, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_out, ref.size()), dtype), ref), tolerance(dtype) / 2)
          << name(dtype) << " inter " << inter;
    }
  }
}

TEST(Activation, BiasGeluErf) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int width : {8, 111, 1536, 3072}) {
      for (bool with_bias : {true, false}) {
        std::mt19937 rng(width + with_bias);
        const int tokens = 5;
        HostTensor x = HostTensor::random(dtype, static_cast<size_t>(tokens) * width, rng, -3.f, 3.f);
        HostTensor b = HostTensor::random(dtype, width, rng);
        std::vector<float> ref(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          const double v = x.values[i] + (with_bias ? b.values[i % width] : 0.f);
          ref[i] = static_cast<float>(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
        }
        DeviceBuffer d_x, d_b;
        upload(d_x, x.bits);
        upload(d_b, b.bits);
        CUDA_OK(kernels::cuda::bias_gelu(dtype, d_x.get(), with_bias ? d_b.get() : nullptr, tokens, width, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_x, x.size()), dtype), ref), tolerance(dtype) / 2)
            << name(dtype) << " width " << width;
      }
    }
  }
}

TEST(Embedding, GatherWithOutOfRangeIdsZeroed) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int hidden : {576, 111}) {
      std::mt19937 rng(hidden);
      const int vocab = 1000;
      HostTensor table = HostTensor::random(dtype, static_cast<size_t>(vocab) * hidden, rng);
      std::vector<int32_t> ids{0, 999, 17, 17, 500, -1, 1000, 3};
      DeviceBuffer d_table, d_ids, d_out(ids.size() * hidden * 2 + 16);
      upload(d_table, table.bits);
      upload(d_ids, ids);
      poison(d_out);
      CUDA_OK(kernels::cuda::embedding_gather(dtype, d_out.get(), d_table.get(), d_ids.as<int32_t>(),
                                              static_cast<int>(ids.size()), hidden, vocab, nullptr,
                                              /*accumulate=*/false));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> out = download<uint16_t>(d_out, ids.size() * hidden);
      for (size_t t = 0; t < ids.size(); ++t)
        for (int i = 0; i < hidden; ++i) {
          const bool valid = ids[t] >= 0 && ids[t] < vocab;
          const uint16_t want = valid ? table.bits[static_cast<size_t>(ids[t]) * hidden + i] : to_bits(0.f, dtype);
          ASSERT_EQ(out[t * hidden + i], want) << "token " << t << " elem " << i;
        }
    }
  }
}

TEST(Embedding, AccumulateAddsRowsInFp32) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int hidden : {384, 111}) {
      std::mt19937 rng(hidden + 7);
      const int vocab = 512;
      HostTensor table = HostTensor::random(dtype, static_cast<size_t>(vocab) * hidden, rng);
      std::vector<int32_t> ids{0, 511, 17, 17, 300, -1, 512, 3};
      HostTensor base = HostTensor::random(dtype, ids.size() * hidden, rng, -2.f, 2.f);
      DeviceBuffer d_table, d_ids, d_out;
      upload(d_table, table.bits);
      upload(d_ids, ids);
      upload(d_out, base.bits);
      CUDA_OK(kernels::cuda::embedding_gather(dtype, d_out.get(), d_table.get(), d_ids.as<int32_t>(),
                                              static_cast<int>(ids.size()), hidden, vocab, nullptr,
                                              /*accumulate=*/true));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> out = download<uint16_t>(d_out, ids.size() * hidden);
      for (size_t t = 0; t < ids.size(); ++t)
        for (int i = 0; i < hidden; ++i) {
          const bool valid = ids[t] >= 0 && ids[t] < vocab;
          const size_t o = t * hidden + i;
          // Invalid ids add nothing; valid ones add in fp32 and round once.
          const uint16_t want = valid ? to_bits(base.values[o] + table.values[static_cast<size_t>(ids[t]) * hidden + i],
                                                dtype)
                                      : base.bits[o];
          ASSERT_EQ(out[o], want) << name(dtype) << " hidden " << hidden << " token " << t << " elem " << i;
        }
    }
  }
}

}  // namespace
}  // namespace tessera::gpu_test
