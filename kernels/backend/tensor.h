// kernels/backend/tensor.h: Tensor, a small owned buffer (host or device memory) with a dtype, a shape and a
// name for debug dumps. Copies share the buffer; a backend allocates them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// kBF16 / kF16 are the activation, weight and KV types of a GPU backend, and weight types of the CPU
// backend. kQ8_0 / kQ4_0 / kQ4_1 are weight-only block formats (GGUF's: 32 values per block with
// their fp16 scale): a backend whose matmuls read them keeps its weights in them.
// kInt8PerRow / kInt4G128 / kFp8E4M3PerRow are the GPU's weight-only formats of linear layers
// (kernels/cuda/gemm/quantized_weights.h has their layout): a [n, k] weight is one allocation, its
// quantized values for all rows (int4's two a byte, tiled for the tensor cores: rows padded to 16, k
// to 64),
// then (at a 16-byte boundary) the scales: fp32 per row for int8 and fp8; for int4 the bf16 scales of
// every row and group of 128, then (at a 16-byte boundary) their bf16 minimums.
// kFp8E4M3 is one OCP e4m3 byte per value with no scale: the CUDA backend's fp8 KV cache
// (CudaBackendConfig::kv_cache_dtype); its name, "e4m3", differs from the weight format's "fp8_e4m3".
enum class ScalarType {
  kF32, kI32, kBF16, kF16, kQ8_0, kQ4_0, kQ4_1, kInt8PerRow, kInt4G128, kFp8E4M3PerRow, kFp8E4M3
};
enum class DeviceKind { kCpu, kCuda };

// "f32", "bf16", "q8_0", ...; the GPU formats by the tuner's names: "int8", "int4_g128", "fp8_e4m3".
const char* scalar_type_name(ScalarType type);
// The type scalar_type_name() spells `name`; nullopt for any other string.
std::optional<ScalarType> scalar_type_from_name(std::string_view name);
bool scalar_type_is_block(ScalarType type);          // Q8_0 / Q4_0 / Q4_1
bool scalar_type_is_gpu_quantized(ScalarType type);  // int8 / int4_g128 / fp8_e4m3
// Bytes of one value; throws for a block or GPU-quantized format, whose values have no whole size
// (use storage_bytes).
int64_t scalar_type_bytes(ScalarType type);
// Whether a [rows, cols] matrix can be stored in `type`; when not, `why` says what the format needs.
bool storage_holds(ScalarType type, int64_t rows, int64_t cols, std::string* why = nullptr);
// Bytes of `rows` rows of `cols` values; throws when storage_holds is false (a block format needs
// cols % 32 == 0). For a GPU-quantized format this is the whole allocation of a [rows, cols] matrix,
// scales included: the arithmetic of kernels::cuda::quantized_weight_bytes (a GPU test holds them equal).
int64_t storage_bytes(ScalarType type, int64_t rows, int64_t cols);

class Tensor {
 public:
  Tensor() = default;
  // `storage` owns the memory `data` points into (a vector, a cudaMalloc with its deleter).
  Tensor(std::shared_ptr<void> storage, void* data, ScalarType type, std::vector<int64_t> shape,
         DeviceKind device, std::string name);

  bool defined() const { return data_ != nullptr; }
  ScalarType type() const { return type_; }
  DeviceKind device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const;  // throws naming the tensor when i is out of range
  int64_t numel() const;
  int64_t bytes() const;  // storage_bytes over the last dimension
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  std::string describe() const;  // "name f32[3, 4]"

  // Raw element pointers; throw when the dtype differs. Device pointers for device tensors.
  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;
  void* data() { return data_; }
  const void* data() const { return data_; }
  // The first `count` rows of a tensor (dim 0), sharing its memory. Not for a GPU-quantized weight,
  // whose scales follow all of its rows (throws).
  Tensor first_rows(int64_t count) const;
  // Rows [begin, begin + count) of a tensor (dim 0), sharing its memory (not GPU-quantized either).
  Tensor rows(int64_t begin, int64_t count) const;
  // The same values in another shape of as many elements, sharing its memory (not GPU-quantized).
  Tensor reshaped(std::vector<int64_t> shape) const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  ScalarType type_ = ScalarType::kF32;
  std::vector<int64_t> shape_;
  DeviceKind device_ = DeviceKind::kCpu;
  std::string name_;
};

}  // namespace tessera
