// server/http/connection_threads.cpp
#include "server/http/connection_threads.h"

#include <algorithm>

namespace tessera {

ConnectionThreads::ConnectionThreads(size_t max_threads, size_t keep_idle, std::chrono::milliseconds linger)
    : max_threads_(std::max<size_t>(max_threads, 1)), keep_idle_(keep_idle), linger_(linger) {}

ConnectionThreads::~ConnectionThreads() { shutdown(); }

void ConnectionThreads::enqueue(std::function<void()> task) {
  std::lock_guard lock(mu_);
  if (stopping_) return;  // httplib enqueues nothing after shutdown; a late task would outlive the threads
  join_exited();
  tasks_.push_back(std::move(task));
  // A new thread only when no idle one will take the task; past the cap the task waits its turn.
  if (idle_ >= tasks_.size() || running_ >= max_threads_) {
    wake_.notify_one();
    return;
  }
  ++running_;
  threads_.emplace_back([this] { work(); });
}

void ConnectionThreads::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  wake_.notify_all();
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
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
  --running_;
  if (!stopping_) exited_.push_back(std::this_thread::get_id());
}

void ConnectionThreads::join_exited() {
  for (const std::thread::id id : exited_) {
    const auto it = std::find_if(threads_.begin(), threads_.end(), [id](const std::thread& t) { return t.get_id() == id; });
    if (it == threads_.end()) continue;
    it->join();  // it has left work(); joining waits only for its last instructions
    threads_.erase(it);
  }
  exited_.clear();
}

}  // namespace tessera
