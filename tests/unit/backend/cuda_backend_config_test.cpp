// tests/unit/backend/cuda_backend_config_test.cpp: CudaBackendConfig::validate, which needs no GPU:
// linear_weights is the dtype (unquantized) or a GPU weight-only format, and those need bf16.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string validation_error(const CudaBackendConfig& config) {
  try {
    config.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaBackendConfig, DefaultsKeepLinearWeightsInTheDtype) {
  const CudaBackendConfig config;
  EXPECT_EQ(config.linear_weights, config.dtype);
  EXPECT_EQ(validation_error(config), "");
}

TEST(CudaBackendConfig, AcceptsEachGpuFormatWithBf16) {
  for (ScalarType t : {ScalarType::kInt8PerRow, ScalarType::kInt4G128, ScalarType::kFp8E4M3PerRow}) {
    CudaBackendConfig config;
    config.linear_weights = t;
    EXPECT_EQ(validation_error(config), "") << scalar_type_name(t);
  }
  CudaBackendConfig fp16;
  fp16.dtype = ScalarType::kF16;
  fp16.linear_weights = ScalarType::kF16;
  EXPECT_EQ(validation_error(fp16), "");
}

TEST(CudaBackendConfig, RefusesOtherFormatsNamingTheField) {
  CudaBackendConfig config;
  config.linear_weights = ScalarType::kQ4_0;
  EXPECT_THAT(validation_error(config),
              HasSubstr("linear_weights must be the dtype (bf16: unquantized), int8, int4_g128 or fp8_e4m3, got q4_0"));
  config.linear_weights = ScalarType::kF32;
  EXPECT_THAT(validation_error(config), HasSubstr("linear_weights must be the dtype"));
  // fp16 activations with bf16 linear weights: neither the dtype nor a quantized format.
  config.dtype = ScalarType::kF16;
  config.linear_weights = ScalarType::kBF16;
  EXPECT_THAT(validation_error(config), HasSubstr("linear_weights must be the dtype (f16: unquantized)"));
  config.linear_weights = ScalarType::kInt4G128;
  EXPECT_THAT(validation_error(config), HasSubstr("linear_weights int4_g128 needs dtype bf16"));
}

TEST(CudaBackendConfig, KvCacheDtypeIsTheDtypeOrE4m3WithBf16) {
  CudaBackendConfig config;
  EXPECT_FALSE(config.kv_cache_dtype.has_value());  // the activation dtype
  config.kv_cache_dtype = ScalarType::kFp8E4M3;
  EXPECT_EQ(validation_error(config), "");
  config.kv_cache_dtype = ScalarType::kBF16;
  EXPECT_EQ(validation_error(config), "");
  config.kv_cache_dtype = ScalarType::kFp8E4M3PerRow;  // the weight format, which has scales
  EXPECT_THAT(validation_error(config), HasSubstr("kv_cache_dtype must be the dtype (bf16) or e4m3 (fp8_e4m3), got "
                                                  "fp8_e4m3"));
  config.kv_cache_dtype = ScalarType::kF16;
  EXPECT_THAT(validation_error(config), HasSubstr("kv_cache_dtype must be the dtype (bf16)"));
  CudaBackendConfig fp16;
  fp16.dtype = ScalarType::kF16;
  fp16.linear_weights = ScalarType::kF16;
  fp16.kv_cache_dtype = ScalarType::kFp8E4M3;
  EXPECT_THAT(validation_error(fp16), HasSubstr("kv_cache_dtype fp8_e4m3 needs dtype bf16"));
}

}  // namespace
}  // namespace tessera
