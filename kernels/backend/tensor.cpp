// kernels/backend/tensor.cpp: Tensor accessors and their checks.
#include "kernels/backend/tensor.h"

#include <sstream>

#include "common/error.h"

namespace tessera {

const char* scalar_type_name(ScalarType type) {
  switch (type) {
    case ScalarType::kF32: return "f32";
    case ScalarType::kI32: return "i32";
    case ScalarType::kBF16: return "bf16";
    case ScalarType::kF16: return "f16";
    case ScalarType::kQ8_0: return "q8_0";
    case ScalarType::kQ4_0: return "q4_0";
    case ScalarType::kQ4_1: return "q4_1";
    case ScalarType::kInt8PerRow: return "int8";
    case ScalarType::kInt4G128: return "int4_g128";
    case ScalarType::kFp8E4M3PerRow: return "fp8_e4m3";
    case ScalarType::kFp8E4M3: return "e4m3";
  }
  return "?";
}

std::optional<ScalarType> scalar_type_from_name(std::string_view name) {
  for (ScalarType type : {ScalarType::kF32, ScalarType::kI32, ScalarType::kBF16, ScalarType::kF16, ScalarType::kQ8_0,
                          ScalarType::kQ4_0, ScalarType::kQ4_1, ScalarType::kInt8PerRow, ScalarType::kInt4G128,
                          ScalarType::kFp8E4M3PerRow, ScalarType::kFp8E4M3}) {
    if (name == scalar_type_name(type)) return type;
  }
  return std::nullopt;
}

bool scalar_type_is_block(ScalarType type) {
  return type == ScalarType::kQ8_0 || type == ScalarType::kQ4_0 || type == ScalarType::kQ4_1;
}

bool scalar_type_is_gpu_quantized(ScalarType type) {
  return type == ScalarType::kInt8PerRow || type == ScalarType::kInt4G128 || type == ScalarType::kFp8E4M3PerRow;
}

int64_t scalar_type_bytes(ScalarType type) {
  switch (type) {
    case ScalarType::kF32: return 4;
    case ScalarType::kI32: return 4;
    case ScalarType::kBF16: return 2;
    case ScalarType::kF16: return 2;
    case ScalarType::kFp8E4M3: return 1;
    case ScalarType::kQ8_0:
    case ScalarType::kQ4_0:
    case ScalarType::kQ4_1:
    case ScalarType::kInt8PerRow:
    case ScalarType::kInt4G128:
    case ScalarType::kFp8E4M3PerRow: break;
  }
  TESSERA_FAIL("scalar type " << scalar_type_name(type)
                              << " is a block or quantized format: its values have no whole byte size");
}

namespace {

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// The group of int4_g128's scale and minimum: 128 values along a row (the last may be shorter); its
// values are stored in atoms of 16 rows x 64 (the last padded).
constexpr int64_t kInt4GroupSize = 128;
constexpr int64_t kInt4AtomRows = 16;
constexpr int64_t kInt4AtomCols = 64;

}  // namespace

bool storage_holds(ScalarType type, int64_t rows, int64_t cols, std::string* why) {
  const char* need = nullptr;
  if (scalar_type_is_block(type)) {
    if (cols % 32 != 0) need = "rows of a multiple of 32 values";
  } else if (type == ScalarType::kInt4G128) {
    if (rows < 1 || cols < 1 || cols % 32 != 0) need = "a matrix of >= 1 row and a multiple of 32 columns";
  } else if (scalar_type_is_gpu_quantized(type)) {
    if (rows < 1 || cols < 1 || cols % 16 != 0) need = "a matrix of >= 1 row and a multiple of 16 columns";
  }
  if (need != nullptr && why != nullptr) {
    *why = std::string(scalar_type_name(type)) + " needs " + need + ", got [" + std::to_string(rows) + ", " +
           std::to_string(cols) + "]";
  }
  return need == nullptr;
}

int64_t storage_bytes(ScalarType type, int64_t rows, int64_t cols) {
  if (!scalar_type_is_block(type) && !scalar_type_is_gpu_quantized(type)) return rows * cols * scalar_type_bytes(type);
  std::string why;
  TESSERA_CHECK(storage_holds(type, rows, cols, &why), why);
  switch (type) {
    case ScalarType::kQ8_0: return rows * (cols / 32) * 34;
    case ScalarType::kQ4_0: return rows * (cols / 32) * 18;
    case ScalarType::kQ4_1: return rows * (cols / 32) * 20;
    // Values, then the fp32 scales at a 16-byte boundary: one per row for int8 and fp8.
    case ScalarType::kInt8PerRow:
    case ScalarType::kFp8E4M3PerRow: return align16(rows * cols) + rows * 4;
    // int4: two values a byte in whole atoms of 16 x 64, then the bf16 scales and the bf16 minimums
    // of every row and group, each at a 16-byte boundary.
    case ScalarType::kInt4G128: {
      const int64_t atoms = (rows + kInt4AtomRows - 1) / kInt4AtomRows * ((cols + kInt4AtomCols - 1) / kInt4AtomCols);
      const int64_t groups = (cols + kInt4GroupSize - 1) / kInt4GroupSize;
      return atoms * kInt4AtomRows * kInt4AtomCols / 2 + 2 * align16(rows * groups * 2);
    }
    default: break;
  }
  TESSERA_FAIL("storage_bytes: no layout for " << scalar_type_name(type));
}

int64_t Tensor::bytes() const {
  const int64_t cols = shape_.empty() ? 1 : shape_.back();
  return storage_bytes(type_, cols == 0 ? 0 : numel() / cols, cols);
}

Tensor::Tensor(std::shared_ptr<void> storage, void* data, ScalarType type, std::vector<int64_t> shape,
               DeviceKind device, std::string name)
    : storage_(std::move(storage)), data_(data), type_(type), shape_(std::move(shape)), device_(device),
      name_(std::move(name)) {}

int64_t Tensor::dim(size_t i) const {
  TESSERA_CHECK(i < shape_.size(), "tensor " << describe() << " has no dimension " << i);
  return shape_[i];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << (name_.empty() ? "<unnamed>" : name_) << " " << scalar_type_name(type_) << "[";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? ", " : "") << shape_[i];
  os << "]";
  return os.str();
}

