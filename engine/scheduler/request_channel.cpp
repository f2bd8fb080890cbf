// engine/scheduler/request_channel.cpp: RequestChannel and EngineSignal (see request_channel.h).
#include "engine/scheduler/request_channel.h"

#include <utility>

namespace tessera {

void EngineSignal::notify() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ = true;
  }
  cv_.notify_all();
}

void EngineSignal::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [this] { return pending_; });
  pending_ = false;
}

RequestChannel::RequestChannel(std::shared_ptr<EngineSignal> signal) : signal_(std::move(signal)) {}

std::optional<StreamEvent> RequestChannel::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (final_taken_) return std::nullopt;
  if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return std::nullopt;
  StreamEvent event = std::move(events_.front());
  events_.pop_front();
  if (event.final) final_taken_ = true;
  return event;
}

void RequestChannel::cancel() {
  if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  if (signal_) signal_->notify();
}

void RequestChannel::push(StreamEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (final_pushed_) return;
    if (event.final) final_pushed_ = true;
    if (!event.final && !events_.empty() && !events_.back().final) {
      StreamEvent& pending = events_.back();
      pending.tokens.insert(pending.tokens.end(), event.tokens.begin(), event.tokens.end());
      pending.text += event.text;
      for (StreamTokenLogprob& lp : event.logprobs) pending.logprobs.push_back(std::move(lp));
    } else {
      events_.push_back(std::move(event));
    }
  }
  cv_.notify_all();
}

}  // namespace tessera
