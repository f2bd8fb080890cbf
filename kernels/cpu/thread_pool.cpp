// kernels/cpu/thread_pool.cpp: a small blocking worker pool (see thread_pool.h).
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::kernels::cpu {

namespace {

thread_local bool t_inside_task = false;

// How long a worker (and the caller waiting for workers) polls before blocking on the condition
// variable. A decode step runs a parallel op every few tens of microseconds, and a futex wake-up
// costs about as much as a small op: polling this briefly catches the next op without a sleep,
// while a worker idle for longer (between requests, or on a machine busy with other work) blocks
// and gives its core away, unlike OpenMP's millisecond spins (see thread_pool.h).
constexpr auto kPollFor = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done` for up to kPollFor; true when it turned true.
template <typename Done>
bool poll_briefly(const Done& done) {
  const auto until = std::chrono::steady_clock::now() + kPollFor;
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}

class Pool {
 public:
  ~Pool() { resize(1); }

  void resize(int threads) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    stop_workers();
    threads_ = std::max(1, threads);
    stopping_.store(false);
    // A worker starts from the generation current now, not when it first runs: a run() that begins
    // before the new thread is scheduled must still count as new work for it.
    const uint64_t start = generation_.load();
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
      pending_workers_.store(static_cast<int>(workers_.size()));
      generation_.fetch_add(1);  // after the task fields: a polling worker reads them once it sees this
    }
    wake_.notify_all();
    drain();
    const auto all_done = [this] { return pending_workers_.load() == 0; };
    if (!poll_briefly(all_done)) {
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, all_done);
    }
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
      const auto has_work = [&] { return stopping_.load() || generation_.load() != seen; };
      if (!poll_briefly(has_work)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, has_work);
      }
      if (stopping_.load()) return;
      seen = generation_.load();
      drain();
      pending_workers_.fetch_sub(1);
      // Taking the mutex orders this wake-up after the caller's check of pending_workers_ when the
      // caller went to sleep on finished_, so it cannot be lost.
      { std::lock_guard<std::mutex> lock(mutex_); }
      finished_.notify_one();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_.store(true);
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
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_workers_{0};
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
