// server/frontend/api_error.cpp: ApiError and its HTTP / OpenAI / gRPC mappings, in one place.
#include "server/frontend/api_error.h"

#include <spdlog/spdlog.h>

namespace tessera {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest: return "invalid_request";
    case ErrorKind::kContextLengthExceeded: return "context_length_exceeded";
    case ErrorKind::kUnauthorized: return "unauthorized";
    case ErrorKind::kNotFound: return "not_found";
    case ErrorKind::kTooLarge: return "too_large";
    case ErrorKind::kQueueFull: return "queue_full";
    case ErrorKind::kDraining: return "draining";
    case ErrorKind::kDeadline: return "deadline";
    case ErrorKind::kCancelled: return "cancelled";
    case ErrorKind::kInternal: return "internal";
  }
  return "internal";
}

int http_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest: return 400;
    case ErrorKind::kContextLengthExceeded: return 400;
    case ErrorKind::kUnauthorized: return 401;
    case ErrorKind::kNotFound: return 404;
    case ErrorKind::kTooLarge: return 413;
    case ErrorKind::kQueueFull: return 429;
    case ErrorKind::kDraining: return 503;
    case ErrorKind::kDeadline: return 504;
    case ErrorKind::kCancelled: return 499;  // nginx's "client closed request": the client never sees it
    case ErrorKind::kInternal: return 500;
  }
  return 500;
}

const char* openai_error_type(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kContextLengthExceeded:
    case ErrorKind::kTooLarge: return "invalid_request_error";
    case ErrorKind::kUnauthorized: return "authentication_error";
    case ErrorKind::kNotFound: return "not_found_error";
    case ErrorKind::kQueueFull: return "rate_limit_error";
    case ErrorKind::kDraining: return "service_unavailable_error";
    case ErrorKind::kDeadline: return "timeout_error";
    case ErrorKind::kCancelled: return "cancelled_error";
    case ErrorKind::kInternal: return "server_error";
  }
  return "server_error";
}

int grpc_status_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kContextLengthExceeded: return 3;  // INVALID_ARGUMENT
    case ErrorKind::kUnauthorized: return 16;          // UNAUTHENTICATED
    case ErrorKind::kNotFound: return 5;               // NOT_FOUND
    case ErrorKind::kTooLarge:
    case ErrorKind::kQueueFull: return 8;              // RESOURCE_EXHAUSTED
    case ErrorKind::kDraining: return 14;              // UNAVAILABLE
    case ErrorKind::kDeadline: return 4;               // DEADLINE_EXCEEDED
    case ErrorKind::kCancelled: return 1;              // CANCELLED
    case ErrorKind::kInternal: return 13;              // INTERNAL
  }
  return 13;
}

ApiError::ApiError(ErrorKind kind, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), kind_(kind), param_(std::move(param)), code_(std::move(code)) {
  if (code_.empty() && kind_ == ErrorKind::kContextLengthExceeded) code_ = "context_length_exceeded";
}

int ApiError::retry_after_seconds() const { return kind_ == ErrorKind::kQueueFull ? 1 : 0; }

std::string internal_error_message(const std::string& request_id) {
  return "The server failed to complete the request (request id " + request_id +
         "); the server log has the details.";
}

ApiError client_facing(const ApiError& error, const std::string& request_id) {
  if (error.kind() != ErrorKind::kInternal) return error;
  spdlog::error("internal error, request {}: {}", request_id, error.what());
  return ApiError(ErrorKind::kInternal, internal_error_message(request_id));
}

std::string user_message(const std::exception& error) {
  std::string message = error.what();
  const size_t check = message.find(" [check `");
  if (check != std::string::npos && message.back() == ']') message.resize(check);
  return message;
}

}  // namespace tessera
