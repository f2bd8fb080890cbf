// kernels/backend/cuda/cuda_backend.cpp: CudaBackend's construction, its error checks, and what it
// reports (device, sizes, counters). The rest lives by concern beside it (cuda_backend_impl.h lists
// the files).
#include "kernels/backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <sstream>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend_impl.h"

namespace tessera {

namespace {

// Errors after which the CUDA context is unusable: every later call fails with the same error.
bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout: return true;
    default: return false;
  }
}

}  // namespace

namespace cuda_backend_detail {

kc::DType kernel_dtype(ScalarType t) {
  TESSERA_CHECK(t == ScalarType::kBF16 || t == ScalarType::kF16,
                "cuda backend: dtype " << scalar_type_name(t) << " is not an activation dtype (bf16 or f16)");
  return t == ScalarType::kBF16 ? kc::DType::kBF16 : kc::DType::kFP16;
}

kc::WeightFormat weight_format_of(ScalarType t) {
  switch (t) {
    case ScalarType::kInt8PerRow: return kc::WeightFormat::kInt8;
    case ScalarType::kInt4G128: return kc::WeightFormat::kInt4G128;
    case ScalarType::kFp8E4M3PerRow: return kc::WeightFormat::kFp8E4M3;
    default: break;
  }
  TESSERA_FAIL("cuda backend: " << scalar_type_name(t) << " is not a GPU weight-only format");
}

}  // namespace cuda_backend_detail

void CudaBackendConfig::validate() const {
  TESSERA_CHECK(device >= 0, "cuda backend: device must be >= 0, got " << device);
  TESSERA_CHECK(dtype == ScalarType::kBF16 || dtype == ScalarType::kF16,
                "cuda backend: dtype must be bf16 or f16, got " << scalar_type_name(dtype));
  TESSERA_CHECK(linear_weights == dtype || scalar_type_is_gpu_quantized(linear_weights),
                "cuda backend: linear_weights must be the dtype ("
                    << scalar_type_name(dtype) << ": unquantized), int8, int4_g128 or fp8_e4m3, got "
                    << scalar_type_name(linear_weights));
  TESSERA_CHECK(!scalar_type_is_gpu_quantized(linear_weights) || dtype == ScalarType::kBF16,
                "cuda backend: linear_weights "
                    << scalar_type_name(linear_weights)
                    << " needs dtype bf16 (the quantized kernels take bf16 activations), got dtype "
                    << scalar_type_name(dtype));
  TESSERA_CHECK(decode_split_min_tokens == 0 || (decode_split_min_tokens >= 32 && decode_split_min_tokens <= 1024 &&
                                                 decode_split_min_tokens % 32 == 0),
                "cuda backend: decode_split_min_tokens must be 0 (the kernel's default) or a multiple of 32 in "
                "[32, 1024], got "
                    << decode_split_min_tokens);
  if (kv_cache_dtype.has_value()) {
    TESSERA_CHECK(*kv_cache_dtype == dtype || *kv_cache_dtype == ScalarType::kFp8E4M3,
                  "cuda backend: kv_cache_dtype must be the dtype ("
                      << scalar_type_name(dtype) << ") or e4m3 (fp8_e4m3), got " << scalar_type_name(*kv_cache_dtype));
    TESSERA_CHECK(*kv_cache_dtype != ScalarType::kFp8E4M3 || dtype == ScalarType::kBF16,
                  "cuda backend: kv_cache_dtype fp8_e4m3 needs dtype bf16 (the fp8 KV kernels take bf16 "
                  "activations), got dtype "
                      << scalar_type_name(dtype));
  }
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for the caller
    return 0;
  }
  return count;
}

std::string cuda_device_description(int device) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  TESSERA_CHECK(e == cudaSuccess, "cuda device " << device << ": " << cudaGetErrorString(e));
  std::ostringstream os;
  os << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount << " SMs, "
     << static_cast<double>(prop.totalGlobalMem) / (1u << 30) << " GiB)";
  return os.str();
}

void CudaBackend::Impl::check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  if (is_sticky(e)) {
    failed = true;
    failure = what + ": " + cudaGetErrorString(e);
    TESSERA_FAIL("cuda backend failed (sticky CUDA error, restart required): " << failure);
  }
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  TESSERA_FAIL("cuda " << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")");
}

