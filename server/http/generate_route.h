// server/http/generate_route.h: POST /v1/completions and /v1/chat/completions: every choice of the
// request validated before any is submitted, then one JSON body or an SSE stream.
#pragma once

#include <atomic>
#include <memory>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace tessera {
class Frontend;
}

namespace tessera::http {

// Throws ApiError for a request refused before anything is sent; `active` counts the streamed
// response until its body is written.
void serve_generate(Frontend& frontend, const std::shared_ptr<std::atomic<int>>& active, const httplib::Request& req,
                    httplib::Response& res, bool chat);

}  // namespace tessera::http
