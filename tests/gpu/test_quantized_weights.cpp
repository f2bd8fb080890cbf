// tests/gpu/test_quantized_weights.cpp: int8, int4_g128 and fp8_e4m3 weights. Quantization is
// checked against its error bound (rows of magnitudes 2^-13 .. 2^1; int4's fp16 scale and minimum
// against each group's own range), the device dequantization against a host decoding of the same
// bytes (written here from the format's description), and the decode GEMV against x · dequant(w)ᵀ in
// fp64, with awkward n, k with and without a partial last step, an int4 row whose last group is
// short (k = 576), m = 1..8, and bias on and off. The W8A8 path of int8 and fp8_e4m3 above 8 rows
// (activations quantized per row, the int8 or FP8 tensor-core GEMM) against the same product of the
// quantized values it multiplies, and against the unquantized product.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm/gemm.h"
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

// The scales region as fp32: int8 / fp8_e4m3 store an fp32 scale per row, int4_g128 bf16 scales,
// then bf16 minimums, each [groups, n] and 16-byte aligned.
std::vector<float> stored_scales(WeightFormat format, const std::vector<uint8_t>& bytes, int n, int k) {
  const size_t data = kc::quantized_data_bytes(format, n, k);
  const uint8_t* region = bytes.data() + ((data + 15) & ~size_t{15});
  const size_t width = format == WeightFormat::kInt4G128 ? sizeof(uint16_t) : sizeof(float);
  std::vector<float> scales(kc::quantized_scale_bytes(format, n, k) / width);
  for (size_t i = 0; i < scales.size(); ++i) {
    if (width == sizeof(float)) {
      std::memcpy(&scales[i], region + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, region + 2 * i, 2);
      scales[i] = from_bits(bits, DType::kBF16);
    }
  }
  return scales;
}

// Where int4_g128 keeps the scale and the minimum of (row r, group g) in stored_scales().
size_t int4_scale_index(int r, int g, int n) { return static_cast<size_t>(g) * n + r; }
size_t int4_min_index(int r, int g, int n, int groups) {
  return (static_cast<size_t>(groups) * n * 2 + 15) / 16 * 8 + int4_scale_index(r, g, n);
}

