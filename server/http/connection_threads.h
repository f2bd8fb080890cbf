// server/http/connection_threads.h: the HTTP server's task queue: one thread per connection, started
// when a connection arrives and ended after it has sat idle, up to a cap.
//
// cpp-httplib hands each accepted connection to its task queue, and the connection holds its thread
// until it closes (a streaming response for its whole length, a kept-alive connection until its idle
// timeout). A fixed pool smaller than the number of open connections leaves the rest waiting before
// their request is even read: a /health probe queued behind 128 streams, a request that should have
// got a quick 429 hung. Starting threads on demand gives every connection its thread at once; the
// cap bounds memory, and only past it do connections wait. Idle threads beyond `keep_idle` exit after
// `linger`, so an idle server does not keep the stacks of its busiest minute.
//
// Thread safety: enqueue() from httplib's listen thread; shutdown() once, then none.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

#include <httplib.h>

namespace tessera {

class ConnectionThreads final : public httplib::TaskQueue {
 public:
  ConnectionThreads(size_t max_threads, size_t keep_idle, std::chrono::milliseconds linger);
  ~ConnectionThreads() override;

  void enqueue(std::function<void()> task) override;
  // Runs every queued task, then waits until every thread has left.
  void shutdown() override;

  size_t threads() const;

 private:
  void work();

  const size_t max_threads_;
  const size_t keep_idle_;
  const std::chrono::milliseconds linger_;
  mutable std::mutex mu_;
  std::condition_variable wake_;        // a task, or stopping_
  std::condition_variable all_exited_;  // running_ reached 0
  std::deque<std::function<void()>> tasks_;
  size_t running_ = 0;  // threads inside work()
  size_t idle_ = 0;     // of them, waiting for a task
  bool stopping_ = false;
};

}  // namespace tessera
