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

// The paged KV cache's element type, beside the activation dtype: the activation dtype itself, or
// OCP fp8 e4m3 (one byte a value, saturating at +-448, no scale), which halves the cache's bytes and
// its read traffic in decode. Kernels take fp8 KV with bf16 activations only (the one pairing the
// server runs: quantized formats need bf16), so only those instances are compiled.
enum class KvDType : int32_t { kActivation = 0, kFp8E4M3 = 1 };

// Names an unsupported (activation dtype, KV dtype) pair, or "".
inline std::string kv_dtype_unsupported(DType dtype, KvDType kv) {
  if (kv == KvDType::kActivation) return "";
  if (kv != KvDType::kFp8E4M3) return "unsupported kv dtype: " + std::to_string(static_cast<int>(kv));
  if (dtype != DType::kBF16)
    return std::string("kv dtype fp8_e4m3 needs bf16 activations, got ") + dtype_name(dtype);
  return "";
}

}  // namespace tessera::kernels::cuda