Decoded decode(WeightFormat format, const std::vector<uint8_t>& bytes, int n, int k) {
  const std::vector<float> scales = stored_scales(format, bytes, n, k);
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
          // The header's layout: 16 x 64 atoms of 128 words, a row tile's atoms together.
          const size_t atoms = (k + 63) / 64, lane = 4 * (r % 8) + (e % 8) / 2;
          const size_t word = ((r / 16) * atoms + e / 64) * 128 + 4 * lane + (e % 64) / 16;
          const int nibble = (r % 16) / 8 + 4 * (e % 2) + 2 * ((e % 16) / 8);
          uint32_t bits;
          std::memcpy(&bits, bytes.data() + 4 * word, 4);
          const int q = static_cast<int>((bits >> (4 * nibble)) & 0xF);
          const float scale = scales[int4_scale_index(r, e / 128, n)];
          const float minimum = scales[int4_min_index(r, e / 128, n, groups)];
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
      // Rows of magnitudes 2^-13 .. 2^1, and a zero; a row's extremes must survive too.
      for (int r = 0; r < n; ++r)
        for (int e = 0; e < k; ++e) {
          const size_t i = static_cast<size_t>(r) * k + e;
          w.set(i, std::ldexp(w.values[i], r % 15 - 13));
        }
      w.set(0, 0.f);
      DeviceBuffer q;
      const std::vector<uint8_t> bytes = quantize_on_device(format, w, n, k, q);
      const Decoded d = decode(format, bytes, n, k);
      if (format == WeightFormat::kInt4G128) {
        // Each group's bf16 minimum at or just below its smallest weight, and its scale at or just
        // above (max - stored min) / 15, so the grid spans the group: within bf16's rounding of the
        // values (2^-7 relative at most).
        const std::vector<float> scales = stored_scales(format, bytes, n, k);
        const int groups = (k + 127) / 128;
        size_t off = 0;
        for (int r = 0; r < n; ++r)
          for (int g = 0; g < groups; ++g) {
            float lo = INFINITY, hi = -INFINITY;
            for (int e = g * 128; e < std::min(k, g * 128 + 128); ++e) {
              lo = std::min(lo, w.values[static_cast<size_t>(r) * k + e]);
              hi = std::max(hi, w.values[static_cast<size_t>(r) * k + e]);
            }
            const float scale = scales[int4_scale_index(r, g, n)];
            const float minimum = scales[int4_min_index(r, g, n, groups)];
            const bool ok = minimum <= lo && minimum >= lo - std::ldexp(std::fabs(lo), -7) &&
                            scale * 15 >= (hi - minimum) * (1 - 1e-6f) &&
                            scale <= (hi - minimum) / 15 * (1 + std::ldexp(1.f, -7));
            off += !ok;
          }
        EXPECT_EQ(off, 0u) << "n" << n << " k" << k << ": groups whose bf16 scale or minimum is off their range";
      }
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
          // m = 8 runs on both kernels: tensor-core (int8 and fp8 as fastest; int4_g128 always), and
          // row-streaming when asked for the same bits at any m.
          for (kc::GemvRowBits row_bits : {kc::GemvRowBits::kFastest, kc::GemvRowBits::kSameAtAnyM}) {
            if (m != kc::kGemvMaxM && row_bits == kc::GemvRowBits::kSameAtAnyM) continue;
            // y has a poisoned margin past its end, where nothing may be written.
            constexpr size_t kMargin = 64;
            DeviceBuffer d_x, d_y((ref.size() + kMargin) * 2);
            upload(d_x, x.bits);
            poison(d_y);
            ASSERT_TRUE(kc::quantized_gemv_supported(format, m, n, k, d_x.get(), q.get()));
            ASSERT_EQ(kc::quantized_gemv(DType::kBF16, format, d_y.get(), d_x.get(), q.get(),
                                         with_bias ? d_bias.get() : nullptr, m, n, k, row_bits, nullptr),
                      cudaSuccess);
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<uint16_t> out = download<uint16_t>(d_y, ref.size() + kMargin);
            size_t written_past_end = 0;
            for (size_t i = ref.size(); i < out.size(); ++i) written_past_end += out[i] != 0xFFFF;
            out.resize(ref.size());
            // One bf16 rounding of each output (fp32 accumulation of exact products otherwise).
            EXPECT_LE(normalized_error(to_floats(out, DType::kBF16), ref), tolerance(DType::kBF16) / 2)
                << kc::weight_format_name(format) << " m" << m << " n" << n << " k" << k << " bias " << with_bias
                << " same bits at any m " << (row_bits == kc::GemvRowBits::kSameAtAnyM);
            EXPECT_EQ(written_past_end, 0u) << kc::weight_format_name(format) << " m" << m << " n" << n << " k" << k;
          }
        }
      }
    }
  }
}

