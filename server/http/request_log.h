// server/http/request_log.h: what the log line of one HTTP request reports, and the line itself.
// The handler fills it in on the worker thread that serves the request, which is also the thread
// that streams the body and then calls the logger, so each worker thread keeps one.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tessera::http {

struct RequestLog {
  std::chrono::steady_clock::time_point start;
  std::string request_id;
  std::string model;
  int64_t prompt_tokens = -1;      // -1: not reported
  int64_t completion_tokens = -1;  // -1: not reported
  std::string finish;
};

// The log of the request this thread serves.
RequestLog& request_log();
// Starts this thread's log afresh for a new request.
void begin_request_log(std::string request_id);
// "http POST /v1/completions 200 12.3ms model=... prompt_tokens=... finish=... rid=...", at info.
void write_request_log(const std::string& method, const std::string& path, int status);

}  // namespace tessera::http
