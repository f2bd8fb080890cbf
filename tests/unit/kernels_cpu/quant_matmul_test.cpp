// tests/unit/kernels_cpu/quant_matmul_test.cpp: the CPU matmuls on weights in their storage format
// (kernels/cpu/quant/matmul.h) against the dequantized fp32 reference, with each SIMD path forced in
// turn (a path this CPU lacks is skipped), at awkward sizes: activation rows 1, 3, 17 (17: the tile
// remainders and, for fp16/bf16, the widen-and-GEMM path), in-features 32, 96, 4128 (one block, an
// odd block count, many blocks and a threaded split), out-features 1, 7, 300 (weight-tile tails;
// the interleaved formats take whole groups of 8 rows: 8, 16 and 296).
//
// The reference dequantizes the very same bytes with kernels/backend's convert_to_f32 (written
// separately from the kernels) and sums in double.
//
// The block formats run with 8- and 16-bit activations (q8_rows.h), each with each SIMD path.
//
// Tolerance. For fp16 / bf16 only fp32 summation error: (k / 8 + 16) ulps of sum |w x| (8-lane
// partial sums, then a horizontal sum). For the block formats the activations are quantized: each
// value of a block moves by at most half a step, d / 2 with d = max|x_block| / 127 (8-bit) or
// max|x_block| / 32512 (16-bit), so
//   |y - y_ref| <= sum_i |w_i| * d_block(i) / 2            (worst case, every error aligned)
// plus the same fp32 summation term. That bound holds for every output; it is loose (errors of
// independent roundings cancel), so each case also checks the RMS error over its outputs against
// the RMS the rounding model predicts, sqrt(sum_i w_i^2 d_i^2 / 12), with a factor 2 of margin (cases
// of 32 outputs or more): a wrong scale or a dropped term shows there long before it breaks the worst
// case. 16-bit activations have a 256x finer step, so a dropped low digit breaks even the worst case.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend/weight_view.h"
#include "kernels/cpu/quant/matmul.h"

namespace tessera::kernels::cpu {
namespace {

// fp16 bits of a float that fp16 holds exactly (the test picks such scales).
uint16_t exact_f16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  if (v == 0.0f) return static_cast<uint16_t>(sign);
  EXPECT_GT(exponent, 0);
  EXPECT_LT(exponent, 31);
  EXPECT_EQ(bits & 0x1fffu, 0u) << v << " is not an fp16 value";
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) | ((bits >> 13) & 0x3ffu));
}

void put_u16(std::vector<std::byte>& out, uint16_t v) {
  out.push_back(static_cast<std::byte>(v & 0xff));
  out.push_back(static_cast<std::byte>(v >> 8));
}

// n rows of k values in `format`, random quants (the full range: Q8_0 includes -128) and random
// scales that fp16 holds exactly (j * 2^-12, so products stay well inside fp32).
std::vector<std::byte> random_weights(WeightFormat format, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), scale(1, 120), sign(0, 1);
  auto random_scale = [&](bool allow_negative) {
    const float v = static_cast<float>(scale(rng)) * std::ldexp(1.0f, -12);
    return exact_f16(allow_negative && sign(rng) ? -v : v);
  };
  std::vector<std::byte> out;
  for (int64_t j = 0; j < n; ++j) {
    if (format == WeightFormat::kF16 || format == WeightFormat::kBF16) {
      std::normal_distribution<float> normal(0.0f, 0.05f);
      for (int64_t i = 0; i < k; ++i) {
        float v = normal(rng);
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        if (format == WeightFormat::kBF16) {
          put_u16(out, static_cast<uint16_t>(bits >> 16));  // any truncation is a valid bf16
        } else {
          bits &= ~0x1fffu;  // drop the bits fp16 lacks
          std::memcpy(&v, &bits, sizeof v);
          put_u16(out, std::fabs(v) < 6.2e-5f ? uint16_t{0} : exact_f16(v));
        }
      }
      continue;
    }
    for (int64_t b = 0; b < k / 32; ++b) {
      put_u16(out, random_scale(true));
      if (format == WeightFormat::kQ4_1) put_u16(out, random_scale(true));  // the minimum
      const int quant_bytes = format == WeightFormat::kQ8_0 ? 32 : 16;
      for (int i = 0; i < quant_bytes; ++i) out.push_back(static_cast<std::byte>(byte(rng)));
    }
  }
  return out;
}

// The weights a kernel reads: the interleaved formats get the row format's bytes rearranged.
std::vector<std::byte> stored(WeightFormat format, const std::vector<std::byte>& rows, int64_t n, int64_t k) {
  if (!is_interleaved_format(format)) return rows;
  std::vector<std::byte> out(rows.size());
  EXPECT_TRUE(interleave_rows(row_format(format), rows.data(), n, k, out.data()));
  return out;
}

