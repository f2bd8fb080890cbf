// server/http/connection_threads.cpp
#include "server/http/connection_threads.h"

#include <algorithm>
#include <thread>

namespace tessera {

ConnectionThreads::ConnectionThreads(size_t max_threads, size_t keep_idle, std::chrono::milliseconds linger)
    : max_threads_(std::max<size_t>(max_threads, 1)), keep_idle_(keep_idle), linger_(linger) {}

ConnectionThreads::~ConnectionThreads() { shutdown(); }

void ConnectionThreads::enqueue(std::function<void()> task) {
  std::lock_guard lock(mu_);
  if (stopping_) return;  // httplib enqueues nothing after shutdown; a late task would outlive the threads
  tasks_.push_back(std::move(task));
  // A new thread only when no idle one will take the task; past the cap the task waits its turn.
  if (idle_ >= tasks_.size() || running_ >= max_threads_) {
    wake_.notify_one();
    return;
  }
  ++running_;
  // Detached: joining exiting threads here would stall httplib's accept loop whenever a busy CPU
  // had not yet run an exiting thread's last instructions. shutdown() waits for running_ == 0.
  std::thread([this] { work(); }).detach();
}

void ConnectionThreads::shutdown() {
  std::unique_lock lock(mu_);
  stopping_ = true;
  wake_.notify_all();
  all_exited_.wait(lock, [this] { return running_ == 0; });
}

size_t ConnectionThreads::threads() const {
  std::lock_guard lock(mu_);
  return running_;
}

void ConnectionThreads::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!tasks_.empty()) {
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      continue;
    }
    if (stopping_) break;
    ++idle_;
    const bool woken = wake_.wait_for(lock, linger_, [this] { return !tasks_.empty() || stopping_; });
    --idle_;
    // Lingered with nothing to do: leave unless the server would drop below its warm threads.
    if (!woken && running_ > keep_idle_) break;
  }
  // The last access to *this: shutdown() may destroy it once the lock is released.
  if (--running_ == 0) all_exited_.notify_all();
}

}  // namespace tessera
