// server/http/request_log.cpp: the per-thread request log and its line.
#include "server/http/request_log.h"

#include <utility>

#include <spdlog/spdlog.h>

namespace tessera::http {
namespace {

thread_local RequestLog t_log;

}  // namespace

RequestLog& request_log() { return t_log; }

void begin_request_log(std::string request_id) {
  t_log = RequestLog{};
  t_log.start = std::chrono::steady_clock::now();
  t_log.request_id = std::move(request_id);
}

void write_request_log(const std::string& method, const std::string& path, int status) {
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_log.start).count();
  std::string extra;
  if (!t_log.model.empty()) extra += " model=" + t_log.model;
  if (t_log.prompt_tokens >= 0) extra += " prompt_tokens=" + std::to_string(t_log.prompt_tokens);
  if (t_log.completion_tokens >= 0) extra += " completion_tokens=" + std::to_string(t_log.completion_tokens);
  if (!t_log.finish.empty()) extra += " finish=" + t_log.finish;
  spdlog::info("http {} {} {} {:.1f}ms{} rid={}", method, path, status, ms, extra, t_log.request_id);
}

}  // namespace tessera::http
