// kernels/cuda/attention/prefill_hopper.cu: the Hopper prefill kernel's instances, its TMA
// descriptors and its support check. It runs only where the device is sm_90 and the build carries
// sm_90a code (TESSERA_CUDA_SM90A, set by kernels/cuda/CMakeLists.txt when CMAKE_CUDA_ARCHITECTURES
// names 90a).
#include <cudaTypedefs.h>

#include <type_traits>

#include "kernels/cuda/attention/prefill_hopper.cuh"
#include "kernels/cuda/attention/prefill_hopper.h"

namespace tessera::kernels::cuda {

namespace {
#if defined(TESSERA_CUDA_SM90A)
bool device_is_hopper() {
  static const bool hopper = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
    return major == 9 && minor == 0;
  }();
  return hopper;
}
#endif

// The driver's tensor-map encoder, reached through the runtime so that nothing links libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// A [rows, columns] matrix of 16-bit values, row_stride elements apart, read in boxes of 64 columns
// (one 128-byte swizzled panel) by box_rows rows.
template <typename T>
bool encode_rows(CUtensorMap& map, const void* base, int64_t columns, int64_t rows, int64_t row_stride, int box_rows) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, int kHeadDim, int kConsumerWgs = kDefaultHopperConsumers<kHeadDim>>
cudaError_t launch_with_tensor_maps(const PrefillArgs& a, cudaStream_t stream) {
  using Cfg = HopperPrefillConfig<kHeadDim, kConsumerWgs>;
  HopperTensorMaps maps;
  const int64_t q_columns = static_cast<int64_t>(a.num_heads) * kHeadDim;
  const int64_t kv_columns = static_cast<int64_t>(a.num_kv_heads) * kHeadDim;
  if (!encode_rows<T>(maps.q, a.q, q_columns, a.total_q, a.q_row_stride, Cfg::kBlockM) ||
      !encode_rows<T>(maps.k, a.k, kv_columns, a.total_k, a.k_row_stride, Cfg::kBlockN) ||
      !encode_rows<T>(maps.v, a.v, kv_columns, a.total_k, a.v_row_stride, Cfg::kBlockN)) {
    return cudaErrorInvalidValue;
  }
  int num_sms = a.num_sms;
  if (num_sms <= 0) {
    int device = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    if (const cudaError_t e = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
      return e;
  }
  return launch_prefill_hopper_typed<T, kHeadDim, kConsumerWgs>(a, maps, num_sms, stream);
}
}  // namespace

bool hopper_prefill_supported(DType dtype, const PrefillArgs& args) {
#if defined(TESSERA_CUDA_SM90A)
  return (dtype == DType::kBF16 || dtype == DType::kFP16) &&
         (args.head_dim == 64 || args.head_dim == 128 || args.head_dim == 256) && args.total_q > 0 &&
         args.total_k > 0 && device_is_hopper() && tensor_map_encoder() != nullptr;
#else
  (void)dtype;
  (void)args;
  return false;  // no sm_90a code in this build (CMAKE_CUDA_ARCHITECTURES without 90a)
#endif
}

cudaError_t launch_prefill_hopper(DType dtype, const PrefillArgs& args, cudaStream_t stream) {
  return TESSERA_DISPATCH_DTYPE(dtype, [&]() -> cudaError_t {
    if (args.head_dim == 256) return launch_with_tensor_maps<scalar_t, 256>(args, stream);
    if (args.head_dim == 128) return launch_with_tensor_maps<scalar_t, 128>(args, stream);
    if (args.head_dim == 64 && args.max_seqlen_q <= 128) return launch_with_tensor_maps<scalar_t, 64, 2>(args, stream);
    if (args.head_dim == 64) return launch_with_tensor_maps<scalar_t, 64>(args, stream);
    return cudaErrorInvalidValue;
  });
}

}  // namespace tessera::kernels::cuda
