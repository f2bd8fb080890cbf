// kernels/backend/host_collective.cpp: HostCollective (see host_collective.h).
#include "kernels/backend/host_collective.h"

#include <algorithm>

#include "common/error.h"

namespace tessera {

HostCollective::HostCollective(int32_t size) : size_(size) {
  TESSERA_CHECK(size >= 1, "tensor_parallel must be >= 1, got " << size);
  buffers_.resize(static_cast<size_t>(size));
  counts_.resize(static_cast<size_t>(size));
}

void HostCollective::arrive_and_wait(std::unique_lock<std::mutex>& lock) {
  TESSERA_CHECK(!aborted_, "tensor-parallel all-reduce: aborted (another rank failed)");
  const uint64_t generation = generation_;
  if (++waiting_ == size_) {
    waiting_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  TESSERA_CHECK(generation_ != generation, "tensor-parallel all-reduce: aborted (another rank failed)");
}

void HostCollective::publish(std::unique_lock<std::mutex>& lock, int32_t rank, const float* data, int64_t count,
                             const char* what) {
  TESSERA_CHECK(rank >= 0 && rank < size_, "tensor-parallel " << what << ": rank " << rank << " of " << size_);
  buffers_[static_cast<size_t>(rank)] = data;
  counts_[static_cast<size_t>(rank)] = count;
  arrive_and_wait(lock);  // every rank's buffer is published
  for (int64_t c : counts_) {
    if (c == count) continue;
    aborted_ = true;  // the others would wait at the next arrival for a rank that stops here
    arrived_.notify_all();
    TESSERA_FAIL("tensor-parallel " << what << ": rank " << rank << " sends " << count
                                    << " values where another rank sends " << c);
  }
}

void HostCollective::all_reduce(int32_t rank, float* data, int64_t count) {
  if (size_ == 1) return;
  std::unique_lock<std::mutex> lock(mutex_);
  publish(lock, rank, data, count, "all-reduce");
  // Read everyone's values before anyone overwrites its own: sum into a copy first.
  lock.unlock();
  std::vector<float> sum(static_cast<size_t>(count), 0.0f);
  for (const float* buffer : buffers_) {
    for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(i)] += buffer[i];
  }
  lock.lock();
  arrive_and_wait(lock);  // every rank has read every buffer
  lock.unlock();
  std::copy(sum.begin(), sum.end(), data);
}

void HostCollective::all_gather(int32_t rank, const float* part, float* whole, int64_t count) {
  std::unique_lock<std::mutex> lock(mutex_);
  publish(lock, rank, part, count, "all-gather");
  lock.unlock();
  for (size_t r = 0; r < buffers_.size(); ++r) std::copy(buffers_[r], buffers_[r] + count, whole + r * count);
  lock.lock();
  arrive_and_wait(lock);  // every rank has read every part, so a part's owner may overwrite it
}

bool HostCollective::aborted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

void HostCollective::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  arrived_.notify_all();
}

}  // namespace tessera
