// kernels/cuda/gemm/cutlass_gemm.cuh: what the CUTLASS GEMM files (w8a8_gemm.cu, int4_gemm.cu) share:
// the headers their sm90 kernels are built from, the names and operand check they use, and the one way
// a configured kernel is launched.
// Included only by those files, which build in the tessera_cutlass_gemm library (CUTLASS's headers
// do not build warning-free under the project's -Werror).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace tessera::kernels::cuda {

// The output type, epilogue namespace and rounding both GEMM files build their kernels from.
using Bf16 = cutlass::bfloat16_t;
namespace fusion = cutlass::epilogue::fusion;
inline constexpr auto kRoundToNearest = cutlass::FloatRoundStyle::round_to_nearest;

// Whether every operand starts on 16 bytes, as the TMA's rows must.
inline bool aligned16(std::initializer_list<const void*> operands) {
  for (const void* p : operands)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Runs a GemmUniversalAdapter on `stream` with `args`. cudaErrorNotSupported when the kernel does not
// take the arguments or needs more workspace than given (the caller then takes a bf16 path); the
// launch's own CUDA error otherwise, so a failure is never reported as a stale message.
template <class Gemm>
cudaError_t run_cutlass_gemm(const typename Gemm::Arguments& args, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream) {
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess || Gemm::get_workspace_size(args) > workspace_bytes)
    return cudaErrorNotSupported;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
  const cutlass::Status status = gemm.run(stream);
  const cudaError_t launch = cudaGetLastError();
  return status == cutlass::Status::kSuccess ? launch : (launch != cudaSuccess ? launch : cudaErrorLaunchFailure);
}

}  // namespace tessera::kernels::cuda
