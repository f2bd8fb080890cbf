// kernels/backend/cuda/cuda_weights.cpp: CudaBackend's weights: upload from the model file (as stored
// when the file holds the backend's dtype, through fp32 otherwise), stacking, the gate/up pairs
// order, and quantization of the linear weights into config.linear_weights through the dense buffer.
#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/backend/cuda/cuda_backend_impl.h"
#include "kernels/cuda/common/host_convert.h"
#include "kernels/cuda/gemm/quantized_weights.h"

namespace tessera {

void* CudaBackend::Impl::dense_weight_buffer(size_t bytes, const std::string& name) {
  check(cudaStreamSynchronize(stream), "dense weight buffer for " + name);
  if (bytes > dense_weight_bytes) {
    TESSERA_CHECK(!capturing, "cuda: the dense weight buffer must grow during a graph capture");
    if (dense_weight != nullptr) {
      cudaFree(dense_weight);
      layout_moved();  // captured graphs may point into the old buffer
    }
    dense_weight = nullptr;
    dense_weight_bytes = 0;
    dense_weight = device_alloc(bytes, "the dense copy of " + name);
    dense_weight_bytes = bytes;
  }
  return dense_weight;
}

void CudaBackend::Impl::release_dense_weight() {
  if (dense_weight == nullptr) return;
  TESSERA_CHECK(!capturing, "cuda: the dense weight buffer must be freed during a graph capture");
  check(cudaStreamSynchronize(stream), "release the dense weight buffer");
  cudaFree(dense_weight);
  layout_moved();  // a graph captured on a fallback GEMM points into it
  dense_weight = nullptr;
  dense_weight_bytes = 0;
}

bool CudaBackend::Impl::keeps_quantized(WeightUse use, const std::vector<int64_t>& shape,
                                        const std::string& name) const {
  if (use == WeightUse::kOther || !scalar_type_is_gpu_quantized(config.linear_weights)) return false;
  TESSERA_CHECK(shape.size() == 2, "cuda: linear weight " << name << " " << shape_string(shape) << " is not a matrix");
  std::string why;
  TESSERA_CHECK(storage_holds(config.linear_weights, shape[0], shape[1], &why),
                "cuda: linear weight " << name << " cannot be kept as " << scalar_type_name(config.linear_weights)
                                       << ": " << why << " (cuda_weights: native keeps it in "
                                       << scalar_type_name(config.dtype) << ")");
  TESSERA_CHECK(
      shape[0] <= INT32_MAX && shape[1] <= INT32_MAX && shape[0] * shape[1] <= INT32_MAX,
      "cuda: linear weight " << name << " " << shape_string(shape) << " is too large for the quantized kernels");
  return true;
}

Tensor CudaBackend::Impl::quantize_dense(const void* dense, std::vector<int64_t> shape, std::string name) {
  const int n = static_cast<int>(shape[0]);
  const int k = static_cast<int>(shape[1]);
  Tensor quantized = allocate_tensor(std::move(shape), config.linear_weights, std::move(name), /*persistent=*/true);
  check(kc::quantize_weight(kdtype, dense, n, k, cuda_backend_detail::weight_format_of(config.linear_weights),
                            quantized.data(), stream),
        "quantize_weight", quantized);
  // The next upload rewrites `dense` with a copy that need not be ordered on this stream.
  check(cudaStreamSynchronize(stream), "quantize " + quantized.name());
  release_dense_weight();  // steps read the quantized weight
  ++quantized_weights;
  return quantized;
}

void CudaBackend::Impl::upload_weight(const WeightView& weight, void* dst) {
  const bool same = (weight.dtype == DType::kBF16 && config.dtype == ScalarType::kBF16) ||
                    (weight.dtype == DType::kF16 && config.dtype == ScalarType::kF16);
  if (same) {
    TESSERA_CHECK(weight.bytes.size() == static_cast<size_t>(weight.numel()) * 2,
                  "tensor '" << weight.name << "' in " << weight.source_file << ": " << weight.bytes.size()
                             << " bytes do not hold " << weight.numel() << " values");
    check(cudaMemcpyAsync(dst, weight.bytes.data(), weight.bytes.size(), cudaMemcpyHostToDevice, stream),
          "upload " + weight.name);
    check(cudaStreamSynchronize(stream), "upload " + weight.name);
    return;
  }
  const std::vector<float> values = weight.to_f32();
  std::vector<uint16_t> half(values.size());
  for (size_t i = 0; i < values.size(); ++i) half[i] = kc::to_bits(values[i], kdtype);
  // On this stream, not cudaMemcpy's legacy default stream: from pageable memory cudaMemcpy returns
  // once the bytes are staged, before the DMA lands, and this stream does not wait for that stream,
  // so the gate/up interleave or the quantization after it read a half-written weight whenever the
  // copy ran late (several servers loading on one GPU gave garbage answers).
  check(cudaMemcpyAsync(dst, half.data(), half.size() * 2, cudaMemcpyHostToDevice, stream), "upload " + weight.name);
  check(cudaStreamSynchronize(stream), "upload " + weight.name);
}

void CudaBackend::Impl::upload_pairs(const WeightView& gate, const WeightView& up, const std::vector<int64_t>& shape,
                                     void* dst, const std::string& name) {
  // Uploaded stacked into a load-time buffer, then interleaved row by row on the device (one 2-D
  // copy per part: a host-side 2-D copy from pageable memory goes row by row).
  const size_t row_bytes = static_cast<size_t>(shape[1]) * scalar_type_bytes(config.dtype);
  const size_t part_bytes = static_cast<size_t>(shape[0] / 2) * row_bytes;
  char* stacked = static_cast<char*>(device_alloc(2 * part_bytes, "the stacked copy of " + name));
  upload_weight(gate, stacked);
  upload_weight(up, stacked + part_bytes);
  for (int part = 0; part < 2; ++part) {
    check(cudaMemcpy2DAsync(static_cast<char*>(dst) + part * row_bytes, 2 * row_bytes, stacked + part * part_bytes,
                            row_bytes, row_bytes, static_cast<size_t>(shape[0] / 2), cudaMemcpyDeviceToDevice, stream),
          "interleave " + name);
  }
  check(cudaStreamSynchronize(stream), "interleave " + name);
  cudaFree(stacked);
}

Tensor CudaBackend::load_weight(const WeightView& weight, std::vector<int64_t> shape, WeightUse use) {
  Impl& gpu = *impl_;
  gpu.enter();
  check_weight_shape(weight, shape);
  Tensor t;
  if (gpu.keeps_quantized(use, shape, weight.name)) {
    // Uploaded into the dense buffer, quantized from there: one weight's bf16 copy at a time.
    void* dense = gpu.dense_weight_buffer(static_cast<size_t>(weight.numel()) * 2, weight.name);
    gpu.upload_weight(weight, dense);
    t = gpu.quantize_dense(dense, std::move(shape), weight.name);
  } else {
    t = gpu.allocate_tensor(std::move(shape), gpu.config.dtype, weight.name, /*persistent=*/true);
    gpu.upload_weight(weight, t.data());
  }
  gpu.weight_bytes += t.bytes();
  return t;
}

Tensor CudaBackend::load_stacked(std::span<const WeightView* const> parts, std::span<const std::vector<int64_t>> shapes,
                                 std::string fused_name, WeightUse use) {
  Impl& gpu = *impl_;
  gpu.enter();
  std::vector<int64_t> shape = stacked_shape(parts, shapes, fused_name);
  // linear_silu_mul's weight in pairs order: row 2j is gate row j, row 2j + 1 up row j, so that the
  // GEMV block computing one holds the other (kernels/cuda/gemm/gemv.h, gemv_silu_mul).
  const bool pairs = use == WeightUse::kGateUpSiluMul;
  if (pairs) {
    TESSERA_CHECK(parts.size() == 2 && shape.size() == 2 && shapes[0] == shapes[1],
                  "cuda: " << fused_name << " for linear_silu_mul must stack two matrices of one shape (gate, up), got "
                           << parts.size() << " parts");
  }
  // The stacked matrix is quantized as one (its rows are independent in every format).
  const bool quantized = gpu.keeps_quantized(use, shape, fused_name);
  Tensor t;
  void* base = nullptr;
  if (quantized) {
    base = gpu.dense_weight_buffer(static_cast<size_t>(cuda_backend_detail::numel_of(shape)) * 2, fused_name);
  } else {
    t = gpu.allocate_tensor(shape, gpu.config.dtype, fused_name, /*persistent=*/true);
    base = t.data();
  }
  if (pairs) {
    gpu.upload_pairs(*parts[0], *parts[1], shape, base, fused_name);
  } else {
    char* dst = static_cast<char*>(base);
    for (const WeightView* part : parts) {
      gpu.upload_weight(*part, dst);
      dst += part->numel() * scalar_type_bytes(gpu.config.dtype);
    }
  }
  if (quantized) t = gpu.quantize_dense(base, std::move(shape), std::move(fused_name));
  gpu.weight_bytes += t.bytes();
  return t;
}

}  // namespace tessera
