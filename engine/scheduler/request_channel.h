// engine/scheduler/request_channel.h: RequestChannel, the RequestStream one generate request's events
// travel through (engine thread -> front end), and EngineSignal, which wakes an idle engine thread.
//
// Thread safety: every member is safe from any thread. push() is the engine thread's side; next()
// and cancel() the front end's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/scheduler/request.h"

namespace tessera {

// A condition the engine thread sleeps on while it has nothing to do. Shared with the channels so a
// cancel() wakes the engine even when the channel outlives the EngineLoop.
class EngineSignal {
 public:
  void notify();
  // Sleeps until notify() was called since the last wait, or the timeout; clears the flag.
  void wait(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool pending_ = false;
};

class RequestChannel final : public RequestStream {
 public:
  explicit RequestChannel(std::shared_ptr<EngineSignal> signal);

  std::optional<StreamEvent> next(std::chrono::milliseconds timeout) override;
  void cancel() override;

  // Engine side. A delta pushed while an earlier delta is still unread is merged into it, so a slow
  // reader holds at most one delta and the final event: memory stays bounded by the request's
  // output, never by how many steps ran. Events after the final one are dropped.
  void push(StreamEvent event);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<EngineSignal> signal_;
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;  // at most one delta, then at most one final
  bool final_pushed_ = false;
  bool final_taken_ = false;
};

}  // namespace tessera