DType dtype_of(WeightFormat f) {
  f = row_format(f);
  switch (f) {
    case WeightFormat::kF32: return DType::kF32;
    case WeightFormat::kF16: return DType::kF16;
    case WeightFormat::kBF16: return DType::kBF16;
    case WeightFormat::kQ8_0: return DType::kQ8_0;
    case WeightFormat::kQ4_0: return DType::kQ4_0;
    case WeightFormat::kQ4_1: return DType::kQ4_1;
    default: break;
  }
  return DType::kF32;
}

struct Case {
  WeightFormat format;
  Isa isa;
  ActivationBits bits;  // block formats only (fp16 / bf16 ignore it: one case each)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = std::string(weight_format_name(info.param.format)) + "_" + isa_name(info.param.isa);
  if (is_block_format(info.param.format)) name += "_a" + std::to_string(static_cast<int>(info.param.bits));
  return name;
}

double activation_levels(ActivationBits bits) { return bits == ActivationBits::k16 ? 32512.0 : 127.0; }

class QuantMatmul : public ::testing::TestWithParam<Case> {};

TEST_P(QuantMatmul, MatchesDequantizedReferenceAtAwkwardSizes) {
  const auto [format, isa, bits] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << "this CPU has no " << isa_name(isa);
  const bool quantized = is_block_format(format);
  std::vector<int64_t> ks{32, 96, 4096 + 32};
  if (!quantized) ks.push_back(100);  // fp16 / bf16 take any width: a tail of 4 after 8-lane steps
  uint32_t seed = 1;
  const std::vector<int64_t> ns = is_interleaved_format(format) ? std::vector<int64_t>{8, 16, 296}
                                                                 : std::vector<int64_t>{1, 7, 300};
  for (int64_t m : {1, 3, 17}) {
    for (int64_t k : ks) {
      for (int64_t n : ns) {
        SCOPED_TRACE("m " + std::to_string(m) + ", k " + std::to_string(k) + ", n " + std::to_string(n));
        const std::vector<std::byte> rows = random_weights(row_format(format), n, k, ++seed);
        std::vector<float> wf(static_cast<size_t>(n * k));
        convert_to_f32(dtype_of(format), rows.data(), n * k, wf.data());
        const std::vector<std::byte> w = stored(format, rows, n, k);
        std::mt19937 rng(++seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(m * k)), bias(static_cast<size_t>(n));
        for (float& v : x) v = normal(rng);
        for (float& v : bias) v = normal(rng);
        // Every fourth row carries an outlier, as real activations do: its blocks get a coarse step.
        for (int64_t r = 0; r < m; r += 4) x[r * k + (r * 7) % k] = 40.0f;
        std::vector<float> y(static_cast<size_t>(m * n), NAN);
        ASSERT_EQ(linear_on(isa, format, w.data(), x.data(), bias.data(), y.data(), m, n, k, bits), Status::kOk);

        double sq_err = 0.0, sq_predicted = 0.0;
        for (int64_t r = 0; r < m; ++r) {
          const float* xr = x.data() + r * k;
          std::vector<double> half_step(static_cast<size_t>(k), 0.0);
          if (quantized) {
            for (int64_t b = 0; b < k / 32; ++b) {
              double amax = 0.0;
              for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(xr[b * 32 + i])));
              for (int i = 0; i < 32; ++i) half_step[b * 32 + i] = amax / activation_levels(bits) / 2.0;
            }
          }
          for (int64_t j = 0; j < n; ++j) {
            const float* wj = wf.data() + j * k;
            double ref = bias[j], abs_sum = std::fabs(bias[j]), quant_bound = 0.0, variance = 0.0;
            for (int64_t i = 0; i < k; ++i) {
              ref += static_cast<double>(wj[i]) * xr[i];
              abs_sum += std::fabs(static_cast<double>(wj[i]) * xr[i]);
              quant_bound += std::fabs(wj[i]) * half_step[i];
              variance += static_cast<double>(wj[i]) * wj[i] * half_step[i] * half_step[i] * 4.0 / 12.0;
            }
            const double float_bound = (static_cast<double>(k) / 8.0 + 16.0) * 1.2e-7 * (abs_sum + quant_bound);
            const double err = std::fabs(static_cast<double>(y[r * n + j]) - ref);
            ASSERT_LE(err, quant_bound * 1.001 + float_bound) << "row " << r << ", output " << j << ": got "
                                                              << y[r * n + j] << ", reference " << ref;
            sq_err += err * err;
            sq_predicted += variance + float_bound * float_bound;
          }
        }
        // An RMS needs a sample: below 32 outputs one output can carry it (16-bit q8_0x8, m 3, n 8: one
        // 3-sigma output of the outlier row's block put the ratio at 2.3; 8-bit small cases reach 1.9).
        if (m * n >= 32) {
          EXPECT_LE(std::sqrt(sq_err), 2.0 * std::sqrt(sq_predicted)) << "RMS error above what rounding explains";
        }
      }
    }
  }
}

