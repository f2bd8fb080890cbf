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

enum class WeightFormat : int32_t {
  kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1,
  // The block formats with 8 rows interleaved (see below): the same bytes per row as the row format,
  // rearranged at load so one 32-byte vector holds 4 quants of each of 8 rows.
  kQ8_0x8, kQ4_0x8, kQ4_1x8,
};

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

bool is_block_format(WeightFormat format);  // row or interleaved

// Interleaved block formats. Rows are taken 8 at a time (a group); a group's blocks follow each other,
// and group block b holds block b of its 8 rows:
//   q4_0x8  d[8] fp16,            then 128 quant bytes
//   q4_1x8  d[8] fp16, m[8] fp16, then 128 quant bytes
//   q8_0x8  d[8] fp16,            then 256 quant bytes
// The quant bytes are 32-byte chunks; 4-byte lane i of chunk c is row i's bytes 4c .. 4c + 3 of its
// row-format block. So an integer dot product of a chunk with one activation quad broadcast to all
// lanes leaves row i's partial sum in lane i, and 8 output rows finish in the lanes of one vector
// with no horizontal sums. q8_0x8 stores each quant plus 128 (as u8, `q ^ 0x80`): the unsigned
// operand of u8 x s8 dot products.
inline constexpr int64_t kInterleaveRows = 8;
bool is_interleaved_format(WeightFormat format);
// The interleaved counterpart of a row block format (itself for any other format), and back.
WeightFormat interleaved_format(WeightFormat format);
WeightFormat row_format(WeightFormat format);
// Rearranges n rows of k values of a row block format into its interleaved format (n a multiple of
// 8, same byte count; src and dst must not overlap). False when the shape does not fit.
bool interleave_rows(WeightFormat row_fmt, const std::byte* src, int64_t n, int64_t k, std::byte* dst);

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

// One row of `k` values to fp32 (the embedding gather and the scalar path's reference layout): row
// `row` of the matrix at `matrix` (any format, interleaved ones included).
void dequantize_row(WeightFormat format, const std::byte* matrix, int64_t row, int64_t k, float* dst);

}  // namespace tessera::kernels::cpu
