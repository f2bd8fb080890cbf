// kernels/cuda/collectives/oneshot_allreduce.cu: the one-shot all-reduce + add + RMSNorm (see
// oneshot_allreduce.h).
#include "kernels/cuda/collectives/oneshot_allreduce.h"

#include "kernels/cuda/common/device.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kThreads = 512;
// Spins between two reads of the abort flag, which lives in host memory. Every waiting thread reads
// it, and each read crosses PCIe: read often, while ranks wait tens of microseconds for each other
// (a batch's GEMMs end at different times), tens of thousands of such reads queue up and each
// all-reduce stalls for hundreds of microseconds. This many spins is tens of milliseconds: an abort
// still ends the wait long before anyone would call it a hang.
constexpr int kSpinsPerAbortCheck = 1 << 16;
// -0.0 in fp16 and in bf16: the mark of an exchange slot whose value has not arrived. A value sent
// is never -0.0 (it is sent as +0.0, the same number), so a slot holds a sent value exactly when
// none of its halves is the mark.
constexpr uint32_t kEmptyHalf = 0x8000u;
constexpr uint32_t kEmptyWord = kEmptyHalf << 16 | kEmptyHalf;

__device__ __forceinline__ uint32_t without_negative_zero(uint32_t word) {
  if ((word & 0xFFFFu) == kEmptyHalf) word &= 0xFFFF0000u;
  if ((word >> 16) == kEmptyHalf) word &= 0x0000FFFFu;
  return word;
}

__device__ __forceinline__ uint4 without_negative_zero(uint4 v) {
  return make_uint4(without_negative_zero(v.x), without_negative_zero(v.y), without_negative_zero(v.z),
                    without_negative_zero(v.w));
}

__device__ __forceinline__ bool has_empty_half(uint32_t word) {
  return (word & 0xFFFFu) == kEmptyHalf || (word >> 16) == kEmptyHalf;
}

// Waits until every half of the slot has arrived (a peer's 16-byte store may land in parts), or the
// group is aborted (then returns what is there).
__device__ __forceinline__ uint4 wait_for_slot(const uint4* slot, const uint32_t* aborted) {
  uint4 v = __ldcv(slot);
  for (int spins = 1; has_empty_half(v.x) || has_empty_half(v.y) || has_empty_half(v.z) || has_empty_half(v.w);
       ++spins) {
    if (spins % kSpinsPerAbortCheck == 0 && *reinterpret_cast<const volatile uint32_t*>(aborted) != 0) break;
    v = __ldcv(slot);
  }
  return v;
}

// One block per row. A row's calls are counted in self.calls[row], the same on every rank; call c
// uses phase c % 3 of every exchange buffer. Each rank stores its row straight into phase c's slot
// for it in every peer's buffer, and reads its peers' rows from its own buffer once they are there
// (no flags and no fences: one crossing of NVLink). It then empties phase (c - 1)'s slots for call
// c + 2: no peer writes them before then, since a peer can be at most one call ahead (its call c + 1
// waits for this rank's row of call c + 1), and nothing reads them after call c - 1.
template <typename T>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(OneShotRank self, T* x, T* residual,
                                                           const T* __restrict__ weight, int hidden, float eps) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const int num_vecs = hidden / 8;
  // Read by every thread before block_sum's barrier; thread 0 advances it only after that barrier.
  const uint32_t call = self.calls[row] + 1;
  constexpr int64_t kSlot = kOneShotMaxBytes / static_cast<int64_t>(sizeof(T));  // one source rank's rows
  const int64_t row_at = static_cast<int64_t>(row) * hidden;
  auto slot = [&](int owner, uint32_t phase, int source) {
    return reinterpret_cast<uint4*>(static_cast<T*>(self.buffers[owner]) +
                                    (static_cast<int64_t>(phase) * self.ranks + source) * kSlot + row_at);
  };
  const uint32_t phase = call % 3, emptied = (call + 2) % 3;
  uint4* x_row = reinterpret_cast<uint4*>(x + row_at);
  for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    const uint4 value = without_negative_zero(x_row[v]);
    for (int r = 0; r < self.ranks; ++r) {
      if (r != self.rank) slot(r, phase, self.rank)[v] = value;
    }
  }
  uint4* res_row = reinterpret_cast<uint4*>(residual + row_at);
  float sum_sq = 0.f;
  for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    float acc[8] = {};
    for (int r = 0; r < self.ranks; ++r) {
      Vec8<T> part;
      if (r == self.rank) {
        part.raw = without_negative_zero(x_row[v]);
      } else {
        part.raw = wait_for_slot(slot(self.rank, phase, r) + v, self.aborted);
        slot(self.rank, emptied, r)[v] = make_uint4(kEmptyWord, kEmptyWord, kEmptyWord, kEmptyWord);
      }
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

// On the current device: rank `self.rank`'s exchange buffer, every slot empty, and its call counters,
// zeroed.
cudaError_t allocate_exchange(OneShotRank& self) {
  const int r = self.rank;
  const size_t buffer_bytes = 3 * static_cast<size_t>(self.ranks) * kOneShotMaxBytes;
  const std::vector<uint32_t> empty(buffer_bytes / sizeof(uint32_t), kEmptyWord);
  cudaError_t e = cudaMalloc(&self.buffers[r], buffer_bytes);
  if (e == cudaSuccess) e = cudaMemcpy(self.buffers[r], empty.data(), buffer_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&self.calls), sizeof(uint32_t) * kOneShotMaxRows);
  if (e == cudaSuccess) e = cudaMemset(self.calls, 0, sizeof(uint32_t) * kOneShotMaxRows);
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
    }
  }
  return group;
}

OneShotGroup::~OneShotGroup() {
  if (aborted_ != nullptr) cudaFreeHost(aborted_);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaFree(ranks_[r].buffers[r]);
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
