// kernels/cuda/attention/prefill_hopper.cu: the Hopper prefill kernel's instances and its support
// check. It runs only where the device is sm_90 and the build carries sm_90a code.
#include "kernels/cuda/attention/prefill_hopper.cuh"
#include "kernels/cuda/attention/prefill_hopper.h"

namespace tessera::kernels::cuda {

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

bool hopper_prefill_supported(DType dtype, const PrefillArgs& args) {
  return (dtype == DType::kBF16 || dtype == DType::kFP16) && (args.head_dim == 64 || args.head_dim == 128) &&
         device_is_hopper();
}

cudaError_t launch_prefill_hopper(DType dtype, const PrefillArgs& args, cudaStream_t stream) {
  return TESSERA_DISPATCH_DTYPE(dtype, [&]() -> cudaError_t {
    if (args.head_dim == 128) return launch_prefill_hopper_typed<scalar_t, 128>(args, stream);
    if (args.head_dim == 64) return launch_prefill_hopper_typed<scalar_t, 64>(args, stream);
    return cudaErrorInvalidValue;
  });
}

}  // namespace tessera::kernels::cuda
