// kernels/cuda/common/kernel_attributes.cuh: kernel attributes that are set once per device. An
// attribute such as the dynamic shared memory limit belongs to the device it was set on: a process
// that drives several GPUs (the ranks of a tensor-parallel group) must set it on each before the
// first launch there.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <tuple>

namespace tessera::kernels::cuda {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) on the current device, the first
// time this kernel launches there with this size; cudaSuccess afterwards.
inline cudaError_t allow_dynamic_shared_memory(const void* kernel, int bytes) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, int>> done;
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.contains({kernel, device, bytes})) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done.insert({kernel, device, bytes});
  return e;
}

}  // namespace tessera::kernels::cuda
