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
  }
  return "?";
}

int64_t scalar_type_bytes(ScalarType type) {
  switch (type) {
    case ScalarType::kF32: return 4;
    case ScalarType::kI32: return 4;
    case ScalarType::kBF16: return 2;
    case ScalarType::kF16: return 2;
  }
  return 0;
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
