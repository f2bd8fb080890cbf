// kernels/cuda/collectives/oneshot_allreduce.h: the all-reduce of a tensor-parallel group's GPUs in
// one process, fused with the residual add and RMSNorm that follow it in a decoder layer, in one
// kernel over NVLink peer-to-peer memory: each rank writes its partial rows into every peer's
// exchange buffer, whose slots read as empty (-0.0) until a value arrives, and sums every rank's rows
// itself from its own memory once they are there (a one-shot all-reduce with no flags or fences: one
// NVLink write per peer, no ring steps). For the small messages of decode (a few rows) it replaces
// NCCL's all-reduce and the norm's launch.
//
// Each rank sums in rank order in fp32, so every rank holds the same bits, as the replicated
// residual stream needs. Calls must come in the same order with the same shapes on every rank (the
// ranks run one plan); they may be captured in CUDA graphs (each rank counts its calls on the device).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

inline constexpr int kOneShotMaxRanks = 8;
inline constexpr int kOneShotMaxRows = 128;
inline constexpr int64_t kOneShotMaxBytes = int64_t{1} << 20;  // rows x hidden x 2 bytes one call can hold
// It beats NCCL at every size it takes, so it runs wherever it fits. On two H100s
// (bench/allreduce_bench.cpp, in a graph, hidden 4096) it took 4.4 / 4.5 / 4.7 / 5.6 / 8.5 us at
// 8 / 32 / 64 / 256 / 1024 KiB, its norm included, where NCCL took 6.4 / 6.7 / 6.8 / 8.3 / 13.6 us
// before a norm launch.

// One rank's view of the group: every rank's exchange buffer (peer pointers, usable through peer
// access), and its own per-row call counters.
struct OneShotRank {
  int rank = 0;
  int ranks = 0;
  void* buffers[kOneShotMaxRanks] = {};     // each: [3 phases][ranks][kOneShotMaxBytes], by source rank
  uint32_t* calls = nullptr;                // this rank's: [kOneShotMaxRows], calls made per row
  const uint32_t* aborted = nullptr;        // the group's, in mapped host memory: nonzero after abort()
};

// The device memory of a group's exchange, one OneShotRank per device (freed with the group).
class OneShotGroup {
 public:
  // Enables peer access between every pair of `devices` and allocates each rank's buffers. Returns
  // null, with `why` set, when some pair cannot reach each other's memory (then use NCCL).
  static std::unique_ptr<OneShotGroup> create(std::span<const int> devices, std::string* why);
  ~OneShotGroup();
  OneShotGroup(const OneShotGroup&) = delete;
  OneShotGroup& operator=(const OneShotGroup&) = delete;
  const OneShotRank& rank(int r) const { return ranks_[static_cast<size_t>(r)]; }
  // Every call waiting for a peer, now or later, stops waiting (its result is garbage): a rank failed
  // and will not arrive. Thread-safe; the kernels see it through host memory mapped to the devices.
  void abort() { *static_cast<volatile uint32_t*>(aborted_) = 1; }

 private:
  OneShotGroup() = default;
  uint32_t* aborted_ = nullptr;  // pinned, mapped
  std::vector<int> devices_;
  std::vector<OneShotRank> ranks_;
};

// Whether one call of `rows` x `hidden` fits the exchange (rows and bytes within the limits, hidden
// a multiple of 8, 16-byte aligned pointers).
bool oneshot_fits(int rows, int hidden, const void* x, const void* residual, const void* weight);

// x <- the sum over the ranks of x; residual <- x + residual; x <- rmsnorm(residual) * weight, on
// rank `self.rank`, with every rank of the group making the same call. x, residual: [rows, hidden],
// contiguous; weight: [hidden]. Requires oneshot_fits.
cudaError_t oneshot_allreduce_add_rmsnorm(DType dtype, const OneShotRank& self, void* x, void* residual,
                                          const void* weight, int rows, int hidden, float eps, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
