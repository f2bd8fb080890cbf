// server/http/http_server.cpp: routes, OpenAI response shapes, SSE streaming, errors, request logs.
#include "server/http/http_server.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "models/tokenizer/tokenizer.h"
#include "server/config/server_config.h"
#include "server/frontend/frontend.h"
#include "server/http/client_socket.h"
#include "server/http/connection_threads.h"
#include "server/http/openai_request.h"
#include "server/metrics/server_metrics.h"

namespace tessera {
namespace {

using nlohmann::json;
using http::ParsedGenerate;

constexpr const char* kJson = "application/json";
constexpr int kReadTimeoutSeconds = 30;

// What the request log line reports; set by the handler on the worker thread that serves the request,
// which is also the thread that streams its body and then calls the logger.
struct RequestLog {
  Clock::time_point start;
  std::string request_id;
  std::string model;
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  std::string finish;
};
thread_local RequestLog t_log;

// Invalid UTF-8 (a token cut mid-character in logprobs) becomes U+FFFD rather than an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(ErrorKind kind, const std::string& message, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", openai_error_type(kind)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

// The body a client gets for an error. An internal error's detail goes to the log with the request
// id; the client gets only the id.
json client_error_body(const ApiError& e) {
  const ApiError sent = client_facing(e, t_log.request_id);
  return error_body(sent.kind(), sent.what(), sent.param(), sent.code());
}

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = http_status(e.kind());
  if (e.retry_after_seconds() > 0) res.set_header("Retry-After", std::to_string(e.retry_after_seconds()));
  res.set_content(dump(client_error_body(e)), kJson);
  t_log.finish = error_kind_name(e.kind());
}

std::string base64(const void* data, size_t size) {
  static const char* kTable = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < size; i += 3) {
    const uint32_t v = (uint32_t(p[i]) << 16) | (uint32_t(p[i + 1]) << 8) | p[i + 2];
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += kTable[(v >> 6) & 63];
    out += kTable[v & 63];
  }
  if (i < size) {
    uint32_t v = uint32_t(p[i]) << 16;
    if (i + 1 < size) v |= uint32_t(p[i + 1]) << 8;
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += i + 1 < size ? kTable[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

const char* openai_finish_reason(RequestFinishReason reason) {
  return reason == RequestFinishReason::kLength ? "length" : "stop";
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One choice of a generate request: its engine sequence and what it has sent so far.
struct Choice {
  int32_t index = 0;                  // OpenAI's choice index: prompt * n + k
  std::shared_ptr<RequestStream> stream;
  std::string echo;                   // completions with echo: the prompt's text
  std::vector<int32_t> prompt;        // its prompt tokens (echoed logprobs name them)
  bool counts_prompt = false;         // the first choice of its prompt: usage counts its prompt once
  int64_t text_offset = 0;            // completions logprobs: where the next token starts in the text
  bool opened = false;                // streamed: the echo has been sent
  bool finished = false;
  StreamEvent final_event;
};

// One generate request's response, built from its choices' stream events (non-streamed and SSE).
class GenerateResponse {
 public:
  GenerateResponse(const ParsedGenerate& parsed, const PreparedGenerate& prepared)
      : chat_(parsed.chat),
        echo_(parsed.echo),
        include_usage_(parsed.include_usage),
        logprobs_(parsed.chat ? (parsed.chat_logprobs ? parsed.logprobs.value_or(0) : -1) : parsed.logprobs.value_or(-1)),
        tokenizer_(prepared.model->tokenizer.get()),
        id_((parsed.chat ? "chatcmpl-" : "cmpl-") + prepared.request.request_id),
        model_(prepared.model->name),
        created_(unix_now()) {}

  std::vector<Choice>& choices() { return choices_; }
  bool chat() const { return chat_; }
  bool include_usage() const { return include_usage_; }

  // The object fields every response and chunk starts with.
  json head(bool chunk) const {
    return {{"id", id_},
            {"object", chat_ ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", created_},
            {"model", model_}};
  }

  // Over every choice: each prompt counted once, every choice's completion. cached_tokens: prompt
  // tokens whose K/V was reused (prefix cache, document copies), as OpenAI reports its own cache.
  json usage() const {
    int64_t prompt = 0, completion = 0, cached = 0;
    for (const Choice& c : choices_) {
      if (c.counts_prompt) {
        prompt += c.final_event.prompt_tokens;
        cached += c.final_event.cached_prompt_tokens;
      }
      completion += c.final_event.completion_tokens;
    }
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  // The logprobs of some of a choice's tokens in the endpoint's shape; null when not requested.
  // `prompt` (completions with echo): the prompt's logprobs go first, the first token's null.
  json logprobs(Choice& choice, const std::vector<StreamTokenLogprob>* prompt,
                const std::vector<StreamTokenLogprob>& items) {
    if (logprobs_ < 0) return nullptr;
    if (chat_) {
      json content = json::array();
      for (const auto& item : items) {
        json top = json::array();
        for (const auto& [id, lp] : item.top) top.push_back(token_entry(id, lp));
        json entry = token_entry(item.token, item.logprob);
        entry["top_logprobs"] = std::move(top);
        content.push_back(std::move(entry));
      }
      return {{"content", std::move(content)}};
    }
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
         offsets = json::array();
    // text_offset counts the text before each token: token strings add up as the text does.
    auto add = [&](int32_t token, json logprob, json top) {
      const std::string piece = token_string(token);
      tokens.push_back(piece);
      token_logprobs.push_back(std::move(logprob));
      top_logprobs.push_back(std::move(top));
      offsets.push_back(choice.text_offset);
      choice.text_offset += static_cast<int64_t>(piece.size());
    };
    auto top_of = [&](const StreamTokenLogprob& item) {
      json top = json::object();
      for (const auto& [id, lp] : item.top) top[token_string(id)] = lp;
      return top;
    };
    if (prompt != nullptr) {
      for (size_t i = 0; i < choice.prompt.size(); ++i) {
        if (i == 0 || i > prompt->size()) {
          add(choice.prompt[i], nullptr, nullptr);  // the first token has nothing before it
        } else {
          add(choice.prompt[i], (*prompt)[i - 1].logprob, top_of((*prompt)[i - 1]));
        }
      }
    }
    for (const auto& item : items) add(item.token, item.logprob, top_of(item));
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
            {"text_offset", offsets}};
  }

  // Non-streamed: one choice of the whole response.
  json complete_choice(Choice& choice, const std::string& text, const std::vector<StreamTokenLogprob>& prompt_logprobs,
                       const std::vector<StreamTokenLogprob>& items) {
    json out = {{"index", choice.index}};
    if (chat_) {
      out["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      out["text"] = choice.echo + text;
    }
    out["logprobs"] = logprobs(choice, echo_ ? &prompt_logprobs : nullptr, items);
    out["finish_reason"] = openai_finish_reason(choice.final_event.finish_reason);
    return out;
  }

  json complete(json choices) const {
    json out = head(false);
    out["choices"] = std::move(choices);
    out["usage"] = usage();
    return out;
  }

  // Streamed: the chunk for one choice's delta. `first`: chat's opening chunk with the role;
  // `prompt`: completions' echo, whose text goes first.
  json chunk(Choice& choice, const std::string& text, const std::vector<StreamTokenLogprob>* prompt,
             const std::vector<StreamTokenLogprob>& items, const char* finish_reason, bool first) {
    json out = head(true);
    json c = {{"index", choice.index}};
    if (chat_) {
      json delta = json::object();
      if (first) delta["role"] = "assistant";
      if (!text.empty() || first) delta["content"] = text;
      c["delta"] = std::move(delta);
    } else {
      c["text"] = (prompt != nullptr ? choice.echo : std::string()) + text;
    }
    c["logprobs"] = logprobs(choice, prompt, items);
    c["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
    out["choices"] = json::array({std::move(c)});
    if (include_usage_) out["usage"] = nullptr;  // OpenAI: null on every chunk but the last
    return out;
  }

  json usage_chunk() const {
    json out = head(true);
    out["choices"] = json::array();
    out["usage"] = usage();
    return out;
  }

 private:
  std::string token_string(int32_t id) const { return tokenizer_->decode({id}, /*skip_special=*/false); }
  json token_entry(int32_t id, float lp) const {
    const std::string piece = token_string(id);
    json bytes = json::array();
    for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
    return {{"token", piece}, {"logprob", lp}, {"bytes", std::move(bytes)}};
  }

  bool chat_;
  bool echo_;
  bool include_usage_;
  int32_t logprobs_;  // -1: not requested
  const Tokenizer* tokenizer_;
  std::string id_;
  std::string model_;
  int64_t created_;
  std::vector<Choice> choices_;
};

// The error a final event that is not a success becomes.
ApiError final_error(const StreamEvent& event) {
  switch (event.finish_reason) {
    case RequestFinishReason::kDeadline:
      return ApiError(ErrorKind::kDeadline, "The request did not finish before its deadline.");
    case RequestFinishReason::kCancelled: return ApiError(ErrorKind::kCancelled, "The request was cancelled.");
    default:
      return ApiError(ErrorKind::kInternal, event.error.empty() ? std::string("generation failed") : event.error);
  }
}

// Counts one in-flight request for drain while it lives.
class ActiveRequest {
 public:
  explicit ActiveRequest(std::shared_ptr<std::atomic<int>> counter) : counter_(std::move(counter)) { ++*counter_; }
  ~ActiveRequest() { --*counter_; }
  ActiveRequest(const ActiveRequest&) = delete;
  ActiveRequest& operator=(const ActiveRequest&) = delete;

 private:
  std::shared_ptr<std::atomic<int>> counter_;
};

struct SseState {
  std::unique_ptr<ActiveRequest> active;  // until the stream's body is written (or cut)
  std::unique_ptr<GenerateResponse> response;
  bool opened = false;    // chat: every choice's role chunk is out
  bool finished = false;  // every choice has finished, or one failed
  size_t next = 0;        // the choice polled first next time, so none starves
  void cancel_all() {
    for (Choice& c : response->choices()) c.stream->cancel();
  }
};

}  // namespace

HttpServer::HttpServer(const ServerConfig& config, Frontend& frontend, ServerMetrics* metrics)
    : config_(config), frontend_(frontend), metrics_(metrics), server_(std::make_unique<httplib::Server>()) {
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
  register_routes();
}

HttpServer::~HttpServer() { stop(); }

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

void HttpServer::register_routes() {
  httplib::Server& s = *server_;

  s.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    t_log = RequestLog{};
    t_log.start = Clock::now();
    t_log.request_id = Frontend::request_id_or_new(req.get_header_value("X-Request-Id"));
    res.set_header("X-Request-Id", t_log.request_id);
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // httplib's own errors (unknown route, chunked body over the limit, unreadable body) get
  // OpenAI-shaped bodies too; responses that already carry one are left alone.
  // A body over limits.max_body_bytes is read and discarded by httplib (so the client, still sending,
  // gets the 413 rather than a reset connection) and lands here.
  const int64_t body_limit = config_.limits.max_body_bytes;
  s.set_error_handler(httplib::Server::HandlerWithResponse([body_limit](const httplib::Request& req,
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
    res.set_content(dump(error_body(kind, message, "", "")), kJson);
    t_log.finish = error_kind_name(kind);
    return httplib::Server::HandlerResponse::Handled;
  }));

  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = std::string("unhandled exception: ") + e.what();
    } catch (...) {
    }
    write_error(res, ApiError(ErrorKind::kInternal, message));  // logged with the request id, not sent
  });

  s.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t_log.start).count();
    std::string extra;
    if (!t_log.model.empty()) extra += " model=" + t_log.model;
    if (t_log.prompt_tokens >= 0) extra += " prompt_tokens=" + std::to_string(t_log.prompt_tokens);
    if (t_log.completion_tokens >= 0) extra += " completion_tokens=" + std::to_string(t_log.completion_tokens);
    if (!t_log.finish.empty()) extra += " finish=" + t_log.finish;
    spdlog::info("http {} {} {} {:.1f}ms{} rid={}", req.method, req.path, res.status, ms, extra, t_log.request_id);
  });

