// models/weights/requantize.cpp: fp32 -> fp16 / bf16 / Q8_0 / Q4_0 / Q4_1, and requantize_weights.
#include "models/weights/requantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"

namespace tessera {

namespace {

// IEEE half, round to nearest even (overflow to inf, subnormals kept).
uint16_t f32_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal half: a subnormal, by exact scaling
    const float magnitude = std::bit_cast<float>(abs);
    const auto mantissa = static_cast<uint32_t>(std::nearbyint(magnitude * 16777216.0f));  // 2^24
    return static_cast<uint16_t>(sign | mantissa);
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

uint16_t f32_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void put_u16(std::byte* dst, uint16_t v) { std::memcpy(dst, &v, sizeof v); }

// ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d).
void quantize_q8_0_block(const float* x, std::byte* dst) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(dst, f32_to_f16(d));
  for (int i = 0; i < 32; ++i) dst[2 + i] = static_cast<std::byte>(static_cast<int8_t>(std::lround(x[i] * id)));
}

// ggml's quantize_row_q4_0_ref: the value of largest magnitude maps to -8; d = max / -8.
void quantize_q4_0_block(const float* x, std::byte* dst) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < 32; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(dst, f32_to_f16(d));
  for (int i = 0; i < 16; ++i) {
    const auto lo = static_cast<uint8_t>(std::min(15, static_cast<int>(x[i] * id + 8.5f)));
    const auto hi = static_cast<uint8_t>(std::min(15, static_cast<int>(x[i + 16] * id + 8.5f)));
    dst[2 + i] = static_cast<std::byte>(lo | (hi << 4));
  }
}

// ggml's quantize_row_q4_1_ref: d = (max - min) / 15, m = min.
void quantize_q4_1_block(const float* x, std::byte* dst) {
  float min = x[0], max = x[0];
  for (int i = 1; i < 32; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(dst, f32_to_f16(d));
  put_u16(dst + 2, f32_to_f16(min));
  for (int i = 0; i < 16; ++i) {
    const auto lo = static_cast<uint8_t>(std::min(15, static_cast<int>((x[i] - min) * id + 0.5f)));
    const auto hi = static_cast<uint8_t>(std::min(15, static_cast<int>((x[i + 16] - min) * id + 0.5f)));
    dst[4 + i] = static_cast<std::byte>(lo | (hi << 4));
  }
}

bool is_block(DType dtype) { return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1; }

}  // namespace

std::optional<DType> weight_format_from_name(std::string_view name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "q8_0") return DType::kQ8_0;
  if (name == "q4_0") return DType::kQ4_0;
  if (name == "q4_1") return DType::kQ4_1;
  return std::nullopt;
}

int weight_format_rank(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kF64: return 4;
    case DType::kF16: case DType::kBF16: return 3;
    case DType::kQ8_0: return 2;
    case DType::kQ4_1: return 1;
    default: return 0;
  }
}

void quantize_row(DType target, const float* src, int64_t count, std::byte* dst) {
  TESSERA_CHECK(!is_block(target) || count % 32 == 0,
                "quantize_row: " << count << " values are not whole blocks of 32 for " << dtype_name(target));
  switch (target) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float)); return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) put_u16(dst + 2 * i, f32_to_f16(src[i]));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) put_u16(dst + 2 * i, f32_to_bf16(src[i]));
      return;
    case DType::kQ8_0:
      for (int64_t b = 0; b < count / 32; ++b) quantize_q8_0_block(src + 32 * b, dst + 34 * b);
      return;
    case DType::kQ4_0:
      for (int64_t b = 0; b < count / 32; ++b) quantize_q4_0_block(src + 32 * b, dst + 18 * b);
      return;
    case DType::kQ4_1:
      for (int64_t b = 0; b < count / 32; ++b) quantize_q4_1_block(src + 32 * b, dst + 20 * b);
      return;
    default: break;
  }
  TESSERA_FAIL("quantize_row: " << dtype_name(target) << " is not a weight format (f32, f16, bf16, q8_0, q4_0, q4_1)");
}

WeightStore requantize_weights(WeightStore source, DType target) {
  auto src = std::make_shared<const WeightStore>(std::move(source));
  WeightStore out;
  out.keep_alive(src);
  for (const std::string& name : src->names()) {
    const WeightView& view = src->get(name);
    const bool matrix = view.shape.size() == 2 && dtype_is_float(view.dtype) && view.dtype != target;
    if (!matrix || (is_block(target) && view.shape[1] % 32 != 0)) {
      out.add(view);
      continue;
    }
    const int64_t rows = view.shape[0], cols = view.shape[1];
    const size_t row_bytes = dtype_row_bytes(target, cols);
    auto buffer = std::make_shared<std::vector<std::byte>>(row_bytes * static_cast<size_t>(rows));
    const std::vector<float> values = view.to_f32();
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(target, values.data() + r * cols, cols, buffer->data() + static_cast<size_t>(r) * row_bytes);
    }
    WeightView converted = view;
    converted.dtype = target;
    converted.bytes = std::span<const std::byte>(buffer->data(), buffer->size());
    out.keep_alive(buffer);
    out.add(std::move(converted));
  }
  return out;
}

}  // namespace tessera
