// kernels/backend/host_collective.h: HostCollective, the all-reduce of the ranks of a tensor-parallel
// group that run on host threads of one process (the CPU backend's ranks). It makes a sharded model
// runnable, and testable, without a GPU.
//
// Thread safety: every call is made by its rank's own thread; abort() by any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace tessera {

class HostCollective {
 public:
  // Throws naming the field when size < 1.
  explicit HostCollective(int32_t size);
  int32_t size() const { return size_; }

  // data[0, count) <- its sum over the ranks. Blocks until every rank has called it with the same
  // count. The sum runs in rank order on every rank, so that every rank holds the same bits.
  // Throws after abort(), and when the ranks' counts differ.
  void all_reduce(int32_t rank, float* data, int64_t count);
  // Every call waiting now and every later one throws: a rank that failed will not arrive.
  void abort();
  bool aborted();

 private:
  // Waits until every rank has arrived at this point; throws when aborted.
  void arrive_and_wait(std::unique_lock<std::mutex>& lock);

  const int32_t size_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int32_t waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<float*> buffers_;  // each rank's data in the all-reduce under way
  std::vector<int64_t> counts_;
};

}  // namespace tessera
