// server/http/http_server.h: the OpenAI-compatible HTTP front end (cpp-httplib): /v1/completions,
// /v1/chat/completions (JSON or SSE), /v1/embeddings, /v1/models, /tokenize, /detokenize, /health,
// /ready, /metrics. Validation and engine access go through Frontend; this file only speaks HTTP.
//
// Thread safety: start() and stop() from one controlling thread; handlers run on httplib's pool.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace tessera {

class Frontend;
class ServerMetrics;
struct ServerConfig;

class HttpServer {
 public:
  HttpServer(const ServerConfig& config, Frontend& frontend, ServerMetrics* metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds config.http.host:port (port 0: the OS picks) and serves on a background thread. Returns
  // the bound port. Throws tessera::Error when the address cannot be bound.
  int start();
  int port() const { return port_; }
  // Requests being handled or still streaming their body; drain waits for 0.
  int active_requests() const { return active_->load(); }
  // Stops accepting and closes connections, cutting streams still open: drain first.
  void stop();

 private:
  void register_routes();

  const ServerConfig& config_;
  Frontend& frontend_;
  ServerMetrics* metrics_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> listen_fd_{-1};  // the listening socket, captured to widen httplib's backlog
  std::shared_ptr<std::atomic<int>> active_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace tessera
