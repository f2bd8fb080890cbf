// kernels/cuda/attention/prefill_hopper.cu: placeholder until the wgmma kernel lands.
#include "kernels/cuda/attention/prefill_hopper.h"

namespace tessera::kernels::cuda {
bool hopper_prefill_supported(DType, const PrefillArgs&) { return false; }
cudaError_t launch_prefill_hopper(DType, const PrefillArgs&, cudaStream_t) { return cudaErrorNotSupported; }
}  // namespace tessera::kernels::cuda
