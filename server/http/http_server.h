// server/http/http_server.h: the OpenAI-compatible HTTP front end (cpp-httplib): /v1/completions,
// /v1/chat/completions (JSON or SSE), /v1/embeddings, /v1/models, /tokenize, /detokenize, /health,
// /ready, /metrics: one handler per route, registered from one table. Validation and engine access
// go through Frontend; the response bodies are openai_response.h's; this file only speaks HTTP.
//
// Thread safety: start() and stop() from one controlling thread; handlers run on httplib's pool.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

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
  using RouteHandler = void (HttpServer::*)(const httplib::Request&, httplib::Response&);

  void configure_sockets();
  // Request ids and logs, and OpenAI-shaped bodies for httplib's own errors and uncaught exceptions.
  void install_hooks();
  void register_routes();
  // Inference routes: counted for drain, key checked, ApiError -> OpenAI error body, counted as a
  // refusal.
  void serve_inference(RouteHandler handler, const httplib::Request& req, httplib::Response& res);
  // Probes: a key only when `protect` says so.
  void serve_probe(bool protect, RouteHandler handler, const httplib::Request& req, httplib::Response& res);

  void completions(const httplib::Request& req, httplib::Response& res);
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void embeddings(const httplib::Request& req, httplib::Response& res);
  void models(const httplib::Request& req, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  void tokenizer_info(const httplib::Request& req, httplib::Response& res);
  void health(const httplib::Request& req, httplib::Response& res);
  void ready(const httplib::Request& req, httplib::Response& res);
  void metrics(const httplib::Request& req, httplib::Response& res);

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
