// kernels/backend/cuda/cuda_memory.cpp: CudaBackend's device memory: allocations that own their
// memory (weights, tables, KV caches), the step workspace (a bump arena reset by each prepare_plan,
// out of which a step's tensors come), the plan's staging buffer, the decode workspace, and the
// copies between host and device.
#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/backend/cuda/cuda_backend_impl.h"
#include "kernels/cuda/common/host_convert.h"

namespace tessera {

using cuda_backend_detail::kAlign;
using cuda_backend_detail::round_up;

void* CudaBackend::Impl::device_alloc(size_t bytes, const std::string& name) {
  void* ptr = nullptr;
  const cudaError_t e = cudaMalloc(&ptr, std::max<size_t>(bytes, 1));
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    TESSERA_FAIL("cuda: out of device memory allocating " << bytes << " bytes for " << name << " (" << free_bytes
                                                          << " of " << total_bytes << " bytes free)");
  }
  return ptr;
}

void* CudaBackend::Impl::workspace_slice(size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1), kAlign);
  if (workspace_chunks.empty() || workspace_used + bytes > workspace_chunks.back().bytes) {
    TESSERA_CHECK(!capturing, "cuda: the step workspace must grow during a graph capture");
    const size_t grow = std::max(bytes, workspace_chunks.empty() ? size_t{64} << 20 : workspace_chunks.back().bytes);
    workspace_chunks.push_back({device_alloc(grow, "the step workspace"), grow});
    workspace_used = 0;
  }
  void* slice = static_cast<char*>(workspace_chunks.back().ptr) + workspace_used;
  workspace_used += bytes;
  return slice;
}

void CudaBackend::Impl::reset_workspace() {
  if (workspace_chunks.size() > 1) {
    size_t total = 0;
    for (const Chunk& chunk : workspace_chunks) total += chunk.bytes;
    check(cudaStreamSynchronize(stream), "step workspace resize");
    for (const Chunk& chunk : workspace_chunks) cudaFree(chunk.ptr);
    workspace_chunks.clear();
    workspace_chunks.push_back({device_alloc(total, "the step workspace"), total});
    layout_moved();
  }
  workspace_used = 0;
}

Tensor CudaBackend::Impl::allocate_tensor(std::vector<int64_t> shape, ScalarType type, std::string name,
                                          bool persistent) {
  for (int64_t d : shape) {
    TESSERA_CHECK(d >= 0, "cuda empty: tensor " << name << " has a negative dimension " << shape_string(shape));
  }
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const size_t bytes =
      static_cast<size_t>(storage_bytes(type, cols == 0 ? 0 : cuda_backend_detail::numel_of(shape) / cols, cols));
  if (!persistent) {
    void* slice = workspace_slice(bytes);
    return Tensor(nullptr, slice, type, std::move(shape), DeviceKind::kCuda, std::move(name));
  }
  void* ptr = device_alloc(bytes, name);
  check(cudaMemsetAsync(ptr, 0, std::max<size_t>(bytes, 1), stream), "memset " + name);
  std::shared_ptr<void> storage(ptr, [device_frees = device_frees](void* freed) {
    cudaFree(freed);
    device_frees->fetch_add(1);
  });
  return Tensor(std::move(storage), ptr, type, std::move(shape), DeviceKind::kCuda, std::move(name));
}

void* CudaBackend::Impl::step_shared_buffer(void* StepState::*ptr, size_t StepState::*have, size_t bytes) {
  if (current_step == nullptr || !in_step) return workspace_slice(bytes);
  StepState& step = *current_step;
  if (step.*have < bytes) {
    step.*ptr = workspace_slice(bytes);
    step.*have = bytes;
  }
  return step.*ptr;
}

void CudaBackend::Impl::reserve_staging(size_t bytes) {
  // The previous step's copy must have read the host buffer before it is rewritten or freed.
  check(cudaEventSynchronize(staging_copied), "staging");
  if (bytes <= staging_bytes) return;
  if (staging_host != nullptr) cudaFreeHost(staging_host);
  if (staging_device != nullptr) {
    check(cudaStreamSynchronize(stream), "staging resize");
    cudaFree(staging_device);
  }
  const size_t grown = round_up(bytes * 2, size_t{1} << 16);
  check(cudaMallocHost(&staging_host, grown), "pinned staging buffer");
  staging_device = device_alloc(grown, "the step staging buffer");
  staging_bytes = grown;
  layout_moved();  // captured graphs point into the old buffer
}

