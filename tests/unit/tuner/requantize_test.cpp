// tests/unit/tuner/requantize_test.cpp: the requantize step behind a profile's weight_format: each
// format's round trip error against its reference rounding, at awkward row counts, and which tensors
// a store conversion touches.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "kernels/backend/weight_view.h"
#include "models/weights/requantize.h"

namespace tessera {
namespace {

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Max |x - dequant(quant(x))| relative to max |x| of the row.
double round_trip_error(DType format, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<std::byte> q(dtype_row_bytes(format, n));
  quantize_row(format, x.data(), n, q.data());
  std::vector<float> back(x.size());
  convert_to_f32(format, q.data(), n, back.data());
  double err = 0, amax = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(x[i] - back[i])));
    amax = std::max(amax, static_cast<double>(std::fabs(x[i])));
  }
  return err / amax;
}

TEST(Requantize, EachFormatRoundTripsWithinItsStep) {
  const std::vector<float> x = random_values(32 * 37, 1);  // 37 blocks
  EXPECT_EQ(round_trip_error(DType::kF32, x), 0.0);
  EXPECT_LT(round_trip_error(DType::kF16, x), 1e-3);
  EXPECT_LT(round_trip_error(DType::kBF16, x), 8e-3);
  // Block formats: half a quantization step of the block's scale (amax/127, amax/8, range/15).
  EXPECT_LT(round_trip_error(DType::kQ8_0, x), 0.5 / 127 + 1e-3);
  EXPECT_LT(round_trip_error(DType::kQ4_0, x), 0.5 / 8 * 2 + 1e-3);
  EXPECT_LT(round_trip_error(DType::kQ4_1, x), 0.5 / 15 * 2 + 1e-3);
}

TEST(Requantize, ZeroBlocksStayZero) {
  const std::vector<float> x(64, 0.0f);
  for (DType f : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    std::vector<std::byte> q(dtype_row_bytes(f, 64));
    quantize_row(f, x.data(), 64, q.data());
    std::vector<float> back(64, 1.0f);
    convert_to_f32(f, q.data(), 64, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f) << dtype_name(f);
  }
}

TEST(Requantize, StoreConvertsMatricesOnlyAndKeepsTheRest) {
  auto values = std::make_shared<std::vector<float>>(random_values(96 * 64 + 64 + 96 * 33, 2));
  const auto* base = reinterpret_cast<const std::byte*>(values->data());
  WeightStore store;
  store.keep_alive(values);
  store.add(WeightView{"proj.weight", DType::kF32, {96, 64}, {base, 96 * 64 * 4}, "mem"});
  store.add(WeightView{"norm.weight", DType::kF32, {64}, {base + 96 * 64 * 4, 64 * 4}, "mem"});
  store.add(WeightView{"odd.weight", DType::kF32, {96, 33}, {base + (96 * 64 + 64) * 4, 96 * 33 * 4}, "mem"});
  const WeightStore q = requantize_weights(std::move(store), DType::kQ8_0);
  EXPECT_EQ(q.get("proj.weight").dtype, DType::kQ8_0);
  EXPECT_EQ(q.get("proj.weight").bytes.size(), 96u * 2 * 34);
  EXPECT_EQ(q.get("norm.weight").dtype, DType::kF32) << "vectors stay fp32";
  EXPECT_EQ(q.get("odd.weight").dtype, DType::kF32) << "33 columns are not whole Q8_0 blocks";
  const std::vector<float> back = q.get("proj.weight").to_f32();
  double err = 0;
  for (size_t i = 0; i < back.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(back[i] - (*values)[i])));
  EXPECT_LT(err, 0.01);
  EXPECT_EQ(weight_format_from_name("q4_1"), DType::kQ4_1);
  EXPECT_FALSE(weight_format_from_name("gguf").has_value());
  EXPECT_GT(weight_format_rank(DType::kF32), weight_format_rank(DType::kQ8_0));
  EXPECT_GT(weight_format_rank(DType::kQ8_0), weight_format_rank(DType::kQ4_1));
}

}  // namespace
}  // namespace tessera
