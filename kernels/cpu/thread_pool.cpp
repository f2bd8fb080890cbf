// kernels/cpu/thread_pool.cpp: a small blocking worker pool (see thread_pool.h).
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::kernels::cpu {

namespace {

thread_local bool t_inside_task = false;

class Pool {
 public:
  ~Pool() { resize(1); }

  void resize(int threads) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    stop_workers();
    threads_ = std::max(1, threads);
    stopping_ = false;
    // A worker starts from the generation current now, not when it first runs: a run() that begins
    // before the new thread is scheduled must still count as new work for it.
    const uint64_t start = generation_;
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, start] { worker_loop(start); });
  }

  int threads() const { return threads_; }

  void run(int64_t chunks, const std::function<void(int64_t)>& task) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      chunks_ = chunks;
      next_.store(0);
      pending_workers_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return pending_workers_ == 0; });
    task_ = nullptr;
  }

 private:
  void drain() {
    t_inside_task = true;
    for (int64_t c = next_.fetch_add(1); c < chunks_; c = next_.fetch_add(1)) (*task_)(c);
    t_inside_task = false;
  }

  void worker_loop(uint64_t seen) {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      drain();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_workers_;
      }
      finished_.notify_one();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  std::mutex run_mutex_;  // one parallel_for at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  std::vector<std::thread> workers_;
  int threads_ = 1;
  bool stopping_ = false;
  uint64_t generation_ = 0;
  int pending_workers_ = 0;
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t chunks_ = 0;
  std::atomic<int64_t> next_{0};
};

int default_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

Pool& pool() {
  static Pool* instance = [] {
    auto* p = new Pool();  // never destroyed: workers may outlive static destruction order
    p->resize(default_threads());
    return p;
  }();
  return *instance;
}

}  // namespace

void set_num_threads(int num_threads) { pool().resize(num_threads > 0 ? num_threads : default_threads()); }

int num_threads() { return pool().threads(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  Pool& p = pool();
  // A few chunks per thread balance uneven work (attention rows) without much overhead.
  const int64_t max_chunks = static_cast<int64_t>(p.threads()) * 4;
  const int64_t chunks = std::min(max_chunks, (n + grain - 1) / grain);
  if (chunks <= 1 || p.threads() == 1 || t_inside_task) {
    body(0, n);
    return;
  }
  const std::function<void(int64_t)> task = [&](int64_t c) {
    const int64_t begin = n * c / chunks;
    const int64_t end = n * (c + 1) / chunks;
    if (begin < end) body(begin, end);
  };
  p.run(chunks, task);
}

}  // namespace tessera::kernels::cpu