const kc::DecodeWorkspace& CudaBackend::Impl::decode_workspace_for(const kc::DecodeArgs& args) {
  const kc::DecodeWorkspaceNeed need = kc::decode_workspace_need(args, num_sms);
  if (need.partial_bytes > decode_workspace.partial_bytes || need.counters > decode_workspace.counter_count) {
    // Grown rarely (a larger batch or context than any before); the counters must start at zero.
    TESSERA_CHECK(!capturing, "cuda: the decode workspace must grow during a graph capture");
    check(cudaStreamSynchronize(stream), "decode workspace resize");
    layout_moved();
    if (decode_workspace_memory != nullptr) cudaFree(decode_workspace_memory);
    const int64_t counters = std::max<int64_t>(2 * need.counters, decode_workspace.counter_count);
    const size_t counter_bytes = round_up(static_cast<size_t>(counters) * sizeof(int), kAlign);
    const size_t partial_bytes = round_up(std::max(2 * need.partial_bytes, decode_workspace.partial_bytes), kAlign);
    decode_workspace_memory = device_alloc(counter_bytes + partial_bytes, "the decode workspace");
    check(cudaMemsetAsync(decode_workspace_memory, 0, counter_bytes + partial_bytes, stream), "decode workspace");
    decode_workspace.counters = static_cast<int*>(decode_workspace_memory);
    decode_workspace.counter_count = counters;
    decode_workspace.partials = static_cast<char*>(decode_workspace_memory) + counter_bytes;
    decode_workspace.partial_bytes = partial_bytes;
  }
  return decode_workspace;
}

Tensor CudaBackend::empty(std::vector<int64_t> shape, ScalarType type, std::string name) {
  if (impl_->in_step) {
    impl_->check_healthy();
  } else {
    impl_->enter();
  }
  return impl_->allocate_tensor(std::move(shape), type, std::move(name), /*persistent=*/!impl_->in_step);
}

Tensor CudaBackend::upload(std::span<const float> host, std::vector<int64_t> shape, std::string name) {
  // Float tables (RoPE frequencies) belong to a model, even one loaded after a step has run.
  impl_->enter();
  Tensor t = impl_->allocate_tensor(std::move(shape), ScalarType::kF32, std::move(name), /*persistent=*/true);
  TESSERA_CHECK(static_cast<int64_t>(host.size()) == t.numel(),
                "cuda upload: " << host.size() << " values for " << t.describe());
  impl_->check(cudaMemcpyAsync(t.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, impl_->stream),
               "upload " + t.name());
  return t;
}

Tensor CudaBackend::upload(std::span<const int32_t> host, std::vector<int64_t> shape, std::string name) {
  Tensor t = empty(std::move(shape), ScalarType::kI32, std::move(name));
  TESSERA_CHECK(static_cast<int64_t>(host.size()) == t.numel(),
                "cuda upload: " << host.size() << " values for " << t.describe());
  impl_->check(cudaMemcpyAsync(t.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, impl_->stream),
               "upload " + t.name());
  return t;
}

std::vector<float> CudaBackend::download(const Tensor& tensor) {
  Impl& gpu = *impl_;
  gpu.enter();
  TESSERA_CHECK(tensor.defined() && tensor.device() == DeviceKind::kCuda,
                "cuda download: " << tensor.describe() << " is not a device tensor");
  const size_t n = static_cast<size_t>(tensor.numel());
  std::vector<float> out(n);
  if (tensor.type() == ScalarType::kF32) {
    gpu.check(cudaMemcpyAsync(out.data(), tensor.data(), n * 4, cudaMemcpyDeviceToHost, gpu.stream), "download");
    gpu.check(cudaStreamSynchronize(gpu.stream), "download " + tensor.name());
    return out;
  }
  TESSERA_CHECK(tensor.type() == ScalarType::kBF16 || tensor.type() == ScalarType::kF16,
                "cuda download: " << tensor.describe() << " is not a float tensor");
  std::vector<uint16_t> half(n);
  gpu.check(cudaMemcpyAsync(half.data(), tensor.data(), n * 2, cudaMemcpyDeviceToHost, gpu.stream), "download");
  gpu.check(cudaStreamSynchronize(gpu.stream), "download " + tensor.name());
  for (size_t i = 0; i < n; ++i) out[i] = kc::from_bits(half[i], cuda_backend_detail::kernel_dtype(tensor.type()));
  return out;
}

KvCacheStorage CudaBackend::create_kv_cache(int64_t num_layers, int32_t num_blocks, int32_t block_size,
                                            int32_t num_kv_heads, int32_t head_dim) {
  Impl& gpu = *impl_;
  gpu.enter();
  KvCacheStorage cache = make_kv_cache("cuda", num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                                       [&](std::vector<int64_t> shape, std::string name) {
                                         Tensor t = gpu.allocate_tensor(std::move(shape), gpu.kv_type, std::move(name),
                                                                        /*persistent=*/true);
                                         gpu.kv_bytes += t.bytes();
                                         return t;
                                       });
  gpu.check(cudaStreamSynchronize(gpu.stream), "create_kv_cache");
  return cache;
}

}  // namespace tessera
