// tests/gpu/test_quantized_weights.cpp: int8, int4_g128 and fp8_e4m3 weights. Quantization is
// checked against its error bound, the device dequantization against a host decoding of the same
// bytes (written here from the format's description), and the decode GEMV against x · dequant(w)ᵀ in
// fp64, with awkward n, k with and without a partial last step, an int4 row whose last group is
// short (k = 576), m = 1..8, and bias on and off.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm/quantized_weights.h"

namespace tessera::gpu_test {
namespace {

using kernels::cuda::WeightFormat;
namespace kc = kernels::cuda;

constexpr WeightFormat kFormats[] = {WeightFormat::kInt8, WeightFormat::kInt4G128, WeightFormat::kFp8E4M3};

float fp8_e4m3_to_float(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 3) & 0xF, mantissa = v & 7;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa) / 8.f, -6)
                                        : std::ldexp(1.f + static_cast<float>(mantissa) / 8.f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// The quantized buffer decoded on the host: w[n, k] as fp32, and each weight's step (the largest
// rounding error quantization may make on it).
struct Decoded {
  std::vector<float> w, step;
};

Decoded decode(WeightFormat format, const std::vector<uint8_t>& bytes, int n, int k) {
  const size_t data = kc::quantized_data_bytes(format, n, k);
  std::vector<float> scales(kc::quantized_scale_bytes(format, n, k) / sizeof(float));
  std::memcpy(scales.data(), bytes.data() + ((data + 15) & ~size_t{15}), scales.size() * sizeof(float));
  Decoded d{std::vector<float>(static_cast<size_t>(n) * k), std::vector<float>(static_cast<size_t>(n) * k)};
  const int groups = (k + 127) / 128;
  for (int r = 0; r < n; ++r) {
    for (int e = 0; e < k; ++e) {
      const size_t i = static_cast<size_t>(r) * k + e;
      switch (format) {
        case WeightFormat::kInt8:
          d.w[i] = static_cast<float>(static_cast<int8_t>(bytes[i])) * scales[r];
          d.step[i] = scales[r];
          break;
        case WeightFormat::kFp8E4M3:
          d.w[i] = fp8_e4m3_to_float(bytes[i]) * scales[r];
          // e4m3 keeps 3 mantissa bits: a step of 2^-3 of the value's binade, 2^-9 below 2^-6.
          d.step[i] = std::max(std::fabs(d.w[i]) / 8.f, std::ldexp(1.f, -9) * scales[r]);
          break;
        case WeightFormat::kInt4G128: {
          // The header's tiled layout: 16-row tiles, 64-wide units of 32 16-byte slots.
          const size_t tile = r / 16, j = e % 4, half = (r % 16) / 8;
          const size_t slot = 4 * (r % 8) + (e % 64) / 16;
          const size_t word = ((tile * groups * 2 + e / 64) * 32 + slot) * 4 + (e % 16) / 4;
          const size_t nibble = 2 * (j / 2) + half + 4 * (j % 2);
          uint32_t bits;
          std::memcpy(&bits, bytes.data() + 4 * word, 4);
          const int q = static_cast<int>((bits >> (4 * nibble)) & 0xF);
          const size_t quad = (tile * groups + e / 128) * 8 + r % 8;
          const float scale = scales[quad * 4 + 2 * half], minimum = scales[quad * 4 + 2 * half + 1];
          d.w[i] = static_cast<float>(q) * scale + minimum;
          d.step[i] = scale;
          break;
        }
      }
    }
  }
  return d;
}

std::vector<uint8_t> quantize_on_device(WeightFormat format, const HostTensor& w, int n, int k, DeviceBuffer& out) {
  DeviceBuffer d_w;
  upload(d_w, w.bits);
  const size_t bytes = kc::quantized_weight_bytes(format, n, k);
  out.allocate(bytes);
  EXPECT_EQ(kc::quantize_weight(DType::kBF16, d_w.get(), n, k, format, out.get(), nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return download<uint8_t>(out, bytes);
}

TEST(QuantizedWeights, QuantizationStaysWithinHalfAStepAndDequantizesAsTheHostDecodes) {
  TESSERA_REQUIRE_GPU();
  for (WeightFormat format : kFormats) {
    for (auto [n, k] : {std::tuple{1, 32}, std::tuple{37, 576}, std::tuple{5, 4096}, std::tuple{3, 160}}) {
      std::mt19937 rng(n * 131 + k);
      HostTensor w = HostTensor::random(DType::kBF16, static_cast<size_t>(n) * k, rng, -2.f, 3.f);
      w.set(0, 0.f);  // a zero and a row's extreme must both survive
      DeviceBuffer q;
      const Decoded d = decode(format, quantize_on_device(format, w, n, k, q), n, k);
      double worst = 0;
      for (size_t i = 0; i < d.w.size(); ++i) {
        const double err = std::fabs(d.w[i] - w.values[i]);
        worst = std::max(worst, err / d.step[i]);
      }
      // Half a step, plus fp32 rounding of scale arithmetic.
      EXPECT_LE(worst, 0.5 + 1e-3) << kc::weight_format_name(format) << " n" << n << " k" << k;
      DeviceBuffer back(static_cast<size_t>(n) * k * 2);
      ASSERT_EQ(kc::dequantize_weight(DType::kBF16, q.get(), n, k, format, back.get(), nullptr), cudaSuccess);
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> device = to_floats(download<uint16_t>(back, d.w.size()), DType::kBF16);
      // Equal to the host's decoding rounded to bf16, or one bf16 step off where the device fused
      // q · scale + min into one rounding.
      size_t mismatches = 0;
      for (size_t i = 0; i < d.w.size(); ++i) {
        // (A fused rounding differs by an fp32 step of q · scale, which near a cancellation to 0 is
        // more than a bf16 step of the result.)
        mismatches += std::fabs(device[i] - round_to(d.w[i], DType::kBF16)) >
                      std::ldexp(std::fabs(d.w[i]), -7) + 1e-5 * d.step[i];
      }
      EXPECT_EQ(mismatches, 0u) << kc::weight_format_name(format) << " n" << n << " k" << k;
    }
  }
}

TEST(QuantizedWeights, DecodeGemvMatchesTheDequantizedProduct) {
  TESSERA_REQUIRE_GPU();
  // k: 576 (int4's last group 64 wide; a single partial step), 4096 (whole steps), 11008 (a partial
  // last step; int4: 86 groups, more than one batch per warp, the last batch partial), 32 (one
  // vector; int4: half a 64-wide unit), 160 and 96 (int4: a last group of 32 or 96, a half-filled
  // last unit). n: 1, 17, 37, 300 and 4099 (not multiples of a block's rows nor of int4's 16-row
  // tiles), 16 (one whole tile).
  const std::vector<std::pair<int, int>> shapes = {{1, 32},    {37, 576}, {4099, 4096}, {37, 11008},
                                                   {300, 576}, {16, 160}, {17, 96}};
  for (WeightFormat format : kFormats) {
    for (auto [n, k] : shapes) {
      std::mt19937 rng(n + 7 * k + static_cast<int>(format));
      HostTensor w = HostTensor::random(DType::kBF16, static_cast<size_t>(n) * k, rng);
      HostTensor bias = HostTensor::random(DType::kBF16, n, rng);
      DeviceBuffer q, d_bias;
      const Decoded d = decode(format, quantize_on_device(format, w, n, k, q), n, k);
      upload(d_bias, bias.bits);
      for (int m = 1; m <= 8; ++m) {
        HostTensor x = HostTensor::random(DType::kBF16, static_cast<size_t>(m) * k, rng);
        for (bool with_bias : {false, true}) {
          std::vector<float> ref(static_cast<size_t>(m) * n);
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
              double acc = with_bias ? bias.values[j] : 0.0;
              for (int e = 0; e < k; ++e)
                acc += static_cast<double>(x.values[static_cast<size_t>(i) * k + e]) * d.w[static_cast<size_t>(j) * k + e];
              ref[static_cast<size_t>(i) * n + j] = static_cast<float>(acc);
            }
          // y has a poisoned margin past its end, where nothing may be written.
          constexpr size_t kMargin = 64;
          DeviceBuffer d_x, d_y((ref.size() + kMargin) * 2);
          upload(d_x, x.bits);
          poison(d_y);
          ASSERT_TRUE(kc::quantized_gemv_supported(format, m, n, k, d_x.get(), q.get()));
          ASSERT_EQ(kc::quantized_gemv(DType::kBF16, format, d_y.get(), d_x.get(), q.get(),
                                       with_bias ? d_bias.get() : nullptr, m, n, k, nullptr),
                    cudaSuccess);
          CUDA_OK(cudaDeviceSynchronize());
          std::vector<uint16_t> out = download<uint16_t>(d_y, ref.size() + kMargin);
          size_t written_past_end = 0;
          for (size_t i = ref.size(); i < out.size(); ++i) written_past_end += out[i] != 0xFFFF;
          out.resize(ref.size());
          // One bf16 rounding of each output (fp32 accumulation of exact products otherwise).
          EXPECT_LE(normalized_error(to_floats(out, DType::kBF16), ref), tolerance(DType::kBF16) / 2)
              << kc::weight_format_name(format) << " m" << m << " n" << n << " k" << k << " bias " << with_bias;
          EXPECT_EQ(written_past_end, 0u) << kc::weight_format_name(format) << " m" << m << " n" << n << " k" << k;
        }
      }
    }
  }
}

TEST(QuantizedWeights, RefusesWhatItCannotHold) {
  TESSERA_REQUIRE_GPU();
  DeviceBuffer x(64 * 2), w(4096);
  EXPECT_EQ(kc::quantized_weight_bytes(WeightFormat::kInt4G128, 4, 48), 0u);  // k not a multiple of 32
  EXPECT_EQ(kc::quantized_weight_bytes(WeightFormat::kInt8, 4, 24), 0u);      // nor of 16
  EXPECT_FALSE(kc::quantized_gemv_supported(WeightFormat::kInt8, 9, 4, 32, x.get(), w.get()));  // m > 8
  EXPECT_EQ(kc::quantized_gemv(DType::kFP16, WeightFormat::kInt8, x.get(), x.get(), w.get(), nullptr, 1, 4, 32,
                               nullptr),
            cudaErrorInvalidValue);  // bf16 activations only
}

}  // namespace
}  // namespace tessera::gpu_test
