// tests/gpu/test_elementwise.cpp: RoPE (plain and llama3-scaled), SiLU-mul, bias+GELU and the
// embedding gather against CPU references, on vector and scalar paths.
#include "gpu_test_util.h"
#include "kernels/cuda/activation/activation.h"
#include "kernels/cuda/embedding/embedding.h"
#include "kernels/cuda/rope/rope.h"

namespace tessera::gpu_test {
namespace {

using kernels::cuda::RopeParams;
using kernels::cuda::RopeScaling;

// HF's inv_freq (and llama3's _compute_llama3_parameters), in double.
double reference_inv_freq(const RopeParams& p, int head_dim, int i) {
  double inv = 1.0 / std::pow(static_cast<double>(p.theta), 2.0 * i / head_dim);
  if (p.scaling == RopeScaling::kLlama3) {
    const double wavelen = 2 * M_PI / inv;
    const double low = p.original_max_position / static_cast<double>(p.low_freq_factor);
    const double high = p.original_max_position / static_cast<double>(p.high_freq_factor);
    if (wavelen > low) {
      inv /= p.factor;
    } else if (wavelen >= high) {
      const double smooth = (p.original_max_position / wavelen - p.low_freq_factor) /
                            (static_cast<double>(p.high_freq_factor) - p.low_freq_factor);
      inv = (1 - smooth) * inv / p.factor + smooth * inv;
    }
  }
  return inv;
}

TEST(Rope, PlainAndLlama3OnFusedQkv) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int head_dim : {32, 64, 128}) {
      for (RopeScaling scaling : {RopeScaling::kNone, RopeScaling::kLlama3}) {
        std::mt19937 rng(head_dim + static_cast<int>(scaling));
        const int tokens = 13, H = 6, KV = 2;
        const int64_t stride = static_cast<int64_t>(H + 2 * KV) * head_dim;  // fused QKV rows
        RopeParams p;
        p.theta = scaling == RopeScaling::kLlama3 ? 500000.f : 10000.f;
        p.scaling = scaling;
        HostTensor qkv = HostTensor::random(dtype, tokens * stride, rng);
        std::vector<int32_t> pos(tokens);
        std::uniform_int_distribution<int> pd(0, 6000);
        for (auto& v : pos) v = pd(rng);
        pos[0] = 0;
        std::vector<float> ref = qkv.values;
        const int half = head_dim / 2;
        for (int t = 0; t < tokens; ++t)
          for (int h = 0; h < H + KV; ++h)
            for (int i = 0; i < half; ++i) {
              const double ang = pos[t] * reference_inv_freq(p, head_dim, i);
              const size_t a = t * stride + h * head_dim + i, b = a + half;
              ref[a] = static_cast<float>(qkv.values[a] * std::cos(ang) - qkv.values[b] * std::sin(ang));
              ref[b] = static_cast<float>(qkv.values[b] * std::cos(ang) + qkv.values[a] * std::sin(ang));
            }
        DeviceBuffer d_qkv, d_pos;
        upload(d_qkv, qkv.bits);
        upload(d_pos, pos);
        uint16_t* q = d_qkv.as<uint16_t>();
        CUDA_OK(kernels::cuda::rope_inplace(dtype, q, q + H * head_dim, d_pos.as<int32_t>(), tokens, H, KV, head_dim,
                                            stride, stride, p, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_LE(normalized_error(to_floats(download<uint16_t>(d_qkv, qkv.size()), dtype), ref), tolerance(dtype))
            << name(dtype) << " head_dim " << head_dim << " scaling " << static_cast<int>(scaling);
      }
    }
  }
}

TEST(Rope, ReportsUnsupportedValuesByName) {
  RopeParams p;
  EXPECT_NE(kernels::cuda::rope_unsupported(1, 4, 4, 63, 4 * 63, 4 * 63, p).find("head_dim"), std::string::npos);
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
                                              static_cast<int>(ids.size()), hidden, vocab, nullptr));
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

}  // namespace
}  // namespace tessera::gpu_test