// Asked for the same bits at any m, a row of x gets the same output bits alone as among up to 8 rows,
// and those are the bits the fastest setting gives it alone (what a speculative verify needs), from
// the plain GEMV and the SiLU·mul epilogue, in every format.
TEST(QuantizedWeights, GemvRowsAreTheSameBitsAtAnyMWhenAsked) {
  TESSERA_REQUIRE_GPU();
  const int n = 4098, k = 11008;
  for (WeightFormat format : kFormats) {
    std::mt19937 rng(static_cast<int>(format) + 5);
    HostTensor w = HostTensor::random(DType::kBF16, static_cast<size_t>(n) * k, rng);
    HostTensor x = HostTensor::random(DType::kBF16, static_cast<size_t>(kc::kGemvMaxM) * k, rng);
    DeviceBuffer q, d_x, d_y(static_cast<size_t>(kc::kGemvMaxM) * n * 2);
    quantize_on_device(format, w, n, k, q);
    upload(d_x, x.bits);
    for (bool silu_mul : {false, true}) {
      auto rows_of = [&](int m, kc::GemvRowBits bits = kc::GemvRowBits::kSameAtAnyM) -> std::vector<uint16_t> {
        poison(d_y);
        const cudaError_t status =
            silu_mul ? kc::quantized_gemv_silu_mul(DType::kBF16, format, d_y.get(), d_x.get(), q.get(), m, n, k, bits,
                                                   nullptr)
                     : kc::quantized_gemv(DType::kBF16, format, d_y.get(), d_x.get(), q.get(), nullptr, m, n, k, bits,
                                          nullptr);
        EXPECT_EQ(status, cudaSuccess);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return download<uint16_t>(d_y, static_cast<size_t>(m) * (silu_mul ? n / 2 : n));
      };
      const std::vector<uint16_t> all = rows_of(kc::kGemvMaxM);
      for (int m : {1, 3, 5}) {
        const std::vector<uint16_t> some = rows_of(m);
        EXPECT_TRUE(std::equal(some.begin(), some.end(), all.begin()))
            << kc::weight_format_name(format) << " silu_mul " << silu_mul << ": the first " << m
            << " rows differ from a batch of 8";
      }
      const std::vector<uint16_t> alone = rows_of(1, kc::GemvRowBits::kFastest);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin()))
          << kc::weight_format_name(format) << " silu_mul " << silu_mul
          << ": a row alone, fastest, differs from its bits in 8";
    }
  }
}

// e4m3 rounding of v (round to nearest even, saturating at 448), as __nv_cvt_float_to_fp8 does with
// __NV_SATFINITE: 3 mantissa bits above 2^-6, steps of 2^-9 below.
float round_to_e4m3(float v) {
  const float magnitude = std::fabs(v);
  if (magnitude >= 448.f) return std::copysign(448.f, v);
  const int binade = magnitude < std::ldexp(1.f, -6) ? -6 : std::ilogb(magnitude);
  const float step = std::ldexp(1.f, binade - 3);
  return std::copysign(std::min(std::nearbyint(magnitude / step) * step, 448.f), v);
}

// The host's rounding of v to the format's grid (v already divided by the row's scale).
float round_to_grid(WeightFormat format, float v) {
  return format == WeightFormat::kInt8 ? std::clamp(std::nearbyint(v), -127.f, 127.f) : round_to_e4m3(v);
}

const WeightFormat kW8a8Formats[] = {WeightFormat::kInt8, WeightFormat::kFp8E4M3};

