// kernels/backend/host_collective.h: HostCollective, the all-reduce and all-gather of the ranks of a
// tensor-parallel group that run on host threads of one process (the CPU backend's ranks). It makes a
// sharded model runnable, and testable, without a GPU.
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
  // whole[r * count, (r + 1) * count) <- rank r's part[0, count), on every rank. Blocks and throws as
  // all_reduce does.
  void all_gather(int32_t rank, const float* part, float* whole, int64_t count);
  // Every call waiting now and every later one throws: a rank that failed will not arrive.
  void abort();
  bool aborted();

 private:
  // Waits until every rank has arrived at this point; throws when aborted.
  void arrive_and_wait(std::unique_lock<std::mutex>& lock);
  // Publishes this rank's buffer and waits for every other rank's; throws (aborting the group) when
  // the ranks' counts differ. `what` names the collective in the message.
  void publish(std::unique_lock<std::mutex>& lock, int32_t rank, const float* data, int64_t count, const char* what);

  const int32_t size_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int32_t waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const float*> buffers_;  // each rank's data in the collective under way
  std::vector<int64_t> counts_;
};

}  // namespace tessera
