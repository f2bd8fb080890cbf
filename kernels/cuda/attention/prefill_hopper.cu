// kernels/cuda/attention/prefill_hopper.cu: the Hopper prefill kernel's instances and its support
// check. It runs only where the device is sm_90 and the build carries sm_90a code
// (TESSERA_CUDA_SM90A, set by kernels/cuda/CMakeLists.txt when CMAKE_CUDA_ARCHITECTURES names 90a).
#include "kernels/cuda/attention/prefill_hopper.cuh"
#include "kernels/cuda/attention/prefill_hopper.h"

namespace tessera::kernels::cuda {

#if defined(TESSERA_CUDA_SM90A)
namespace {
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
}  // namespace
#endif

bool hopper_prefill_supported(DType dtype, const PrefillArgs& args) {
#if defined(TESSERA_CUDA_SM90A)
  return (dtype == DType::kBF16 || dtype == DType::kFP16) && (args.head_dim == 64 || args.head_dim == 128 || args.head_dim == 256) &&
         device_is_hopper();
#else
  (void)dtype;
  (void)args;
  return false;  // no sm_90a code in this build (CMAKE_CUDA_ARCHITECTURES without 90a)
#endif
}

cudaError_t launch_prefill_hopper(DType dtype, const PrefillArgs& args, cudaStream_t stream) {
  return TESSERA_DISPATCH_DTYPE(dtype, [&]() -> cudaError_t {
    if (args.head_dim == 256) return launch_prefill_hopper_typed<scalar_t, 256>(args, stream);
    if (args.head_dim == 128) return launch_prefill_hopper_typed<scalar_t, 128>(args, stream);
    if (args.head_dim == 64) return launch_prefill_hopper_typed<scalar_t, 64>(args, stream);
    return cudaErrorInvalidValue;
  });
}

}  // namespace tessera::kernels::cuda