TEST(QuantizedWeights, ActivationsQuantizeAsTheWeightsDo) {
  TESSERA_REQUIRE_GPU();
  for (WeightFormat format : kW8a8Formats) {
    const float largest = format == WeightFormat::kInt8 ? 127.f : 448.f;
    // The rows' scales spread over 2^-6 .. 2^6, so a per-row scale is needed and exercised.
    for (auto [m, k] : {std::tuple{9, 160}, std::tuple{100, 4096}, std::tuple{513, 336}}) {
      std::mt19937 rng(m * 7 + k);
      HostTensor x = HostTensor::random(DType::kBF16, static_cast<size_t>(m) * k, rng);
      for (int r = 0; r < m; ++r)
        for (int e = 0; e < k; ++e) {
          const size_t i = static_cast<size_t>(r) * k + e;
          x.set(i, x.values[i] * std::ldexp(1.f, r % 13 - 6));
        }
      DeviceBuffer d_x, q(kc::quantized_weight_bytes(format, m, k));
      upload(d_x, x.bits);
      ASSERT_EQ(kc::quantize_activations(DType::kBF16, format, d_x.get(), m, k, q.get(), nullptr), cudaSuccess);
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint8_t> bytes = download<uint8_t>(q, q.bytes());
      const Decoded d = decode(format, bytes, m, k);
      size_t off_host = 0;
      double worst = 0;
      for (int r = 0; r < m; ++r) {
        float absmax = 0;
        for (int e = 0; e < k; ++e) absmax = std::max(absmax, std::fabs(x.values[static_cast<size_t>(r) * k + e]));
        const float scale = absmax / largest, inverse = 1.f / scale;
        for (int e = 0; e < k; ++e) {
          const size_t i = static_cast<size_t>(r) * k + e;
          worst = std::max<double>(worst, std::fabs(d.w[i] - x.values[i]) / d.step[i]);
          off_host += d.w[i] != round_to_grid(format, x.values[i] * inverse) * scale;
        }
      }
      const char* name = kc::weight_format_name(format);
      EXPECT_LE(worst, 0.5 + 1e-3) << name << " m" << m << " k" << k;
      EXPECT_EQ(off_host, 0u) << name << " m" << m << " k" << k << ": the device's values differ from the host's rounding";
    }
    DeviceBuffer x(64), out(4096);
    EXPECT_EQ(kc::quantize_activations(DType::kBF16, format, x.get(), 4, 24, out.get(), nullptr), cudaErrorInvalidValue);
  }
  DeviceBuffer x(64), out(4096);
  EXPECT_EQ(kc::quantize_activations(DType::kBF16, WeightFormat::kInt4G128, x.get(), 4, 32, out.get(), nullptr),
            cudaErrorInvalidValue);
}

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias) in fp64, rounded once to fp32: the GEMM tests' reference.
std::vector<float> reference_product(const std::vector<float>& x, const std::vector<float>& w,
                                     const std::vector<float>* bias, int m, int n, int k) {
  std::vector<float> y(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double a = bias != nullptr ? (*bias)[j] : 0.0;
      for (int t = 0; t < k; ++t)
        a += static_cast<double>(x[static_cast<size_t>(i) * k + t]) * w[static_cast<size_t>(j) * k + t];
      y[static_cast<size_t>(i) * n + j] = static_cast<float>(a);
    }
  return y;
}

// A GEMM test's weight: random [n, k] values in ±0.1 quantized on the device (q) and decoded on the
// host (dw), and a random bias (d_bias on the device).
struct QuantizedCase {
  QuantizedCase(WeightFormat format, int n, int k, std::mt19937& rng)
      : w(HostTensor::random(DType::kBF16, static_cast<size_t>(n) * k, rng, -0.1f, 0.1f)),
        bias(HostTensor::random(DType::kBF16, n, rng)) {
    dw = decode(format, quantize_on_device(format, w, n, k, q), n, k);
    upload(d_bias, bias.bits);
  }
  HostTensor w, bias;
  DeviceBuffer q, d_bias;
  Decoded dw;
};

// A bf16 output of `count` values from a buffer poisoned with kMargin more: the values, and how many
// of the margin's were written (a GEMM must write none).
constexpr size_t kMargin = 64;
struct GemmOutput {
  std::vector<float> y;
  size_t written_past_end = 0;
};
GemmOutput download_output(const DeviceBuffer& d_y, size_t count) {
  std::vector<uint16_t> out = download<uint16_t>(d_y, count + kMargin);
  GemmOutput result;
  for (size_t i = count; i < out.size(); ++i) result.written_past_end += out[i] != 0xFFFF;
  out.resize(count);
  result.y = to_floats(out, DType::kBF16);
  return result;
}

