// kernels/backend/weight_view.cpp: storage dtype sizes and fp32 conversion / dequantization.
#include "kernels/backend/weight_view.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"

namespace tessera {
namespace {

// ggml block formats: 32 values per block.
constexpr int64_t kQuantBlock = 32;
constexpr size_t kQ8_0BlockBytes = 2 + 32;     // fp16 d, int8 q[32]
constexpr size_t kQ4_0BlockBytes = 2 + 16;     // fp16 d, nibbles[16]
constexpr size_t kQ4_1BlockBytes = 2 + 2 + 16;  // fp16 d, fp16 m, nibbles[16]

uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);  // little-endian host; unaligned-safe
  return v;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
    return sign ? -magnitude : magnitude;
  }
  uint32_t bits;
  if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / nan
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

bool is_block_format(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1;
}

size_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
    default: return 0;
  }
}

size_t block_bytes(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0: return kQ8_0BlockBytes;
    case DType::kQ4_0: return kQ4_0BlockBytes;
    case DType::kQ4_1: return kQ4_1BlockBytes;
    default: return 0;
  }
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
    case DType::kI8: return "I8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
    case DType::kF64: return "F64";
  }
  return "?";
}

bool dtype_is_float(DType dtype) {
  switch (dtype) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF64:
    case DType::kQ8_0: case DType::kQ4_0: case DType::kQ4_1:
      return true;
    default:
      return false;
  }
}

size_t dtype_row_bytes(DType dtype, int64_t elements) {
  TESSERA_CHECK(elements >= 0, "negative element count " << elements << " for dtype " << dtype_name(dtype));
  const auto count = static_cast<uint64_t>(elements);
  if (is_block_format(dtype)) {
    TESSERA_CHECK(elements % kQuantBlock == 0, dtype_name(dtype) << " needs a multiple of " << kQuantBlock
                                                   << " values per row, got " << elements);
    const uint64_t blocks = count / kQuantBlock;
    TESSERA_CHECK(blocks <= std::numeric_limits<size_t>::max() / block_bytes(dtype),
                  "size of " << elements << " " << dtype_name(dtype) << " values overflows");
    return blocks * block_bytes(dtype);
  }
  const size_t width = element_bytes(dtype);
  TESSERA_CHECK(count <= std::numeric_limits<size_t>::max() / width,
                "size of " << elements << " " << dtype_name(dtype) << " values overflows");
  return count * width;
}

int64_t WeightView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // the readers check shapes for overflow
  return n;
}

void convert_to_f32(DType dtype, const std::byte* src, int64_t count, float* dst) {
  if (count == 0) return;  // dst may be null for an empty tensor
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kF64:
      for (int64_t i = 0; i < count; ++i) {
        double v;
        std::memcpy(&v, src + i * 8, sizeof v);
        dst[i] = static_cast<float>(v);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) dst[i] = f16_to_f32(load_u16(src + i * 2));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(load_u16(src + i * 2));
      return;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: {
      TESSERA_CHECK(count % kQuantBlock == 0, dtype_name(dtype) << " conversion needs a multiple of "
                                                  << kQuantBlock << " values, got " << count);
      const size_t stride = block_bytes(dtype);
      for (int64_t b = 0; b < count / kQuantBlock; ++b) {
        const std::byte* block = src + static_cast<size_t>(b) * stride;
        float* out = dst + b * kQuantBlock;
        const float d = f16_to_f32(load_u16(block));
        if (dtype == DType::kQ8_0) {
          for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(static_cast<int8_t>(block[2 + i])) * d;
        } else if (dtype == DType::kQ4_0) {
          // Low nibbles are elements 0..15, high nibbles 16..31; stored with an offset of 8.
          for (int i = 0; i < 16; ++i) {
            const auto q = static_cast<uint8_t>(block[2 + i]);
            out[i] = static_cast<float>(static_cast<int>(q & 0x0f) - 8) * d;
            out[i + 16] = static_cast<float>(static_cast<int>(q >> 4) - 8) * d;
          }
        } else {
          const float m = f16_to_f32(load_u16(block + 2));
          for (int i = 0; i < 16; ++i) {
            const auto q = static_cast<uint8_t>(block[4 + i]);
            out[i] = static_cast<float>(q & 0x0f) * d + m;
            out[i + 16] = static_cast<float>(q >> 4) * d + m;
          }
        }
      }
      return;
    }
    default:
      TESSERA_FAIL("cannot convert dtype " << dtype_name(dtype) << " to F32: not a float type");
  }
}

std::vector<float> WeightView::to_f32() const {
  TESSERA_CHECK(dtype_is_float(dtype), "tensor '" << name << "' in " << source_file << " has dtype "
                                                   << dtype_name(dtype) << ", which is not a float type");
  const int64_t count = numel();
  TESSERA_CHECK(dtype_row_bytes(dtype, count) == bytes.size(),
                "tensor '" << name << "' in " << source_file << ": " << bytes.size() << " bytes do not hold "
                           << count << " " << dtype_name(dtype) << " values");
  std::vector<float> out(static_cast<size_t>(count));
  convert_to_f32(dtype, bytes.data(), count, out.data());
  return out;
}


std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_weight_shape(const WeightView& weight, std::span<const int64_t> expected) {
  TESSERA_CHECK(std::equal(weight.shape.begin(), weight.shape.end(), expected.begin(), expected.end()),
                "weight " << weight.name << " in " << weight.source_file << " has shape " << shape_string(weight.shape)
                          << ", expected " << shape_string(expected));
}

std::vector<int64_t> stacked_shape(std::span<const WeightView* const> parts,
                                   std::span<const std::vector<int64_t>> shapes, const std::string& fused_name) {
  TESSERA_CHECK(!parts.empty() && parts.size() == shapes.size(),
                "stacking " << fused_name << ": " << parts.size() << " weights for " << shapes.size() << " shapes");
  const size_t rank = shapes[0].size();
  TESSERA_CHECK(rank == 1 || rank == 2, "stacking " << fused_name << ": parts must be 1-D or 2-D, got "
                                                    << shape_string(shapes[0]));
  std::vector<int64_t> out = shapes[0];
  out[0] = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    TESSERA_CHECK(shapes[i].size() == rank && (rank == 1 || shapes[i][1] == shapes[0][1]),
                  "stacking " << fused_name << ": " << parts[i]->name << " must be " << (rank == 1 ? "1-D" : "[rows, ")
                              << (rank == 1 ? "" : std::to_string(shapes[0][1]) + "]") << ", expected "
                              << shape_string(shapes[i]));
    check_weight_shape(*parts[i], shapes[i]);
    out[0] += shapes[i][0];
  }
  return out;
}

}  // namespace tessera
