// server/http/active_request.h: counts one in-flight HTTP request while it lives, so that a drain
// can wait for the count to reach 0.
#pragma once

#include <atomic>
#include <memory>
#include <utility>

namespace tessera::http {

class ActiveRequest {
 public:
  explicit ActiveRequest(std::shared_ptr<std::atomic<int>> counter) : counter_(std::move(counter)) { ++*counter_; }
  ~ActiveRequest() { --*counter_; }
  ActiveRequest(const ActiveRequest&) = delete;
  ActiveRequest& operator=(const ActiveRequest&) = delete;

 private:
  std::shared_ptr<std::atomic<int>> counter_;
};

}  // namespace tessera::http