// The W8A8 GEMM at awkward shapes: m from just past the GEMV's 8 rows through the int8 kernel's
// two tile shapes (128 rows and fewer, more) and fp8's two kernels (64 rows and fewer on CUTLASS,
// more on cuBLASLt) to a prefill's 2048; n not a power of two (a multiple of
// 16, of 8 only, and odd); k a multiple of 16 (the formats' requirement) but not of 32 or a power of
// two. Against the fp64 product of the very quantized values it multiplies (int8: an exact int32
// sum, then one bf16 rounding of each output; e4m3: fp32 accumulation; both within half the bf16
// tolerance), and against the unquantized bf16 product (int8: 127 steps a row, ~1% together; e4m3:
// both operands rounded to 3 mantissa bits, ~4% together; bound 6%). A shape whose n is a multiple
// of 16 must run on the tensor cores; for the others a kernel may refuse (cudaErrorNotSupported,
// the caller's bf16 fallback: int8's for n not a multiple of 8), which is reported.
TEST(QuantizedWeights, W8a8GemmMatchesTheQuantizedProductAndStaysNearBf16) {
  TESSERA_REQUIRE_GPU();
  kc::GemmRunner runner;
  CUDA_OK(runner.init());
  const std::vector<std::pair<int, int>> shapes = {{304, 336}, {200, 1040}, {77, 160}};
  for (WeightFormat format : kW8a8Formats) {
    const char* name = kc::weight_format_name(format);
    double worst_exact = 0, worst_bf16 = 0;
    for (auto [n, k] : shapes) {
      std::mt19937 rng(n * 3 + k);
      const QuantizedCase c(format, n, k, rng);
      for (int m : {9, 17, 64, 65, 100, 128, 129, 513, 2048}) {
        const bool with_bias = m % 2 == 1;
        HostTensor x = HostTensor::random(DType::kBF16, static_cast<size_t>(m) * k, rng, -2.f, 2.f);
        DeviceBuffer d_x, xq(kc::quantized_weight_bytes(format, m, k));
        upload(d_x, x.bits);
        ASSERT_EQ(kc::quantize_activations(DType::kBF16, format, d_x.get(), m, k, xq.get(), nullptr), cudaSuccess);
        DeviceBuffer d_y((static_cast<size_t>(m) * n + kMargin) * 2);
        poison(d_y);
        const cudaError_t e =
            runner.run_w8a8(format, d_y.get(), xq.get(), kc::quantized_row_scales(format, xq.get(), m, k), c.q.get(),
                            kc::quantized_row_scales(format, c.q.get(), n, k), with_bias ? c.d_bias.get() : nullptr, m,
                            n, k, nullptr);
        if (e == cudaErrorNotSupported && n % 16 != 0) {
          std::printf("[quantized-weights] %s W8A8 m%d n%d k%d: %s (the backend expands the weight to bf16)\n", name, m,
                      n, k, runner.last_error().c_str());
          continue;
        }
        ASSERT_EQ(e, cudaSuccess) << name << " m" << m << " n" << n << " k" << k << ": " << runner.last_error();
        CUDA_OK(cudaDeviceSynchronize());
        const Decoded dx = decode(format, download<uint8_t>(xq, xq.bytes()), m, k);
        const std::vector<float>* b = with_bias ? &c.bias.values : nullptr;
        const std::vector<float> exact = reference_product(dx.w, c.dw.w, b, m, n, k);
        const std::vector<float> unquantized = reference_product(x.values, c.w.values, b, m, n, k);
        const auto [y, written_past_end] = download_output(d_y, exact.size());
        const double err_exact = normalized_error(y, exact), err_bf16 = normalized_error(y, unquantized);
        const std::string what = std::string(name) + " m" + std::to_string(m) + " n" + std::to_string(n) + " k" +
                                 std::to_string(k) + (with_bias ? " with bias" : "");
        EXPECT_LE(err_exact, tolerance(DType::kBF16) / 2) << what;
        EXPECT_LE(err_bf16, 0.06) << what;
        EXPECT_EQ(written_past_end, 0u) << what;
        worst_exact = std::max(worst_exact, err_exact);
        worst_bf16 = std::max(worst_bf16, err_bf16);
      }
    }
    std::printf("[quantized-weights] %s W8A8 GEMM: worst rel L2 %.3g to the quantized product, %.3g to the bf16 "
                "product\n", name, worst_exact, worst_bf16);
    // k not a multiple of 16 is refused (a weight of that shape is never int8 or fp8: the backend
    // refuses it at load).
    DeviceBuffer any(1 << 16);
    EXPECT_EQ(runner.run_w8a8(format, any.get(), any.get(), any.as<float>(), any.get(), any.as<float>(), nullptr, 16,
                              16, 24, nullptr),
              cudaErrorInvalidValue);
  }
}

