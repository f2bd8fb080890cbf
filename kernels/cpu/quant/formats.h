// kernels/cpu/quant/formats.h: the weight storage formats the CPU matmuls read in place (fp32, fp16,
// bf16 and GGUF's Q8_0 / Q4_0 / Q4_1 blocks), their byte layout, and scalar conversions to fp32.
// Weights stay exactly as the GGUF file stores them, so loading is a copy and memory is the file's.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tessera::kernels::cpu {

enum class WeightFormat : int32_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1 };

const char* weight_format_name(WeightFormat format);

// Values per block of the GGUF block formats.
inline constexpr int64_t kQuantBlock = 32;

// ggml's block layouts: an fp16 scale (and for Q4_1 an fp16 minimum), then the quants. Packed and
// unaligned in the file, so they are read through memcpy / unaligned loads only.
//   Q8_0: value = d * q,          q int8[32]
//   Q4_0: value = d * (nib - 8),  16 bytes: byte i holds element i (low nibble) and i + 16 (high)
//   Q4_1: value = d * nib + m,    same nibble order
inline constexpr size_t kQ8_0BlockBytes = 2 + 32;
inline constexpr size_t kQ4_0BlockBytes = 2 + 16;
inline constexpr size_t kQ4_1BlockBytes = 2 + 2 + 16;

bool is_block_format(WeightFormat format);

// Bytes of one weight row of `k` values; 0 when k does not fit the format (block formats need a
// multiple of 32).
size_t weight_row_bytes(WeightFormat format, int64_t k);

inline uint16_t load_u16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// IEEE half to float, exact (subnormals, inf and nan included).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 31 ? (sign | 0x7f800000u | (mantissa << 13))
                                       : (sign | ((exponent + 112u) << 23) | (mantissa << 13));
  return std::bit_cast<float>(bits);
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// One row of `k` values to fp32 (the embedding gather and the scalar path's reference layout).
void dequantize_row(WeightFormat format, const std::byte* src, int64_t k, float* dst);

}  // namespace tessera::kernels::cpu