// A row's output does not depend on the rows batched with it (bitwise), so batched greedy decoding
// equals solo decoding. (fp16 / bf16 from 8 rows on go through OpenBLAS, whose blocking differs from
// the register kernels: 7 rows stay on the kernels.)
TEST_P(QuantMatmul, RowResultsDoNotDependOnTheBatch) {
  const auto [format, isa, bits] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << "this CPU has no " << isa_name(isa);
  // Interleaved formats: 11 rows meet the 8-, 3- and (on AVX2) 4-row tiles.
  const int64_t m = is_interleaved_format(format) ? 11 : 7, n = is_interleaved_format(format) ? 304 : 301, k = 576;
  const std::vector<std::byte> w = stored(format, random_weights(row_format(format), n, k, 7), n, k);
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k)), batched(static_cast<size_t>(m * n)), solo(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  ASSERT_EQ(linear_on(isa, format, w.data(), x.data(), nullptr, batched.data(), m, n, k, bits), Status::kOk);
  for (int64_t r = 0; r < m; ++r) {
    ASSERT_EQ(linear_on(isa, format, w.data(), x.data() + r * k, nullptr, solo.data(), 1, n, k, bits), Status::kOk);
    EXPECT_EQ(std::memcmp(solo.data(), batched.data() + r * n, sizeof(float) * n), 0) << "row " << r;
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (WeightFormat f : {WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1, WeightFormat::kQ8_0x8,
                         WeightFormat::kQ4_0x8, WeightFormat::kQ4_1x8, WeightFormat::kF16, WeightFormat::kBF16}) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni}) {
      cases.push_back({f, isa, ActivationBits::k8});
      if (is_block_format(f)) cases.push_back({f, isa, ActivationBits::k16});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(FormatsAndIsas, QuantMatmul, ::testing::ValuesIn(all_cases()), case_name);

TEST(QuantMatmul, RejectsWidthsThatAreNotWholeBlocks) {
  std::vector<std::byte> w(64);
  std::vector<float> x(40), y(1);
  EXPECT_EQ(linear(WeightFormat::kQ8_0, w.data(), x.data(), nullptr, y.data(), 1, 1, 40, ActivationBits::k16),
            Status::kInvalidShape);
  EXPECT_EQ(linear(WeightFormat::kQ4_1, w.data(), x.data(), nullptr, y.data(), 0, 1, 32, ActivationBits::k16),
            Status::kInvalidShape);
  EXPECT_EQ(linear(WeightFormat::kQ4_1, w.data(), x.data(), nullptr, y.data(), 1, 1, 32, static_cast<ActivationBits>(12)),
            Status::kInvalidArgument);
}

TEST(QuantMatmul, BestIsaIsSupported) { EXPECT_TRUE(isa_supported(best_isa())) << isa_name(best_isa()); }

// The interleaved formats' groups are undone row by row, every lane of a group included.
TEST(EmbeddingGatherRows, DequantizesTheGatheredRows) {
  for (WeightFormat f : {WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1, WeightFormat::kQ8_0x8,
                         WeightFormat::kQ4_0x8, WeightFormat::kQ4_1x8, WeightFormat::kF16, WeightFormat::kBF16}) {
    const int64_t vocab = is_interleaved_format(f) ? 16 : 5, dim = 64;
    const std::vector<std::byte> rows = random_weights(row_format(f), vocab, dim, 99);
    const std::vector<std::byte> table = stored(f, rows, vocab, dim);
    std::vector<float> ref(static_cast<size_t>(vocab * dim));
    convert_to_f32(dtype_of(f), rows.data(), vocab * dim, ref.data());
    const std::vector<int32_t> ids = is_interleaved_format(f) ? std::vector<int32_t>{4, 0, 15, 9, 4}
                                                              : std::vector<int32_t>{4, 0, 4};
    std::vector<float> out(ids.size() * dim, 1.0f);
    ASSERT_EQ(embedding_gather_rows(f, ids.data(), table.data(), out.data(), static_cast<int64_t>(ids.size()), vocab,
                                    dim, true),
              Status::kOk);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(out[i * dim + j], 1.0f + ref[ids[i] * dim + j]) << weight_format_name(f);
    }
    const std::vector<int32_t> bad{static_cast<int32_t>(vocab)};
    EXPECT_EQ(embedding_gather_rows(f, bad.data(), table.data(), out.data(), 1, vocab, dim, false),
              Status::kInvalidArgument);
  }
}

}  // namespace
}  // namespace tessera::kernels::cpu
