// kernels/cpu/quant/formats.cpp: format sizes and row dequantization (scalar: used for embedding
// rows, a handful per step, never in a matmul).
#include "kernels/cpu/quant/formats.h"

namespace tessera::kernels::cpu {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kF16: return "f16";
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kQ8_0: return "q8_0";
    case WeightFormat::kQ4_0: return "q4_0";
    case WeightFormat::kQ4_1: return "q4_1";
  }
  return "?";
}

bool is_block_format(WeightFormat format) {
  return format == WeightFormat::kQ8_0 || format == WeightFormat::kQ4_0 || format == WeightFormat::kQ4_1;
}

size_t weight_row_bytes(WeightFormat format, int64_t k) {
  if (k <= 0) return 0;
  const auto n = static_cast<size_t>(k);
  switch (format) {
    case WeightFormat::kF32: return n * 4;
    case WeightFormat::kF16:
    case WeightFormat::kBF16: return n * 2;
    default: break;
  }
  if (k % kQuantBlock != 0) return 0;
  const size_t blocks = n / kQuantBlock;
  switch (format) {
    case WeightFormat::kQ8_0: return blocks * kQ8_0BlockBytes;
    case WeightFormat::kQ4_0: return blocks * kQ4_0BlockBytes;
    case WeightFormat::kQ4_1: return blocks * kQ4_1BlockBytes;
    default: return 0;
  }
}

void dequantize_row(WeightFormat format, const std::byte* src, int64_t k, float* dst) {
  switch (format) {
    case WeightFormat::kF32:
      std::memcpy(dst, src, static_cast<size_t>(k) * sizeof(float));
      return;
    case WeightFormat::kF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case WeightFormat::kBF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case WeightFormat::kQ8_0:
      for (int64_t b = 0; b < k / kQuantBlock; ++b, src += kQ8_0BlockBytes, dst += kQuantBlock) {
        const float d = f16_to_f32(load_u16(src));
        for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(static_cast<int8_t>(src[2 + i]));
      }
      return;
    case WeightFormat::kQ4_0:
      for (int64_t b = 0; b < k / kQuantBlock; ++b, src += kQ4_0BlockBytes, dst += kQuantBlock) {
        const float d = f16_to_f32(load_u16(src));
        for (int i = 0; i < 16; ++i) {
          const auto q = static_cast<uint8_t>(src[2 + i]);
          dst[i] = d * static_cast<float>((q & 0x0f) - 8);
          dst[i + 16] = d * static_cast<float>((q >> 4) - 8);
        }
      }
      return;
    case WeightFormat::kQ4_1:
      for (int64_t b = 0; b < k / kQuantBlock; ++b, src += kQ4_1BlockBytes, dst += kQuantBlock) {
        const float d = f16_to_f32(load_u16(src));
        const float m = f16_to_f32(load_u16(src + 2));
        for (int i = 0; i < 16; ++i) {
          const auto q = static_cast<uint8_t>(src[4 + i]);
          dst[i] = d * static_cast<float>(q & 0x0f) + m;
          dst[i + 16] = d * static_cast<float>(q >> 4) + m;
        }
      }
      return;
  }
}

}  // namespace tessera::kernels::cpu
