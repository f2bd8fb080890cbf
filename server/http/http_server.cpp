// server/http/http_server.cpp: the listening socket, the route table, the guards every route runs
// behind, and the handlers of the routes other than generate.
#include "server/http/http_server.h"

#include <chrono>
#include <string>
#include <vector>

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "common/error.h"
#include "server/config/server_config.h"
#include "server/frontend/frontend.h"
#include "server/http/active_request.h"
#include "server/http/connection_threads.h"
#include "server/http/generate_route.h"
#include "server/http/openai_request.h"
#include "server/http/openai_response.h"
#include "server/http/request_log.h"
#include "server/metrics/server_metrics.h"

namespace tessera {
namespace {

using http::kJsonContentType;
using http::request_log;

constexpr int kReadTimeoutSeconds = 30;

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = http_status(e.kind());
  if (e.retry_after_seconds() > 0) res.set_header("Retry-After", std::to_string(e.retry_after_seconds()));
  res.set_content(http::dump(http::client_error_body(e, request_log().request_id)), kJsonContentType);
  request_log().finish = error_kind_name(e.kind());
}

// httplib's own errors (unknown route, chunked body over the limit, unreadable body) get
// OpenAI-shaped bodies too; responses that already carry one are left alone.
// A body over limits.max_body_bytes is read and discarded by httplib (so the client, still sending,
// gets the 413 rather than a reset connection) and lands here.
httplib::Server::HandlerResponse answer_httplib_error(int64_t body_limit, const httplib::Request& req,
                                                      httplib::Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  ErrorKind kind = ErrorKind::kInvalidRequest;
  std::string message = "Bad request: the request line, headers or body could not be read (malformed, or not "
                        "received in full within " + std::to_string(kReadTimeoutSeconds) + " s).";
  if (res.status == 404) {
    kind = ErrorKind::kNotFound;
    message = "Not found: " + req.method + " " + req.path;
  } else if (res.status == 413) {
    kind = ErrorKind::kTooLarge;
    message = "The request body is over the server's limit of " + std::to_string(body_limit) + " bytes.";
  } else if (res.status >= 500) {
    kind = ErrorKind::kInternal;
    message = "Internal server error.";
  }
  res.set_content(http::dump(http::error_body(kind, message, "", "")), kJsonContentType);
  request_log().finish = error_kind_name(kind);
  return httplib::Server::HandlerResponse::Handled;
}

void answer_exception(httplib::Response& res, const std::exception_ptr& exception) {
  std::string message = "unknown exception";
  try {
    std::rethrow_exception(exception);
  } catch (const std::exception& e) {
    message = std::string("unhandled exception: ") + e.what();
  } catch (...) {
  }
  write_error(res, ApiError(ErrorKind::kInternal, message));  // logged with the request id, not sent
}

// The named model, or the first served one when the request names none.
const FrontendModel& model_or_first(const Frontend& frontend, const std::string& name) {
  if (!name.empty()) return frontend.find_any_model(name);
  const auto models = frontend.models();
  if (models.empty()) throw ApiError(ErrorKind::kNotFound, "no model is served", "model");
  return *models.front();
}

}  // namespace

