// kernels/backend/weight_view.h: WeightView, a weight tensor as a file stores it (raw bytes, storage
// dtype, shape), which is all a backend needs to load it; the storage dtypes; and their conversion
// to fp32 (GGUF block formats dequantized).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tessera {

// Storage dtypes the loaders read. Quantized GGUF block formats keep their raw bytes and dequantize
// to fp32 on request (WeightView::to_f32).
enum class DType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1, kI8, kI16, kI32, kI64, kU8, kBool, kF64 };

const char* dtype_name(DType dtype);
bool dtype_is_float(DType dtype);  // F32/F16/BF16/F64 and the quantized formats (dequantizable)

// Bytes occupied by `elements` values of `dtype` along a row (quantized formats need a whole
// number of blocks: Q8_0/Q4_0/Q4_1 blocks are 32 values). Throws tessera::Error otherwise.
size_t dtype_row_bytes(DType dtype, int64_t elements);

// A tensor as stored: raw bytes (usually in an mmap owned by the store) plus how to read them.
struct WeightView {
  std::string name;            // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first (HF/PyTorch order)
  std::span<const std::byte> bytes;  // may be unaligned (safetensors data follows a JSON header)
  std::string source_file;     // for error messages

  int64_t numel() const;
  // All values as fp32, row-major in `shape` order. Throws naming the tensor and its file for a
  // non-float dtype or bytes that do not hold `shape`.
  std::vector<float> to_f32() const;
};

// Converts `count` values of `dtype` at `src` to fp32 (dequantizing block formats; count must be a
// whole number of blocks for them).
void convert_to_f32(DType dtype, const std::byte* src, int64_t count, float* dst);

// "[3, 4]", for messages.
std::string shape_string(std::span<const int64_t> shape);

// Throws naming the weight and its file when its shape is not `expected`.
void check_weight_shape(const WeightView& weight, std::span<const int64_t> expected);

// The shape of parts stacked along rows (Backend::load_stacked): each part has its expected shape,
// and all are [rows_i, cols] with one cols, or all 1-D. Throws naming the part otherwise.
std::vector<int64_t> stacked_shape(std::span<const WeightView* const> parts,
                                   std::span<const std::vector<int64_t>> shapes, const std::string& fused_name);

}  // namespace tessera
