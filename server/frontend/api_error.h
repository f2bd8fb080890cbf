// server/frontend/api_error.h: ApiError, the one error type both protocols raise to a client, and
// its mapping to HTTP statuses / OpenAI error bodies and to gRPC status codes.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

enum class ErrorKind {
  kInvalidRequest,          // HTTP 400 / INVALID_ARGUMENT
  kContextLengthExceeded,   // HTTP 400 / INVALID_ARGUMENT (OpenAI's code "context_length_exceeded")
  kUnauthorized,            // HTTP 401 / UNAUTHENTICATED
  kNotFound,                // HTTP 404 / NOT_FOUND (unknown model)
  kTooLarge,                // HTTP 413 / RESOURCE_EXHAUSTED (body over the limit)
  kQueueFull,               // HTTP 429 + Retry-After / RESOURCE_EXHAUSTED
  kDraining,                // HTTP 503 / UNAVAILABLE (SIGTERM received)
  kDeadline,                // HTTP 504 / DEADLINE_EXCEEDED
  kCancelled,               // HTTP 499 (client gone; never seen) / CANCELLED
  kInternal,                // HTTP 500 / INTERNAL
};

const char* error_kind_name(ErrorKind kind);  // "invalid_request", "context_length_exceeded", ...
int http_status(ErrorKind kind);
// OpenAI's error.type: "invalid_request_error", "authentication_error", "not_found_error", ...
const char* openai_error_type(ErrorKind kind);
// The numeric grpc::StatusCode (INVALID_ARGUMENT = 3, ...); numeric so that frontend/ does not
// depend on gRPC. gRPC code casts: static_cast<grpc::StatusCode>(grpc_status_code(kind)).
int grpc_status_code(ErrorKind kind);

class ApiError : public std::runtime_error {
 public:
  // param: the request field at fault ("temperature", "messages[1].content"), "" for none.
  // code: OpenAI's error.code ("context_length_exceeded", "model_not_found", ...), "" for null.
  ApiError(ErrorKind kind, std::string message, std::string param = "", std::string code = "");

  ErrorKind kind() const { return kind_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // Seconds a client should wait before retrying (kQueueFull, kDraining), 0 otherwise.
  int retry_after_seconds() const;

 private:
  ErrorKind kind_;
  std::string param_;
  std::string code_;
};

// What a client is told of an internal error (HTTP 500, gRPC INTERNAL): the request id, which finds
// the detail in the server's log, and never the detail itself (it may name files or code).
std::string internal_error_message(const std::string& request_id);
// The error as a client sees it: unchanged, except an internal error, whose detail is logged with
// the request id and replaced by internal_error_message. Both protocols send errors through it.
ApiError client_facing(const ApiError& error, const std::string& request_id);

// tessera::Error messages carry a " [check `expr` failed in f at file:line]" suffix for developers;
// this strips it for clients.
std::string user_message(const std::exception& error);

}  // namespace tessera