Tensor Tensor::first_rows(int64_t count) const {
  TESSERA_CHECK(!scalar_type_is_gpu_quantized(type_),
                "tensor " << describe() << ": a quantized weight's rows cannot be viewed (its scales follow them)");
  TESSERA_CHECK(!shape_.empty() && count >= 0 && count <= shape_[0],
                "tensor " << describe() << ": cannot take its first " << count << " rows");
  std::vector<int64_t> shape = shape_;
  shape[0] = count;
  return Tensor(storage_, data_, type_, std::move(shape), device_, name_);
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  TESSERA_CHECK(!scalar_type_is_gpu_quantized(type_),
                "tensor " << describe() << ": a quantized weight's rows cannot be viewed (its scales follow them)");
  TESSERA_CHECK(!shape_.empty() && begin >= 0 && count >= 0 && begin + count <= shape_[0],
                "tensor " << describe() << ": cannot take rows [" << begin << ", " << begin + count << ")");
  std::vector<int64_t> shape = shape_;
  shape[0] = count;
  int64_t row_values = 1;
  for (size_t i = 1; i < shape_.size(); ++i) row_values *= shape_[i];
  const int64_t offset = storage_bytes(type_, begin, row_values);
  return Tensor(storage_, static_cast<char*>(data_) + offset, type_, std::move(shape), device_, name_);
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  TESSERA_CHECK(!scalar_type_is_gpu_quantized(type_), "tensor " << describe() << ": a quantized weight cannot be reshaped");
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  TESSERA_CHECK(count == numel(), "tensor " << describe() << ": cannot view its " << numel() << " values as " << count);
  return Tensor(storage_, data_, type_, std::move(shape), device_, name_);
}

float* Tensor::f32() {
  TESSERA_CHECK(type_ == ScalarType::kF32, "tensor " << describe() << " is not f32");
  return static_cast<float*>(data_);
}
const float* Tensor::f32() const {
  TESSERA_CHECK(type_ == ScalarType::kF32, "tensor " << describe() << " is not f32");
  return static_cast<const float*>(data_);
}
int32_t* Tensor::i32() {
  TESSERA_CHECK(type_ == ScalarType::kI32, "tensor " << describe() << " is not i32");
  return static_cast<int32_t*>(data_);
}
const int32_t* Tensor::i32() const {
  TESSERA_CHECK(type_ == ScalarType::kI32, "tensor " << describe() << " is not i32");
  return static_cast<const int32_t*>(data_);
}

}  // namespace tessera
