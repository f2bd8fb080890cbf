// kernels/cuda/collectives/oneshot_allreduce.cu: the one-shot all-reduce + add + RMSNorm (see
// oneshot_allreduce.h).
#include "kernels/cuda/collectives/oneshot_allreduce.h"

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

namespace {

__device__ __forceinline__ void store_release_system(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_system(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

constexpr int kThreads = 512;
// Spins between two reads of the abort flag, which lives in host memory: each read crosses PCIe,
// so reading it every spin would slow the wait for a peer's flag.
constexpr int kSpinsPerAbortCheck = 256;

// One block per row. A row's calls are counted in self.calls[row], the same on every rank, so that
// call c of a row waits for flag value c from each peer and uses buffer half c % 2: a peer may run
// one call ahead (it raised its flag and went on) but not two, as its next call waits for this one.
// Each rank pushes its row into every peer's buffer (slot: its rank) before raising its flag there,
// so a rank that sees a peer's flag reads the peer's row from its own memory: the exchange costs
// one crossing of NVLink, not a flag's crossing and then a read's round trip.
template <typename T>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(OneShotRank self, T* x, T* residual,
                                                           const T* __restrict__ weight, int hidden, float eps) {
  __shared__ float scratch[32];
  __shared__ uint32_t call_shared;
  const int row = blockIdx.x;
  const int num_vecs = hidden / 8;
  if (threadIdx.x == 0) call_shared = self.calls[row] + 1;
  __syncthreads();
  const uint32_t call = call_shared;
  constexpr int64_t kSlot = kOneShotMaxBytes / static_cast<int64_t>(sizeof(T));  // one source rank's rows
  const int64_t half = (call & 1u) * self.ranks * kSlot;
  const int64_t row_at = static_cast<int64_t>(row) * hidden;
  uint4* x_row = reinterpret_cast<uint4*>(x + row_at);
  for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    const uint4 value = x_row[v];
    for (int r = 0; r < self.ranks; ++r) {
      if (r == self.rank) continue;
      reinterpret_cast<uint4*>(static_cast<T*>(self.buffers[r]) + half + self.rank * kSlot + row_at)[v] = value;
    }
  }
  __threadfence_system();  // this thread's pushes are visible to the peers before any flag is
  __syncthreads();
  // Raise this row's flag at every peer, then wait for every peer's (thread p speaks with rank p).
  const int p = threadIdx.x;
  if (p < self.ranks && p != self.rank) {
    store_release_system(self.flags[p] + row * kOneShotMaxRanks + self.rank, call);
    const uint32_t* theirs = self.flags[self.rank] + row * kOneShotMaxRanks + p;
    for (int spins = 1; static_cast<int32_t>(load_acquire_system(theirs) - call) < 0; ++spins) {
      if (spins % kSpinsPerAbortCheck == 0 && load_acquire_system(self.aborted) != 0) break;
    }
  }
  __syncthreads();
  const T* received = static_cast<const T*>(self.buffers[self.rank]) + half + row_at;
  uint4* res_row = reinterpret_cast<uint4*>(residual + static_cast<int64_t>(row) * hidden);
  float sum_sq = 0.f;
  for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    float acc[8] = {};
    for (int r = 0; r < self.ranks; ++r) {
      Vec8<T> part;
      part.raw = r == self.rank ? x_row[v] : __ldcv(reinterpret_cast<const uint4*>(received + r * kSlot) + v);
      float f[8];
      vec8_to_float(part, f);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += f[j];
    }
    Vec8<T> res;
    res.raw = res_row[v];
    float rf[8];
    vec8_to_float(res, rf);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += rf[j];
    // As fused_add_rmsnorm: the sum is rounded to the activation dtype, then normalised.
    const Vec8<T> rounded = float_to_vec8<T>(acc);
    res_row[v] = rounded.raw;
    vec8_to_float(rounded, acc);
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += acc[j] * acc[j];
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(hidden) + eps);
  const uint4* w_vec = reinterpret_cast<const uint4*>(weight);
  for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    Vec8<T> res, w;
    res.raw = res_row[v];  // this thread's own store above
    w.raw = __ldg(w_vec + v);
    float rf[8], wf[8];
    vec8_to_float(res, rf);
    vec8_to_float(w, wf);
#pragma unroll
    for (int j = 0; j < 8; ++j) rf[j] = rf[j] * inv_rms * wf[j];
    x_row[v] = float_to_vec8<T>(rf).raw;
  }
  if (threadIdx.x == 0) self.calls[row] = call;
}

}  // namespace