CudaBackend::CudaBackend(CudaBackendConfig config) : impl_(std::make_unique<Impl>()) {
  config.validate();
  const int count = cuda_device_count();
  TESSERA_CHECK(count > 0,
                "backend cuda: no CUDA GPU is visible (check the driver, CUDA_VISIBLE_DEVICES, or use "
                "backend cpu)");
  TESSERA_CHECK(config.device < count,
                "backend cuda: device " << config.device << " does not exist (" << count << " visible)");
  Impl& gpu = *impl_;
  gpu.config = config;
  gpu.kdtype = cuda_backend_detail::kernel_dtype(config.dtype);
  gpu.kv_type = config.kv_cache_dtype.value_or(config.dtype);
  gpu.kv_kdtype = gpu.kv_type == ScalarType::kFp8E4M3 ? kc::KvDType::kFp8E4M3 : kc::KvDType::kActivation;
  gpu.check(cudaSetDevice(config.device), "set device");
  gpu.check(cudaDeviceGetAttribute(&gpu.num_sms, cudaDevAttrMultiProcessorCount, config.device), "device attributes");
  gpu.check(cudaStreamCreateWithFlags(&gpu.stream, cudaStreamNonBlocking), "stream");
  gpu.check(cudaEventCreateWithFlags(&gpu.staging_copied, cudaEventDisableTiming), "event");
  gpu.prefill_tile_counters = static_cast<int*>(gpu.device_alloc(2 * sizeof(int), "the prefill tile counters"));
  gpu.check(cudaMemsetAsync(gpu.prefill_tile_counters, 0, 2 * sizeof(int), gpu.stream), "prefill tile counters");
  gpu.check(gpu.gemm_runner.init(), "cuBLASLt init " + gpu.gemm_runner.last_error());
  gpu.use_row_bits(cuda_backend_detail::gemv_row_bits(config, nullptr));
  gpu.description = cuda_device_description(config.device);
}

CudaBackend::~CudaBackend() {
  Impl& gpu = *impl_;
  if (gpu.stream != nullptr && !gpu.collectives_aborted) cudaStreamSynchronize(gpu.stream);
  gpu.drop_graphs();
  gpu.leave_group();
  for (const Impl::Chunk& chunk : gpu.workspace_chunks) cudaFree(chunk.ptr);
  if (gpu.staging_device != nullptr) cudaFree(gpu.staging_device);
  if (gpu.staging_host != nullptr) cudaFreeHost(gpu.staging_host);
  if (gpu.prefill_tile_counters != nullptr) cudaFree(gpu.prefill_tile_counters);
  if (gpu.decode_workspace_memory != nullptr) cudaFree(gpu.decode_workspace_memory);
  if (gpu.dense_weight != nullptr) cudaFree(gpu.dense_weight);
  if (gpu.sampling_workspace != nullptr) cudaFree(gpu.sampling_workspace);
  if (gpu.sample_device != nullptr) cudaFree(gpu.sample_device);
  if (gpu.sample_host != nullptr) cudaFreeHost(gpu.sample_host);
  if (gpu.staging_copied != nullptr) cudaEventDestroy(gpu.staging_copied);
  if (gpu.stream != nullptr) cudaStreamDestroy(gpu.stream);
}

ScalarType CudaBackend::activation_type() const { return impl_->config.dtype; }
ScalarType CudaBackend::kv_cache_type() const { return impl_->kv_type; }
std::string CudaBackend::failure() const {
  if (impl_->failure.empty() && impl_->collectives_aborted) return Impl::kGroupAborted;
  return impl_->failure;
}
int64_t CudaBackend::graph_replays() const { return impl_->replays; }
int64_t CudaBackend::graphs_captured() const { return impl_->captured; }
int64_t CudaBackend::workspace_regrowths() const { return impl_->regrowths; }
int64_t CudaBackend::quantized_gemms() const { return impl_->quantized_gemms; }
int64_t CudaBackend::dequantized_gemms() const { return impl_->dequantized_gemms; }
int64_t CudaBackend::dense_weight_buffer_bytes() const { return static_cast<int64_t>(impl_->dense_weight_bytes); }
std::string CudaBackend::device_description() const { return impl_->description; }
int64_t CudaBackend::weight_bytes() const { return impl_->weight_bytes; }

std::optional<int64_t> CudaBackend::free_device_bytes() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(impl_->config.device) != cudaSuccess) return std::nullopt;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return std::nullopt;
  return static_cast<int64_t>(free_bytes);
}

std::string CudaBackend::describe() const {
  const Impl& gpu = *impl_;
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (int64_t{1} << 30); };
  std::ostringstream os;
  os.precision(3);
  os << "cuda: " << gpu.description << ", " << scalar_type_name(activation_type()) << ", linear weights "
     << scalar_type_name(gpu.config.linear_weights);
  if (scalar_type_is_gpu_quantized(gpu.config.linear_weights)) os << " (" << gpu.quantized_weights << " tensors)";
  if (gpu.config.decode_split_min_tokens != 0)
    os << ", decode splits >= " << gpu.config.decode_split_min_tokens << " tokens";
  if (gpu.config.batch_invariant_decode) os << ", batch-invariant decode";
  os << ", weights " << gib(gpu.weight_bytes) << " GiB, KV cache "
     << (gpu.kv_type == ScalarType::kFp8E4M3 ? "fp8_e4m3" : scalar_type_name(gpu.kv_type)) << " " << gib(gpu.kv_bytes)
     << " GiB, free " << gib(free_device_bytes().value_or(0)) << " GiB";
  return os.str();
}

}  // namespace tessera
