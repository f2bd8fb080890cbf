// kernels/cuda/common/dtype.h: the activation dtypes the CUDA kernels take, and the status helpers
// every dispatch point shares. Host-only code may include this (no CUDA headers needed).
#pragma once

#include <cstdint>
#include <string>

namespace tessera::kernels::cuda {

enum class DType : int32_t { kBF16 = 0, kFP16 = 1 };

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
  }
  return "unknown";
}

}  // namespace tessera::kernels::cuda
