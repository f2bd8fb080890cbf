// engine/follower_ranks.cpp: FollowerRanks (see follower_ranks.h).
#include "engine/follower_ranks.h"

#include <atomic>
#include <chrono>

#include "engine/executor.h"

namespace tessera {

struct FollowerRanks::Worker {
  Backend* backend = nullptr;
  std::unique_ptr<Executor> executor;
  std::mutex mutex;
  std::condition_variable changed;
  std::function<void(Executor&)> work;  // set: work to do
  std::atomic<bool> posted{false};      // work was set (read without the lock while polling)
  bool busy = false;
  bool stopping = false;
  std::exception_ptr error;
  std::thread thread;
};

ShardedModel ShardedModel::load(std::span<const std::unique_ptr<Backend>> backends,
                                const std::function<std::unique_ptr<CausalLm>(Backend&)>& load) {
  ShardedModel model;
  for (size_t rank = 0; rank < backends.size(); ++rank) {
    model.shards.push_back(load(*backends[rank]));
    if (rank > 0) model.followers.push_back({model.shards.back().get(), backends[rank].get()});
  }
  return model;
}

FollowerRanks::FollowerRanks(std::span<const RankShard> followers, Backend& leader, int32_t num_blocks,
                             int32_t block_size)
    : leader_(leader) {
  for (const RankShard& rank : followers) {
    auto worker = std::make_unique<Worker>();
    worker->backend = rank.backend;
    worker->executor = std::make_unique<Executor>(*rank.model, *rank.backend, num_blocks, block_size);
    workers_.push_back(std::move(worker));
  }
  for (auto& worker : workers_) worker->thread = std::thread([this, w = worker.get()] { serve(*w); });
}

FollowerRanks::~FollowerRanks() {
  for (auto& worker : workers_) {
    {
      std::lock_guard<std::mutex> lock(worker->mutex);
      worker->stopping = true;
    }
    worker->changed.notify_all();
  }
  for (auto& worker : workers_) worker->thread.join();
}

void FollowerRanks::serve(Worker& worker) {
  std::unique_lock<std::mutex> lock(worker.mutex);
  for (;;) {
    // While serving, steps follow each other within milliseconds: poll a while before sleeping, as a
    // futex wake-up costs tens of microseconds that both GPUs would spend waiting at the first
    // all-reduce. An idle engine's followers sleep.
    lock.unlock();
    const auto poll_until = std::chrono::steady_clock::now() + kPollBeforeSleep;
    while (!worker.posted.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < poll_until) {
    }
    lock.lock();
    worker.changed.wait(lock, [&] { return worker.stopping || worker.work != nullptr; });
    worker.posted.store(false, std::memory_order_relaxed);
    if (worker.work == nullptr) return;  // stopping, with no work left
    const std::function<void(Executor&)> work = std::move(worker.work);
    worker.work = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      work(*worker.executor);
    } catch (...) {
      error = std::current_exception();
      abort_all(error);
    }
    lock.lock();
    worker.error = error;
    worker.busy = false;
    worker.changed.notify_all();
  }
}

void FollowerRanks::start(std::function<void(Executor&)> work) {
  for (auto& worker : workers_) {
    {
      std::lock_guard<std::mutex> lock(worker->mutex);
      worker->work = work;
      worker->busy = true;
      worker->error = nullptr;
      worker->posted.store(true, std::memory_order_release);
    }
    worker->changed.notify_all();
  }
}

void FollowerRanks::wait() {
  std::exception_ptr first;
  for (auto& worker : workers_) {
    std::unique_lock<std::mutex> lock(worker->mutex);
    worker->changed.wait(lock, [&] { return !worker->busy; });
    if (worker->error && !first) first = worker->error;
  }
  if (first) std::rethrow_exception(first);
}

std::exception_ptr FollowerRanks::abort_and_wait() {
  abort_all(nullptr);
  try {
    wait();
  } catch (...) {
    // Followers that failed because the leader aborted them add nothing to the leader's error.
  }
  const std::lock_guard<std::mutex> lock(abort_mutex_);
  return abort_cause_;
}

void FollowerRanks::abort_all(std::exception_ptr cause) {
  {
    const std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_) return;
    aborted_ = true;
    abort_cause_ = std::move(cause);
  }
  leader_.abort_collectives();
  for (auto& worker : workers_) worker->backend->abort_collectives();
}

}  // namespace tessera