HttpServer::HttpServer(const ServerConfig& config, Frontend& frontend, ServerMetrics* metrics)
    : config_(config), frontend_(frontend), metrics_(metrics), server_(std::make_unique<httplib::Server>()) {
  configure_sockets();
  install_hooks();
  register_routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::configure_sockets() {
  // A thread per connection, started on demand (see connection_threads.h); 8 stay warm, and others
  // end after 10 s idle.
  const size_t threads = static_cast<size_t>(config_.http_threads);
  server_->new_task_queue = [threads] { return new ConnectionThreads(threads, 8, std::chrono::seconds(10)); };
  server_->set_payload_max_length(static_cast<size_t>(config_.limits.max_body_bytes));
  server_->set_keep_alive_max_count(1000);
  // Clients (httpx, the openai SDK) drop idle connections after 5 s, httplib's own default. With
  // equal timeouts a reused connection can be closed by the server just as a request goes out,
  // and the client sees a reset; a longer server timeout leaves the expiry to the client.
  server_->set_keep_alive_timeout(30);
  // httplib answers 400 when a request's headers or body take longer than the read timeout (5 s by
  // default). A client process starved of CPU (1,000 clients on two cores) sent a body that late;
  // 30 s still ends a connection that stops sending, and costs only its own thread meanwhile.
  server_->set_read_timeout(kReadTimeoutSeconds);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second server
  // bind a port that is already in use instead of failing. The fd is kept to widen the backlog.
  server_->set_socket_options([this](int fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    // Accepted sockets inherit TCP_NODELAY. Without it a response written in two parts (headers,
    // then body) waits for the client's delayed ACK: a 3 ms embedding came back in 48 ms.
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    listen_fd_ = fd;
  });
}

int HttpServer::start() {
  const std::string& host = config_.http.host;
  if (config_.http.port == 0) {
    port_ = server_->bind_to_any_port(host);
  } else {
    port_ = server_->bind_to_port(host, config_.http.port) ? config_.http.port : -1;
  }
  TESSERA_CHECK(port_ > 0, "http: cannot listen on " << host << ":" << config_.http.port
                                                     << " (in use, or not an address of this machine)");
  // httplib listens with a backlog of 5; a burst of clients connecting at once would overflow it
  // and see resets. Calling listen() again on the bound socket raises the backlog.
  if (const int fd = listen_fd_.load(); fd >= 0) ::listen(fd, SOMAXCONN);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return port_;
}

void HttpServer::stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::install_hooks() {
  server_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    http::begin_request_log(Frontend::request_id_or_new(req.get_header_value("X-Request-Id")));
    res.set_header("X-Request-Id", request_log().request_id);
    return httplib::Server::HandlerResponse::Unhandled;
  });
  const int64_t body_limit = config_.limits.max_body_bytes;
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [body_limit](const httplib::Request& req, httplib::Response& res) {
        return answer_httplib_error(body_limit, req, res);
      }));
  server_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr exception) {
    answer_exception(res, exception);
  });
  server_->set_logger([](const httplib::Request& req, const httplib::Response& res) {
    http::write_request_log(req.method, req.path, res.status);
  });
}

void HttpServer::register_routes() {
  enum class Method { kGet, kPost };
  enum class Access { kInference, kHealthProbe, kMetricsProbe };
  struct Route {
    Method method;
    const char* path;
    Access access;
    RouteHandler handler;
  };
  const Route routes[] = {
      {Method::kPost, "/v1/completions", Access::kInference, &HttpServer::completions},
      {Method::kPost, "/v1/chat/completions", Access::kInference, &HttpServer::chat_completions},
      {Method::kPost, "/v1/embeddings", Access::kInference, &HttpServer::embeddings},
      {Method::kGet, "/v1/models", Access::kInference, &HttpServer::models},
      {Method::kPost, "/tokenize", Access::kInference, &HttpServer::tokenize},
      {Method::kPost, "/detokenize", Access::kInference, &HttpServer::detokenize},
      {Method::kGet, "/tokenizer_info", Access::kInference, &HttpServer::tokenizer_info},
      {Method::kGet, "/health", Access::kHealthProbe, &HttpServer::health},
      {Method::kGet, "/ready", Access::kHealthProbe, &HttpServer::ready},
      {Method::kGet, "/metrics", Access::kMetricsProbe, &HttpServer::metrics},
  };
  for (const Route& route : routes) {
    httplib::Server::Handler handler;
    if (route.access == Access::kInference) {
      handler = [this, route](const httplib::Request& req, httplib::Response& res) {
        serve_inference(route.handler, req, res);
      };
    } else {
      const bool protect = route.access == Access::kHealthProbe ? config_.auth.protect_health
                                                                : config_.auth.protect_metrics;
      handler = [this, protect, route](const httplib::Request& req, httplib::Response& res) {
        serve_probe(protect, route.handler, req, res);
      };
    }
    if (route.method == Method::kGet) {
      server_->Get(route.path, std::move(handler));
    } else {
      server_->Post(route.path, std::move(handler));
    }
  }
}

void HttpServer::serve_inference(RouteHandler handler, const httplib::Request& req, httplib::Response& res) {
  http::ActiveRequest active(active_);
  try {
    frontend_.check_api_key(req.get_header_value("Authorization"));
    (this->*handler)(req, res);
  } catch (const ApiError& e) {
    write_error(res, e);
    frontend_.count_rejection(e.kind(), request_log().model);
  } catch (const Error& e) {
    write_error(res, ApiError(ErrorKind::kInvalidRequest, user_message(e)));
    frontend_.count_rejection(ErrorKind::kInvalidRequest, request_log().model);
  }
}