// The int4_g128 mixed-input GEMM at awkward shapes: m from just past the GEMV's 8 rows to a
// prefill's 2048 (partial tiles of the transposed problem's N; stream-K up to 128 rows), k a
// multiple of 64 whose last group is short (448 = 3·128 + 64, 1088 = 8·128 + 64), n a multiple of 16
// but not of 128, and an n not a multiple of 16 and a k not of 64, which it refuses (the backend
// then expands the weight to bf16). Against the
// fp64 product of the host-decoded weights: the kernel expands each weight to bf16 (q · scale + min in
// bf16), so it is within bf16's rounding of the values, and writes nothing past y.
TEST(QuantizedWeights, Int4GemmMatchesTheDequantizedProduct) {
  TESSERA_REQUIRE_GPU();
  kc::GemmRunner runner;
  CUDA_OK(runner.init());
  constexpr WeightFormat kFormat = WeightFormat::kInt4G128;
  double worst = 0;
  for (auto [n, k] : {std::pair{304, 448}, std::pair{208, 1088}, std::pair{200, 192}, std::pair{64, 352}}) {
    std::mt19937 rng(n * 7 + k);
    const QuantizedCase c(kFormat, n, k, rng);
    for (int m : {9, 17, 63, 100, 129, 513, 2048}) {
      const bool with_bias = m % 2 == 1;
      HostTensor x = HostTensor::random(DType::kBF16, static_cast<size_t>(m) * k, rng, -2.f, 2.f);
      DeviceBuffer d_x;
      upload(d_x, x.bits);
      DeviceBuffer d_y((static_cast<size_t>(m) * n + kMargin) * 2);
      poison(d_y);
      const cudaError_t e =
          runner.run_int4_g128(d_y.get(), d_x.get(), c.q.get(), with_bias ? c.d_bias.get() : nullptr, m, n, k, nullptr);
      const std::string what = "m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k) +
                               (with_bias ? " with bias" : "");
      if (n % 16 != 0 || k % 64 != 0) {
        EXPECT_EQ(e, cudaErrorNotSupported) << what;
        continue;
      }
      ASSERT_EQ(e, cudaSuccess) << what << ": " << runner.last_error();
      CUDA_OK(cudaDeviceSynchronize());
      if (m == 2048 && n != 208) continue;  // one 2048-row case keeps the fp64 reference quick
      const std::vector<float> exact =
          reference_product(x.values, c.dw.w, with_bias ? &c.bias.values : nullptr, m, n, k);
      const auto [y, written_past_end] = download_output(d_y, exact.size());
      const double err = normalized_error(y, exact);
      EXPECT_LE(err, tolerance(DType::kBF16) / 2) << what;
      EXPECT_EQ(written_past_end, 0u) << what;
      worst = std::max(worst, err);
    }
  }
  std::printf("[quantized-weights] int4_g128 mixed-input GEMM: worst rel L2 %.3g to the dequantized product\n", worst);
}

TEST(QuantizedWeights, RefusesWhatItCannotHold) {
  TESSERA_REQUIRE_GPU();
  DeviceBuffer x(64 * 2), w(4096);
  EXPECT_EQ(kc::quantized_weight_bytes(WeightFormat::kInt4G128, 4, 48), 0u);  // k not a multiple of 32
  EXPECT_EQ(kc::quantized_weight_bytes(WeightFormat::kInt8, 4, 24), 0u);      // nor of 16
  EXPECT_FALSE(kc::quantized_gemv_supported(WeightFormat::kInt8, 9, 4, 32, x.get(), w.get()));  // m > 8
  EXPECT_EQ(kc::quantized_gemv(DType::kFP16, WeightFormat::kInt8, x.get(), x.get(), w.get(), nullptr, 1, 4, 32,
                               kc::GemvRowBits::kFastest, nullptr),
            cudaErrorInvalidValue);  // bf16 activations only
}

}  // namespace
}  // namespace tessera::gpu_test
