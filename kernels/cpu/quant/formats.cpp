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
    case WeightFormat::kQ8_0x8: return "q8_0x8";
    case WeightFormat::kQ4_0x8: return "q4_0x8";
    case WeightFormat::kQ4_1x8: return "q4_1x8";
  }
  return "?";
}

bool is_block_format(WeightFormat format) {
  return format == WeightFormat::kQ8_0 || format == WeightFormat::kQ4_0 || format == WeightFormat::kQ4_1 ||
         is_interleaved_format(format);
}

bool is_interleaved_format(WeightFormat format) {
  return format == WeightFormat::kQ8_0x8 || format == WeightFormat::kQ4_0x8 || format == WeightFormat::kQ4_1x8;
}

WeightFormat interleaved_format(WeightFormat format) {
  switch (format) {
    case WeightFormat::kQ8_0: return WeightFormat::kQ8_0x8;
    case WeightFormat::kQ4_0: return WeightFormat::kQ4_0x8;
    case WeightFormat::kQ4_1: return WeightFormat::kQ4_1x8;
    default: return format;
  }
}

WeightFormat row_format(WeightFormat format) {
  switch (format) {
    case WeightFormat::kQ8_0x8: return WeightFormat::kQ8_0;
    case WeightFormat::kQ4_0x8: return WeightFormat::kQ4_0;
    case WeightFormat::kQ4_1x8: return WeightFormat::kQ4_1;
    default: return format;
  }
}

namespace {

// Where the pieces of one row's block sit in its interleaved group block (see formats.h).
struct GroupBlockLayout {
  size_t block_bytes;  // of the row format
  size_t scale_bytes;  // 2 (d) or 4 (d, m) per row
  size_t quant_bytes;  // 16 or 32 per row
  bool offset_quants;  // q8_0x8 stores q + 128
};

GroupBlockLayout group_layout(WeightFormat row_fmt) {
  switch (row_fmt) {
    case WeightFormat::kQ8_0: return {kQ8_0BlockBytes, 2, 32, true};
    case WeightFormat::kQ4_0: return {kQ4_0BlockBytes, 2, 16, false};
    default: return {kQ4_1BlockBytes, 4, 16, false};
  }
}

// Byte offset, in a group block, of byte `e` of row `lane`'s row-format block (e counts from the
// block's start: scales first, then quants).
size_t group_offset(const GroupBlockLayout& l, int lane, size_t e) {
  if (e < l.scale_bytes) return (e / 2) * 2 * kInterleaveRows + 2 * static_cast<size_t>(lane) + e % 2;  // d[8], m[8]
  const size_t q = e - l.scale_bytes;
  return kInterleaveRows * l.scale_bytes + 32 * (q / 4) + 4 * static_cast<size_t>(lane) + q % 4;
}

std::byte quant_flip(const GroupBlockLayout& l, size_t e) {
  return l.offset_quants && e >= l.scale_bytes ? std::byte{0x80} : std::byte{0};
}

}  // namespace

bool interleave_rows(WeightFormat row_fmt, const std::byte* src, int64_t n, int64_t k, std::byte* dst) {
  if (interleaved_format(row_fmt) == row_fmt || n % kInterleaveRows != 0 || weight_row_bytes(row_fmt, k) == 0) {
    return false;
  }
  const GroupBlockLayout l = group_layout(row_fmt);
  const int64_t blocks = k / kQuantBlock;
  const size_t row_bytes = weight_row_bytes(row_fmt, k);
  for (int64_t g = 0; g < n / kInterleaveRows; ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      std::byte* group = dst + (g * blocks + b) * kInterleaveRows * l.block_bytes;
      for (int lane = 0; lane < kInterleaveRows; ++lane) {
        const std::byte* block = src + (g * kInterleaveRows + lane) * row_bytes + b * l.block_bytes;
        for (size_t e = 0; e < l.block_bytes; ++e) group[group_offset(l, lane, e)] = block[e] ^ quant_flip(l, e);
      }
    }
  }
  return true;
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
  switch (row_format(format)) {
    case WeightFormat::kQ8_0: return blocks * kQ8_0BlockBytes;
    case WeightFormat::kQ4_0: return blocks * kQ4_0BlockBytes;
    case WeightFormat::kQ4_1: return blocks * kQ4_1BlockBytes;
    default: return 0;
  }
}

void dequantize_row(WeightFormat format, const std::byte* matrix, int64_t row, int64_t k, float* dst) {
  if (is_interleaved_format(format)) {
    // Each block back to its row-format bytes, then the row format's dequantization.
    const WeightFormat row_fmt = row_format(format);
    const GroupBlockLayout l = group_layout(row_fmt);
    const int64_t blocks = k / kQuantBlock;
    const int64_t g = row / kInterleaveRows;
    const int lane = static_cast<int>(row % kInterleaveRows);
    std::byte block[kQ8_0BlockBytes];
    for (int64_t b = 0; b < blocks; ++b) {
      const std::byte* group = matrix + (g * blocks + b) * kInterleaveRows * l.block_bytes;
      for (size_t e = 0; e < l.block_bytes; ++e) block[e] = group[group_offset(l, lane, e)] ^ quant_flip(l, e);
      dequantize_row(row_fmt, block, 0, kQuantBlock, dst + b * kQuantBlock);
    }
    return;
  }
  const std::byte* src = matrix + static_cast<size_t>(row) * weight_row_bytes(format, k);
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
    default: return;  // interleaved formats: handled above
  }
}

}  // namespace tessera::kernels::cpu
