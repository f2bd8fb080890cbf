// server/http/generate_stream.h: a completions or chat completions response streamed as SSE: chat's
// role chunks, then every choice's deltas in turn as their events arrive, each choice's finish
// chunk, usage when asked for, and [DONE]. An error after the headers travels as an event.
#pragma once

#include <memory>

#include "server/http/active_request.h"
#include "server/http/openai_response.h"

namespace httplib {
struct Response;
}

namespace tessera::http {

// Hands `response`'s choices, already submitted, to httplib to stream; the request counts as active
// until the body is written or cut. A client that goes away cancels every choice.
void stream_generate(httplib::Response& res, std::unique_ptr<GenerateResponse> response,
                     std::unique_ptr<ActiveRequest> active);

}  // namespace tessera::http
