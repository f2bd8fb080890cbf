// models/weights/weight_store.h: one store of named weight tensors, keyed by HF tensor names,
// whatever file format they came from. Model code only ever sees this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera {

// Storage dtypes we read. Quantized GGUF block formats keep their raw bytes (for GPU formats later)
// and dequantize to fp32 on request.
enum class DType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1, kI8, kI16, kI32, kI64, kU8, kBool, kF64 };

const char* dtype_name(DType dtype);
bool dtype_is_float(DType dtype);  // F32/F16/BF16/F64 and the quantized formats (dequantizable)

// Bytes occupied by `elements` values of `dtype` along a row (quantized formats need a whole
// number of blocks: Q8_0/Q4_0/Q4_1 blocks are 32 values). Throws tessera::Error otherwise.
size_t dtype_row_bytes(DType dtype, int64_t elements);

// A tensor as stored: raw bytes (usually in an mmap owned by the store) plus how to read them.
struct WeightTensor {
  std::string name;            // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first (HF/PyTorch order)
  std::span<const std::byte> bytes;  // may be unaligned (safetensors data follows a JSON header)
  std::string source_file;     // for error messages

  int64_t numel() const;
};

// Const calls are thread-safe (the store is read-only once built); building (keep_alive, add) is not.
class WeightStore {
 public:
  WeightStore();
  ~WeightStore();
  WeightStore(WeightStore&&) noexcept;
  WeightStore& operator=(WeightStore&&) noexcept;

  bool contains(const std::string& name) const;
  // Throws tessera::Error naming the tensor (and the files searched) when absent.
  const WeightTensor& get(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const;
  std::map<std::string, size_t> count_by_dtype() const;  // dtype name -> tensor count

  // Converts (dequantizes) any float or quantized tensor to fp32, row-major in `shape` order.
  // Throws naming the tensor for non-float dtypes.
  std::vector<float> to_f32(const std::string& name) const;

  // --- building (used by the readers) ---
  // Keeps `owner` (an mmap, a buffer) alive as long as the store.
  void keep_alive(std::shared_ptr<const void> owner);
  // Throws on a duplicate name.
  void add(WeightTensor tensor);

 private:
  std::map<std::string, WeightTensor> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
};

// Converts `count` values of `dtype` at `src` to fp32 (dequantizing block formats; count must be a
// whole number of blocks for them).
void convert_to_f32(DType dtype, const std::byte* src, int64_t count, float* dst);

}  // namespace tessera