namespace {

// "" when every pair of `devices` can reach each other's memory, else which pair cannot.
std::string missing_peer_access(std::span<const int> devices) {
  for (int a : devices) {
    for (int b : devices) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can)) {
        return "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) + "'s memory";
      }
    }
  }
  return {};
}

// On the current device (`device`): peer access to every other of `devices`.
cudaError_t enable_peer_access(int device, std::span<const int> devices) {
  for (int peer : devices) {
    if (peer == device) continue;
    const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // enabled by an earlier group: not an error
    } else if (e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

// On the current device: rank `self.rank`'s exchange buffer, flags and call counters, zeroed.
cudaError_t allocate_exchange(OneShotRank& self) {
  const int r = self.rank;
  const size_t flag_bytes = sizeof(uint32_t) * kOneShotMaxRows * kOneShotMaxRanks;
  const size_t call_bytes = sizeof(uint32_t) * kOneShotMaxRows;
  cudaError_t e = cudaMalloc(&self.buffers[r], 2 * static_cast<size_t>(self.ranks) * kOneShotMaxBytes);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&self.flags[r]), flag_bytes);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&self.calls), call_bytes);
  if (e == cudaSuccess) e = cudaMemset(self.flags[r], 0, flag_bytes);
  if (e == cudaSuccess) e = cudaMemset(self.calls, 0, call_bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e;
}

}  // namespace

std::unique_ptr<OneShotGroup> OneShotGroup::create(std::span<const int> devices, std::string* why) {
  const int n = static_cast<int>(devices.size());
  std::string missing = n < 2 || n > kOneShotMaxRanks
                            ? "one-shot all-reduce takes 2 to " + std::to_string(kOneShotMaxRanks) + " GPUs"
                            : missing_peer_access(devices);
  auto fail = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  if (!missing.empty()) return fail(missing);
  std::unique_ptr<OneShotGroup> group(new OneShotGroup());
  group->devices_.assign(devices.begin(), devices.end());
  group->ranks_.resize(static_cast<size_t>(n));
  if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&group->aborted_), sizeof(uint32_t),
                                    cudaHostAllocMapped | cudaHostAllocPortable);
      e != cudaSuccess) {
    return fail(std::string("abort flag: ") + cudaGetErrorString(e));
  }
  *group->aborted_ = 0;
  for (int r = 0; r < n; ++r) {
    const int device = devices[static_cast<size_t>(r)];
    OneShotRank& self = group->ranks_[static_cast<size_t>(r)];
    self.rank = r;
    self.ranks = n;
    self.aborted = group->aborted_;  // unified addressing: the host pointer is the device pointer
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = enable_peer_access(device, devices);
    if (e == cudaSuccess) e = allocate_exchange(self);
    if (e != cudaSuccess) return fail("GPU " + std::to_string(device) + ": " + cudaGetErrorString(e));
  }
  for (OneShotRank& self : group->ranks_) {
    for (const OneShotRank& other : group->ranks_) {
      self.buffers[other.rank] = other.buffers[other.rank];
      self.flags[other.rank] = other.flags[other.rank];
    }
  }
  return group;
}

OneShotGroup::~OneShotGroup() {
  if (aborted_ != nullptr) cudaFreeHost(aborted_);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaFree(ranks_[r].buffers[r]);
    cudaFree(ranks_[r].flags[r]);
    cudaFree(ranks_[r].calls);
  }
}

bool oneshot_fits(int rows, int hidden, const void* x, const void* residual, const void* weight) {
  return rows >= 1 && rows <= kOneShotMaxRows && hidden >= 8 && hidden % 8 == 0 &&
         static_cast<int64_t>(rows) * hidden * 2 <= kOneShotMaxBytes && is_aligned16(x) && is_aligned16(residual) &&
         is_aligned16(weight);
}

cudaError_t oneshot_allreduce_add_rmsnorm(DType dtype, const OneShotRank& self, void* x, void* residual,
                                          const void* weight, int rows, int hidden, float eps, cudaStream_t stream) {
  if (!oneshot_fits(rows, hidden, x, residual, weight)) return cudaErrorInvalidValue;
  const int threads = std::min(kThreads, ((hidden / 8 + 31) / 32) * 32);
  if (dtype == DType::kBF16) {
    oneshot_kernel<__nv_bfloat16><<<rows, threads, 0, stream>>>(self, static_cast<__nv_bfloat16*>(x),
                                                               static_cast<__nv_bfloat16*>(residual),
                                                               static_cast<const __nv_bfloat16*>(weight), hidden, eps);
  } else {
    oneshot_kernel<__half><<<rows, threads, 0, stream>>>(self, static_cast<__half*>(x), static_cast<__half*>(residual),
                                                        static_cast<const __half*>(weight), hidden, eps);
  }
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