void HttpServer::serve_probe(bool protect, RouteHandler handler, const httplib::Request& req, httplib::Response& res) {
  try {
    if (protect) frontend_.check_api_key(req.get_header_value("Authorization"));
    (this->*handler)(req, res);
  } catch (const ApiError& e) {
    write_error(res, e);
  }
}

void HttpServer::completions(const httplib::Request& req, httplib::Response& res) {
  http::serve_generate(frontend_, active_, req, res, /*chat=*/false);
}

void HttpServer::chat_completions(const httplib::Request& req, httplib::Response& res) {
  http::serve_generate(frontend_, active_, req, res, /*chat=*/true);
}

void HttpServer::embeddings(const httplib::Request& req, httplib::Response& res) {
  http::ParsedEmbeddings parsed = http::parse_embeddings_request(http::parse_body(req.body));
  request_log().model = parsed.input.model;
  parsed.input.request_id = request_log().request_id;
  const EmbedResult result = frontend_.embed(parsed.input);
  request_log().prompt_tokens = result.prompt_tokens;
  res.set_content(http::dump(http::embeddings_body(result, parsed.input.model, parsed.base64)), kJsonContentType);
}

void HttpServer::models(const httplib::Request&, httplib::Response& res) {
  res.set_content(http::dump(http::models_body(frontend_.models())), kJsonContentType);
}

void HttpServer::tokenize(const httplib::Request& req, httplib::Response& res) {
  const http::ParsedTokenize parsed = http::parse_tokenize_request(http::parse_body(req.body));
  const FrontendModel& model = model_or_first(frontend_, parsed.model);
  request_log().model = model.name;
  std::vector<int32_t> ids;
  if (parsed.messages) {
    const std::string text = frontend_.render_chat(model, *parsed.messages, parsed.add_generation_prompt);
    ids = frontend_.tokenize(model, text, false);
  } else {
    ids = frontend_.tokenize(model, *parsed.prompt, parsed.add_special_tokens);
  }
  res.set_content(http::dump(http::tokenize_body(ids, model.max_model_len)), kJsonContentType);
}

void HttpServer::detokenize(const httplib::Request& req, httplib::Response& res) {
  const http::ParsedDetokenize parsed = http::parse_detokenize_request(http::parse_body(req.body));
  const FrontendModel& model = model_or_first(frontend_, parsed.model);
  request_log().model = model.name;
  res.set_content(http::dump(http::detokenize_body(frontend_.detokenize(model, parsed.tokens, false))),
                  kJsonContentType);
}

// vLLM's /tokenizer_info, which lm-evaluation-harness's remote tokenizer reads; ?model= picks a
// model, the first served one otherwise.
void HttpServer::tokenizer_info(const httplib::Request& req, httplib::Response& res) {
  const FrontendModel& model = model_or_first(frontend_, req.get_param_value("model"));
  request_log().model = model.name;
  res.set_content(http::dump(http::tokenizer_info_body(model)), kJsonContentType);
}

namespace {

// 503 with {"status":"unhealthy","reason":...} when the engine is stalled, failed or gone.
bool answer_unhealthy(const EngineHealth& engine, httplib::Response& res) {
  if (engine.healthy()) return false;
  res.status = 503;
  res.set_content(http::dump({{"status", "unhealthy"}, {"reason", engine.reason()}}), kJsonContentType);
  return true;
}

}  // namespace

void HttpServer::health(const httplib::Request&, httplib::Response& res) {
  if (answer_unhealthy(frontend_.engine_health(), res)) return;
  res.set_content("{\"status\":\"ok\"}", kJsonContentType);
}

void HttpServer::ready(const httplib::Request&, httplib::Response& res) {
  if (frontend_.ready()) {
    res.set_content("{\"status\":\"ready\"}", kJsonContentType);
    return;
  }
  if (!frontend_.draining() && answer_unhealthy(frontend_.engine_health(), res)) return;
  res.status = 503;
  res.set_content(frontend_.draining() ? "{\"status\":\"draining\"}" : "{\"status\":\"starting\"}", kJsonContentType);
}

void HttpServer::metrics(const httplib::Request&, httplib::Response& res) {
  if (!metrics_) {
    res.status = 404;
    return;
  }
  metrics_->set_engine_health(frontend_.engine_health());
  res.set_content(metrics_->expose(), ServerMetrics::kContentType);
}

}  // namespace tessera
