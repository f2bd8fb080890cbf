// server/http/sse.cpp: SSE events and response headers on cpp-httplib.
#include "server/http/sse.h"

#include <string>
#include <utility>

#include <httplib.h>

namespace tessera::http {

bool write_sse_event(httplib::DataSink& sink, std::string_view payload) {
  const std::string frame = "data: " + std::string(payload) + "\n\n";
  return sink.write(frame.data(), frame.size());
}

void stream_sse(httplib::Response& response, std::function<bool(httplib::DataSink&)> next,
                std::function<void(bool success)> release) {
  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Accel-Buffering", "no");
  response.set_chunked_content_provider(
      "text/event-stream", [next = std::move(next)](size_t, httplib::DataSink& sink) { return next(sink); },
      std::move(release));
}

}  // namespace tessera::http
