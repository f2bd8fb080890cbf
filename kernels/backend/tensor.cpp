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
  }
  return "?";
}

bool scalar_type_is_block(ScalarType type) {
  return type == ScalarType::kQ8_0 || type == ScalarType::kQ4_0 || type == ScalarType::kQ4_1;
}

int64_t scalar_type_bytes(ScalarType type) {
  switch (type) {
    case ScalarType::kF32: return 4;
    case ScalarType::kI32: return 4;
    case ScalarType::kBF16: return 2;
    case ScalarType::kF16: return 2;
    case ScalarType::kQ8_0:
    case ScalarType::kQ4_0:
    case ScalarType::kQ4_1: break;
  }
  TESSERA_FAIL("scalar type " << scalar_type_name(type) << " is a block format: its values have no whole byte size");
}

int64_t storage_bytes(ScalarType type, int64_t rows, int64_t cols) {
  if (!scalar_type_is_block(type)) return rows * cols * scalar_type_bytes(type);
  TESSERA_CHECK(cols % 32 == 0, scalar_type_name(type) << " rows need a multiple of 32 values, got " << cols);
  const int64_t block_bytes = type == ScalarType::kQ8_0 ? 34 : type == ScalarType::kQ4_0 ? 18 : 20;
  return rows * (cols / 32) * block_bytes;
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
  TESSERA_CHECK(!shape_.empty() && count >= 0 && count <= shape_[0],
                "tensor " << describe() << ": cannot take its first " << count << " rows");
  std::vector<int64_t> shape = shape_;
  shape[0] = count;
  return Tensor(storage_, data_, type_, std::move(shape), device_, name_);
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  TESSERA_CHECK(!shape_.empty() && begin >= 0 && count >= 0 && begin + count <= shape_[0],
                "tensor " << describe() << ": cannot take rows [" << begin << ", " << begin + count << ")");
  std::vector<int64_t> shape = shape_;
  shape[0] = count;
  int64_t row_values = 1;
  for (size_t i = 1; i < shape_.size(); ++i) row_values *= shape_[i];
  const int64_t offset = storage_bytes(type_, begin, row_values);
  return Tensor(storage_, static_cast<char*>(data_) + offset, type_, std::move(shape), device_, name_);
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
