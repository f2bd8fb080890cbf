// kernels/cuda/rows/rows.cu: the row ops' dispatch points.
#include "kernels/cuda/rows/rows.cuh"

namespace tessera::kernels::cuda {

namespace {
std::string dtype_unsupported(DType dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kFP16)
    return "unsupported dtype: " + std::to_string(static_cast<int>(dtype)) + " (supported: bf16, fp16)";
  return "";
}
}  // namespace

std::string rows_unsupported(DType dtype, int rows, int width) {
  if (std::string e = dtype_unsupported(dtype); !e.empty()) return e;
  if (rows < 0) return "rows must be >= 0, got " + std::to_string(rows);
  if (width <= 0) return "width must be > 0, got " + std::to_string(width);
  return "";
}

std::string pool_rows_unsupported(DType dtype, int num_seqs, int width, PoolKind kind) {
  if (std::string e = rows_unsupported(dtype, num_seqs, width); !e.empty()) return e;
  if (kind != PoolKind::kMean && kind != PoolKind::kFirst && kind != PoolKind::kLast)
    return "unsupported pool kind: " + std::to_string(static_cast<int>(kind));
  if (width > 65535LL * 128) return "width too large for pooling: " + std::to_string(width);
  return "";
}

std::string convert_unsupported(DType dtype, int64_t n) {
  if (std::string e = dtype_unsupported(dtype); !e.empty()) return e;
  if (n < 0) return "n must be >= 0, got " + std::to_string(n);
  return "";
}

cudaError_t gather_rows(DType dtype, void* out, const void* x, const int32_t* rows, int num_rows, int width,
                        cudaStream_t stream) {
  if (!rows_unsupported(dtype, num_rows, width).empty()) return cudaErrorInvalidValue;
  return launch_gather_rows(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x), rows, num_rows, width,
                            stream);
}

cudaError_t pool_rows(DType dtype, void* out, const void* x, const int32_t* cu_seqlens, int num_seqs, int width,
                      PoolKind kind, cudaStream_t stream) {
  if (!pool_rows_unsupported(dtype, num_seqs, width, kind).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_pool_rows<scalar_t>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x), cu_seqlens,
                                      num_seqs, width, kind, stream);
  });
}

cudaError_t l2_normalize_rows(DType dtype, void* x, int rows, int width, float eps, cudaStream_t stream) {
  if (!rows_unsupported(dtype, rows, width).empty() || !(eps >= 0.f)) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(
      dtype, [&] { return launch_l2_normalize_rows<scalar_t>(static_cast<scalar_t*>(x), rows, width, eps, stream); });
}

cudaError_t softmax_rows(DType dtype, void* x, int rows, int width, cudaStream_t stream) {
  if (!rows_unsupported(dtype, rows, width).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(
      dtype, [&] { return launch_softmax_rows<scalar_t>(static_cast<scalar_t*>(x), rows, width, stream); });
}

cudaError_t convert_to_f32(DType dtype, float* out, const void* x, int64_t n, cudaStream_t stream) {
  if (!convert_unsupported(dtype, n).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(
      dtype, [&] { return launch_convert_to_f32<scalar_t>(out, static_cast<const scalar_t*>(x), n, stream); });
}

cudaError_t convert_from_f32(DType dtype, void* out, const float* x, int64_t n, cudaStream_t stream) {
  if (!convert_unsupported(dtype, n).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(
      dtype, [&] { return launch_convert_from_f32<scalar_t>(static_cast<scalar_t*>(out), x, n, stream); });
}

}  // namespace tessera::kernels::cuda
