// tests/unit/backend/backend_types_test.cpp: ScalarType names and storage sizes. The GPU weight-only
// formats' sizes are worked out here by hand from their layout (values, then scales at a 16-byte
// boundary: fp32 per row, or int4's bf16 scales and then bf16 minimums per row and group of 128, each
// part 16-byte aligned, after values in whole atoms of 16 rows x 64), at odd row counts and k not a
// multiple of 128. The values never need the boundary (k % 16 bytes, or whole int4 atoms, fill whole
// 16-byte units); int4's scales do.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "kernels/backend/tensor.h"
#include "tests/error_of.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(ScalarTypes, GpuFormatsHaveTheTunersNames) {
  EXPECT_STREQ(scalar_type_name(ScalarType::kInt8PerRow), "int8");
  EXPECT_STREQ(scalar_type_name(ScalarType::kInt4G128), "int4_g128");
  EXPECT_STREQ(scalar_type_name(ScalarType::kFp8E4M3PerRow), "fp8_e4m3");
  for (ScalarType t : {ScalarType::kInt8PerRow, ScalarType::kInt4G128, ScalarType::kFp8E4M3PerRow}) {
    EXPECT_TRUE(scalar_type_is_gpu_quantized(t));
    EXPECT_FALSE(scalar_type_is_block(t));
    EXPECT_THAT(error_of([&] { scalar_type_bytes(t); }), HasSubstr("no whole byte size"));
  }
  for (ScalarType t : {ScalarType::kF32, ScalarType::kBF16, ScalarType::kF16, ScalarType::kQ8_0, ScalarType::kI32}) {
    EXPECT_FALSE(scalar_type_is_gpu_quantized(t));
  }
}

// The fp8 KV cache's element: one e4m3 byte a value, no scale, under a name of its own.
TEST(ScalarTypes, E4m3IsAOneByteElement) {
  EXPECT_STREQ(scalar_type_name(ScalarType::kFp8E4M3), "e4m3");
  EXPECT_EQ(scalar_type_from_name("e4m3"), ScalarType::kFp8E4M3);
  EXPECT_EQ(scalar_type_from_name("fp8_e4m3"), ScalarType::kFp8E4M3PerRow);
  EXPECT_EQ(scalar_type_bytes(ScalarType::kFp8E4M3), 1);
  EXPECT_EQ(storage_bytes(ScalarType::kFp8E4M3, 10 * 16, 3 * 64), 10 * 16 * 3 * 64);
  EXPECT_FALSE(scalar_type_is_gpu_quantized(ScalarType::kFp8E4M3));
  EXPECT_FALSE(scalar_type_is_block(ScalarType::kFp8E4M3));
}

TEST(StorageBytes, PerRowFormatsAreValuesThenOneScalePerRow) {
  for (ScalarType t : {ScalarType::kInt8PerRow, ScalarType::kFp8E4M3PerRow}) {
    // 3 x 48 = 144 values (already a multiple of 16) + 3 scales.
    EXPECT_EQ(storage_bytes(t, 3, 48), 144 + 3 * 4);
    // 7 x 16 = 112 values + 7 scales.
    EXPECT_EQ(storage_bytes(t, 7, 16), 112 + 7 * 4);
    // 1 x 16: 16 values + 1 scale.
    EXPECT_EQ(storage_bytes(t, 1, 16), 16 + 4);
    // SmolLM2-135M's fused qkv: [960, 576].
    EXPECT_EQ(storage_bytes(t, 960, 576), 960 * 576 + 960 * 4);
  }
}

TEST(StorageBytes, Int4IsWholeAtomsOf16x64TwoValuesAByteThenScalesThenMinimums) {
  // [5, 32]: one atom of 16 rows x 64, 512 bytes; one group: 5 bf16 scales (10 bytes, padded to 16),
  // 5 minimums.
  EXPECT_EQ(storage_bytes(ScalarType::kInt4G128, 5, 32), 512 + 16 + 16);
  // [16, 96]: two atoms, 1024 bytes; one group: 16 scales and 16 minimums, 32 bytes each.
  EXPECT_EQ(storage_bytes(ScalarType::kInt4G128, 16, 96), 1024 + 32 + 32);
  // [17, 160]: 2 x 3 atoms, 3072 bytes; two groups (128 + 32): 34 scales (68 bytes, padded to 80),
  // 34 minimums.
  EXPECT_EQ(storage_bytes(ScalarType::kInt4G128, 17, 160), 3072 + 80 + 80);
  // SmolLM2-135M's down projection: [576, 1536], 36 tiles, 12 groups a row.
  EXPECT_EQ(storage_bytes(ScalarType::kInt4G128, 576, 1536), 576 * 768 + 2 * 576 * 12 * 2);
  // Llama-2-7B's fused gate_up: [22016, 4096], 1376 tiles, 32 groups a row.
  EXPECT_EQ(storage_bytes(ScalarType::kInt4G128, 22016, 4096), int64_t{22016} * 2048 + 2 * int64_t{22016} * 32 * 2);
}

TEST(StorageBytes, RefusesShapesTheFormatsCannotHold) {
  std::string why;
  EXPECT_FALSE(storage_holds(ScalarType::kInt8PerRow, 4, 24, &why));
  EXPECT_THAT(why, HasSubstr("int8 needs a matrix of >= 1 row and a multiple of 16 columns, got [4, 24]"));
  EXPECT_FALSE(storage_holds(ScalarType::kInt4G128, 4, 48, &why));
  EXPECT_THAT(why, HasSubstr("int4_g128 needs a matrix of >= 1 row and a multiple of 32 columns, got [4, 48]"));
  EXPECT_TRUE(storage_holds(ScalarType::kFp8E4M3PerRow, 4, 48));
  EXPECT_FALSE(storage_holds(ScalarType::kFp8E4M3PerRow, 0, 48));
  EXPECT_TRUE(storage_holds(ScalarType::kBF16, 3, 5));
  EXPECT_THAT(error_of([] { storage_bytes(ScalarType::kInt4G128, 2, 16); }), HasSubstr("multiple of 32 columns"));
  EXPECT_THAT(error_of([] { storage_bytes(ScalarType::kQ8_0, 2, 16); }), HasSubstr("multiple of 32 values"));
}

TEST(StorageBytes, TensorBytesOfAQuantizedWeightIsItsWholeAllocation) {
  std::vector<char> memory(4096);
  Tensor w(nullptr, memory.data(), ScalarType::kInt8PerRow, {3, 48}, DeviceKind::kCpu, "w");
  EXPECT_EQ(w.bytes(), 144 + 12);
  EXPECT_EQ(w.describe(), "w int8[3, 48]");
  // Its scales follow every row: a row view would cut them off.
  EXPECT_THAT(error_of([&] { w.rows(1, 1); }), HasSubstr("a quantized weight's rows cannot be viewed"));
  EXPECT_THAT(error_of([&] { w.first_rows(2); }), HasSubstr("a quantized weight's rows cannot be viewed"));
}

}  // namespace
}  // namespace tessera
