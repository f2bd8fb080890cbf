// server/http/sse.h: Server-Sent Events framing as OpenAI streams it: a `data: <payload>` event per
// chunk, the last one `data: [DONE]`, on a response that proxies must not buffer.
#pragma once

#include <functional>
#include <string_view>

namespace httplib {
class DataSink;
struct Response;
}  // namespace httplib

namespace tessera::http {

// The payload of the event that ends a stream.
constexpr std::string_view kSseDone = "[DONE]";

// One event; false when the client went away.
bool write_sse_event(httplib::DataSink& sink, std::string_view payload);

// Makes `response` an event stream. httplib calls `next` whenever the client can take more: it
// writes what is ready and returns false when the client went away. `release` runs once the stream
// ends, with false when it was cut.
void stream_sse(httplib::Response& response, std::function<bool(httplib::DataSink&)> next,
                std::function<void(bool success)> release);

}  // namespace tessera::http
