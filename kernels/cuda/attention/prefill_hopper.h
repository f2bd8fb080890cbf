// kernels/cuda/attention/prefill_hopper.h: the Hopper (sm_90a wgmma) prefill kernel's entry points,
// used by prefill.cu's dispatch.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention/attention.h"

namespace tessera::kernels::cuda {

bool hopper_prefill_supported(DType dtype, const PrefillArgs& args);
cudaError_t launch_prefill_hopper(DType dtype, const PrefillArgs& args, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