  // Runs an inference handler: key check, then ApiError -> OpenAI error body, counted as a failure.
  auto inference = [this](auto&& handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      ActiveRequest active(active_);
      try {
        frontend_.check_api_key(req.get_header_value("Authorization"));
        handler(req, res);
      } catch (const ApiError& e) {
        write_error(res, e);
        frontend_.count_rejection(e.kind(), t_log.model);
      } catch (const Error& e) {
        write_error(res, ApiError(ErrorKind::kInvalidRequest, user_message(e)));
        frontend_.count_rejection(ErrorKind::kInvalidRequest, t_log.model);
      }
    };
  };

  auto generate = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    const json body = http::parse_body(req.body);
    ParsedGenerate parsed = chat ? http::parse_chat_request(body) : http::parse_completion_request(body);
    t_log.model = parsed.input.model;
    parsed.input.request_id = t_log.request_id;
    // Every choice is validated before any is submitted: one bad prompt refuses the whole request.
    std::vector<http::CompletionPrompt> prompts = parsed.prompts;
    if (prompts.empty()) prompts.push_back({parsed.input.prompt_text, parsed.input.prompt_tokens});
    std::vector<PreparedGenerate> prepared;
    std::vector<size_t> prompt_of;  // per choice, its prompt
    for (size_t p = 0; p < prompts.size(); ++p) {
      GenerateInput input = parsed.input;
      if (!chat) {
        input.prompt_text = prompts[p].text;
        input.prompt_tokens = prompts[p].tokens;
        if (prompts.size() > 1) input.request_id += "-p" + std::to_string(p);
      }
      for (PreparedGenerate& choice : frontend_.prepare_choices(input, parsed.n)) {
        prepared.push_back(std::move(choice));
        prompt_of.push_back(p);
      }
    }
    t_log.prompt_tokens = 0;
    for (size_t i = 0; i < prepared.size(); ++i) {
      if (i == 0 || prompt_of[i] != prompt_of[i - 1]) t_log.prompt_tokens += static_cast<int64_t>(prepared[i].request.prompt.size());
    }
    auto response = std::make_unique<GenerateResponse>(parsed, prepared[0]);
    std::vector<Choice>& choices = response->choices();
    const Clock::time_point deadline = prepared[0].request.deadline;
    try {
      for (size_t i = 0; i < prepared.size(); ++i) {
        Choice c;
        c.index = static_cast<int32_t>(i);
        c.counts_prompt = i == 0 || prompt_of[i] != prompt_of[i - 1];
        c.prompt = prepared[i].request.prompt;
        if (parsed.echo) {
          const std::optional<std::string>& text = prompts[prompt_of[i]].text;
          c.echo = text ? *text : frontend_.detokenize(*prepared[i].model, c.prompt, false);
        }
        c.stream = frontend_.submit_generate(prepared[i]);
        choices.push_back(std::move(c));
      }
    } catch (...) {
      for (Choice& c : choices) c.stream->cancel();  // a later choice was refused (queue full)
      throw;
    }
    auto fail = [&](const StreamEvent& event) {
      for (Choice& c : choices) c.stream->cancel();
      throw final_error(event);
    };

    if (!parsed.stream) {
      // Nothing is written until the whole response is ready, so the connection is watched for a
      // client that gives up first: its sequences are cancelled at the next token or within 20 ms.
      const ClientSocket client = ClientSocket::find(req.remote_addr, req.remote_port, req.local_port);
      json out_choices = json::array();
      int64_t completion_tokens = 0;
      for (Choice& choice : choices) {
        std::string text;
        std::vector<StreamTokenLogprob> logprobs, prompt_logprobs;
        for (;;) {
          std::optional<StreamEvent> event = choice.stream->next(std::chrono::milliseconds(20));
          if (client.closed()) {
            for (Choice& c : choices) c.stream->cancel();
            t_log.finish = "client_disconnected";
            res.status = 499;  // for the request log; nobody is left to read it
            return;
          }
          if (!event) {
            // The engine ends every request by its deadline; this only guards against a lost final event.
            if (deadline != Clock::time_point::max() && Clock::now() > deadline + std::chrono::seconds(10)) {
              for (Choice& c : choices) c.stream->cancel();
              throw ApiError(ErrorKind::kDeadline, "The request did not finish before its deadline.");
            }
            continue;
          }
          text += event->text;
          logprobs.insert(logprobs.end(), event->logprobs.begin(), event->logprobs.end());
          prompt_logprobs.insert(prompt_logprobs.end(), event->prompt_logprobs.begin(), event->prompt_logprobs.end());
          if (!event->final) continue;
          t_log.finish = finish_reason_name(event->finish_reason);
          if (event->finish_reason != RequestFinishReason::kStop && event->finish_reason != RequestFinishReason::kLength) {
            fail(*event);
          }
          completion_tokens += event->completion_tokens;
          choice.final_event = std::move(*event);
          break;
        }
        out_choices.push_back(response->complete_choice(choice, text, prompt_logprobs, logprobs));
      }
      t_log.completion_tokens = completion_tokens;
      res.set_content(dump(response->complete(std::move(out_choices))), kJson);
      return;
    }

    auto state = std::make_shared<SseState>();
    state->active = std::make_unique<ActiveRequest>(active_);
    state->response = std::move(response);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [state](size_t, httplib::DataSink& sink) {
          GenerateResponse& r = *state->response;
          std::vector<Choice>& choices = r.choices();
          auto send = [&](const std::string& data) {
            const std::string frame = "data: " + data + "\n\n";
            if (sink.write(frame.data(), frame.size())) return true;
            state->cancel_all();  // the client went away
            t_log.finish = "client_disconnected";
            return false;
          };
          if (state->finished) {
            sink.done();
            return true;
          }
          if (!state->opened) {
            state->opened = true;
            // Chat opens each choice with its role.
            if (r.chat()) {
              for (Choice& c : choices) {
                if (!send(dump(r.chunk(c, "", nullptr, {}, nullptr, true)))) return false;
              }
              return true;
            }
          }
          // The next event of any unfinished choice, taking them in turn.
          Choice* choice = nullptr;
          std::optional<StreamEvent> event;
          while (!event) {
            for (size_t j = 0; j < choices.size() && !event; ++j) {
              Choice& c = choices[(state->next + j) % choices.size()];
              if (c.finished) continue;
              // One choice left waits on its stream; several poll each other in turn.
              const bool alone = choices.size() == 1;
              event = c.stream->next(std::chrono::milliseconds(alone ? 100 : 0));
              if (event) {
                choice = &c;
                state->next = (state->next + j + 1) % choices.size();
              }
            }
            if (event) break;
            if (!sink.is_writable()) {
              state->cancel_all();
              t_log.finish = "client_disconnected";
              return false;
            }
            if (choices.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          // Completions with echo open a choice with the prompt's text (and its logprobs, which
          // come with the choice's first event).
          const bool open_echo = !r.chat() && !choice->opened && !choice->echo.empty();
          choice->opened = true;
          if (open_echo || !event->text.empty() || !event->logprobs.empty()) {
            if (!send(dump(r.chunk(*choice, event->text, open_echo ? &event->prompt_logprobs : nullptr,
                                   event->logprobs, nullptr, false)))) {
              return false;
            }
          }
          if (!event->final) return true;
          choice->finished = true;
          const bool ok = event->finish_reason == RequestFinishReason::kStop ||
                          event->finish_reason == RequestFinishReason::kLength;
          t_log.finish = finish_reason_name(event->finish_reason);
          if (!ok) {
            // Headers are out already: the error travels as an event, as vLLM and OpenAI send it.
            state->finished = true;
            state->cancel_all();
            if (!send(dump(client_error_body(final_error(*event))))) return false;
            if (!send("[DONE]")) return false;
            sink.done();
            return true;
          }
          choice->final_event = std::move(*event);
          if (!send(dump(r.chunk(*choice, "", nullptr, {}, openai_finish_reason(choice->final_event.finish_reason), false)))) {
            return false;
          }
          if (!std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.finished; })) return true;
          state->finished = true;
          int64_t completion_tokens = 0;
          for (const Choice& c : choices) completion_tokens += c.final_event.completion_tokens;
          t_log.completion_tokens = completion_tokens;
          if (r.include_usage() && !send(dump(r.usage_chunk()))) return false;
          if (!send("[DONE]")) return false;
          sink.done();
          return true;
        },
        [state](bool success) {
          if (!success || !state->finished) state->cancel_all();
          state->active.reset();
        });
  };

  s.Post("/v1/completions", inference([generate](const httplib::Request& req, httplib::Response& res) {
           generate(req, res, false);
         }));
  s.Post("/v1/chat/completions", inference([generate](const httplib::Request& req, httplib::Response& res) {
           generate(req, res, true);
         }));

  s.Post("/v1/embeddings", inference([this](const httplib::Request& req, httplib::Response& res) {
           http::ParsedEmbeddings parsed = http::parse_embeddings_request(http::parse_body(req.body));
           t_log.model = parsed.input.model;
           parsed.input.request_id = t_log.request_id;
           const EmbedResult result = frontend_.embed(parsed.input);
           t_log.prompt_tokens = result.prompt_tokens;
           json data = json::array();
           for (size_t i = 0; i < result.embeddings.size(); ++i) {
             const std::vector<float>& e = result.embeddings[i];
             json item = {{"object", "embedding"}, {"index", i}};
             // base64: the float32 values' bytes, little-endian (x86 and ARM are), as OpenAI sends them.
             item["embedding"] = parsed.base64 ? json(base64(e.data(), e.size() * sizeof(float))) : json(e);
             data.push_back(std::move(item));
           }
           const json out = {{"object", "list"},
                             {"data", std::move(data)},
                             {"model", parsed.input.model},
                             {"usage", {{"prompt_tokens", result.prompt_tokens}, {"total_tokens", result.prompt_tokens}}}};
           res.set_content(dump(out), kJson);
         }));

  s.Get("/v1/models", inference([this](const httplib::Request&, httplib::Response& res) {
          json data = json::array();
          for (const FrontendModel* m : frontend_.models()) {
            data.push_back({{"id", m->name},
                            {"object", "model"},
                            {"created", m->created},
                            {"owned_by", "tessera"},
                            {"root", m->name},
                            {"max_model_len", m->max_model_len},
                            {"tessera", {{"kind", model_kind_name(m->kind)}}}});
          }
          res.set_content(dump({{"object", "list"}, {"data", std::move(data)}}), kJson);
        }));

  auto model_or_first = [this](const std::string& name) -> const FrontendModel& {
    if (!name.empty()) return frontend_.find_any_model(name);
    const auto models = frontend_.models();
    if (models.empty()) throw ApiError(ErrorKind::kNotFound, "no model is served", "model");
    return *models.front();
  };

  s.Post("/tokenize", inference([this, model_or_first](const httplib::Request& req, httplib::Response& res) {
           const http::ParsedTokenize parsed = http::parse_tokenize_request(http::parse_body(req.body));
           const FrontendModel& model = model_or_first(parsed.model);
           t_log.model = model.name;
           std::vector<int32_t> ids;
           if (parsed.messages) {
             const std::string text = frontend_.render_chat(model, *parsed.messages, parsed.add_generation_prompt);
             ids = frontend_.tokenize(model, text, false);
           } else {
             ids = frontend_.tokenize(model, *parsed.prompt, parsed.add_special_tokens);
           }
           res.set_content(dump({{"count", ids.size()}, {"max_model_len", model.max_model_len}, {"tokens", ids}}), kJson);
         }));

  s.Post("/detokenize", inference([this, model_or_first](const httplib::Request& req, httplib::Response& res) {
           const http::ParsedDetokenize parsed = http::parse_detokenize_request(http::parse_body(req.body));
           const FrontendModel& model = model_or_first(parsed.model);
           t_log.model = model.name;
           res.set_content(dump({{"prompt", frontend_.detokenize(model, parsed.tokens, false)}}), kJson);
         }));

  // Probes: a key only when configured to need one.
  auto probe = [this](bool protect, auto&& handler) {
    return [this, protect, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        if (protect) frontend_.check_api_key(req.get_header_value("Authorization"));
        handler(res);
      } catch (const ApiError& e) {
        write_error(res, e);
      }
    };
  };
  s.Get("/health", probe(config_.auth.protect_health, [](httplib::Response& res) {
          res.set_content("{\"status\":\"ok\"}", kJson);
        }));
  s.Get("/ready", probe(config_.auth.protect_health, [this](httplib::Response& res) {
          if (frontend_.ready()) {
            res.set_content("{\"status\":\"ready\"}", kJson);
            return;
          }
          res.status = 503;
          res.set_content(frontend_.draining() ? "{\"status\":\"draining\"}" : "{\"status\":\"starting\"}", kJson);
        }));
  s.Get("/metrics", probe(config_.auth.protect_metrics, [this](httplib::Response& res) {
          if (!metrics_) {
            res.status = 404;
            return;
          }
          res.set_content(metrics_->expose(), ServerMetrics::kContentType);
        }));
}

}  // namespace tessera
