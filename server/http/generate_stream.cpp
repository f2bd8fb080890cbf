// server/http/generate_stream.cpp: the SSE state of one streamed generate response.
#include "server/http/generate_stream.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>

#include "server/http/request_log.h"
#include "server/http/sse.h"

namespace tessera::http {
namespace {

// httplib calls write_next whenever the client can take more, each time on the request's thread.
class GenerateStream {
 public:
  GenerateStream(std::unique_ptr<GenerateResponse> response, std::unique_ptr<ActiveRequest> active)
      : response_(std::move(response)), active_(std::move(active)) {}

  // Writes what is ready; false when the client went away.
  bool write_next(httplib::DataSink& sink);
  // The body is written (success) or cut: whatever has not finished stops.
  void release(bool success);

 private:
  struct ChoiceEvent {
    Choice* choice;
    StreamEvent event;
  };

  bool send(httplib::DataSink& sink, std::string_view payload);
  void client_gone();
  bool send_roles(httplib::DataSink& sink);
  std::optional<ChoiceEvent> wait_next_event(httplib::DataSink& sink);
  std::optional<ChoiceEvent> poll_choices();
  bool send_delta(httplib::DataSink& sink, Choice& choice, const StreamEvent& event);
  bool send_parsed(httplib::DataSink& sink, Choice& choice, const ParsedOutput& parsed,
                   const std::vector<StreamTokenLogprob>& logprobs);
  bool finish_choice(httplib::DataSink& sink, Choice& choice, StreamEvent event);
  bool send_failure(httplib::DataSink& sink, const StreamEvent& event);
  bool send_end(httplib::DataSink& sink);

  std::unique_ptr<GenerateResponse> response_;
  std::unique_ptr<ActiveRequest> active_;  // until the body is written (or cut)
  bool opened_ = false;    // chat: every choice's role chunk is out
  bool finished_ = false;  // every choice has finished, or one failed
  size_t next_ = 0;        // the choice polled first next time, so none starves
};

bool GenerateStream::write_next(httplib::DataSink& sink) {
  if (finished_) {
    sink.done();
    return true;
  }
  if (!opened_) {
    opened_ = true;
    if (response_->chat()) return send_roles(sink);
  }
  std::optional<ChoiceEvent> next = wait_next_event(sink);
  if (!next) return false;
  if (!send_delta(sink, *next->choice, next->event)) return false;
  if (!next->event.final) return true;
  return finish_choice(sink, *next->choice, std::move(next->event));
}

void GenerateStream::release(bool success) {
  if (!success || !finished_) response_->cancel_all();
  active_.reset();
}

bool GenerateStream::send(httplib::DataSink& sink, std::string_view payload) {
  if (write_sse_event(sink, payload)) return true;
  client_gone();
  return false;
}

void GenerateStream::client_gone() {
  response_->cancel_all();
  request_log().finish = "client_disconnected";
}

// Chat opens each choice with its role.
bool GenerateStream::send_roles(httplib::DataSink& sink) {
  for (Choice& c : response_->choices()) {
    if (!send(sink, dump(response_->chunk(c, "", nullptr, {}, nullptr, true)))) return false;
  }
  return true;
}

// The next event of any unfinished choice; nullopt when the client went away meanwhile.
std::optional<GenerateStream::ChoiceEvent> GenerateStream::wait_next_event(httplib::DataSink& sink) {
  const bool several = response_->choices().size() > 1;
  for (;;) {
    if (std::optional<ChoiceEvent> next = poll_choices()) return next;
    if (!sink.is_writable()) {
      client_gone();
      return std::nullopt;
    }
    if (several) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Takes the unfinished choices in turn. One choice waits on its stream; several poll each other.
std::optional<GenerateStream::ChoiceEvent> GenerateStream::poll_choices() {
  std::vector<Choice>& choices = response_->choices();
  const std::chrono::milliseconds wait(choices.size() == 1 ? 100 : 0);
  for (size_t j = 0; j < choices.size(); ++j) {
    Choice& c = choices[(next_ + j) % choices.size()];
    if (c.finished) continue;
    if (std::optional<StreamEvent> event = c.stream->next(wait)) {
      next_ = (next_ + j + 1) % choices.size();
      return ChoiceEvent{&c, std::move(*event)};
    }
  }
  return std::nullopt;
}

// Completions with echo open a choice with the prompt's text (and its logprobs, which come with the
// choice's first event).
bool GenerateStream::send_delta(httplib::DataSink& sink, Choice& choice, const StreamEvent& event) {
  const bool open_echo = !response_->chat() && !choice.opened && !choice.echo.empty();
  choice.opened = true;
  if (choice.tool_parser) return send_parsed(sink, choice, choice.tool_parser->push(event.text), event.logprobs);
  if (!open_echo && event.text.empty() && event.logprobs.empty()) return true;
  return send(sink, dump(response_->chunk(choice, event.text, open_echo ? &event.prompt_logprobs : nullptr,
                                          event.logprobs, nullptr, false)));
}

// With tools: the content, then the tool-call deltas, of what the parser has decided so far.
bool GenerateStream::send_parsed(httplib::DataSink& sink, Choice& choice, const ParsedOutput& parsed,
                                 const std::vector<StreamTokenLogprob>& logprobs) {
  if (!parsed.content.empty() || !logprobs.empty()) {
    if (!send(sink, dump(response_->chunk(choice, parsed.content, nullptr, logprobs, nullptr, false)))) return false;
  }
  for (const nlohmann::json& chunk : response_->tool_call_chunks(choice, parsed.tool_calls)) {
    if (!send(sink, dump(chunk))) return false;
  }
  return true;
}

bool GenerateStream::finish_choice(httplib::DataSink& sink, Choice& choice, StreamEvent event) {
  choice.finished = true;
  request_log().finish = finish_reason_name(event.finish_reason);
  if (!finished_normally(event)) return send_failure(sink, event);
  choice.final_event = std::move(event);
  if (choice.tool_parser && !send_parsed(sink, choice, choice.tool_parser->finish(), {})) return false;
  const char* reason = GenerateResponse::finish_reason(choice);
  if (!send(sink, dump(response_->chunk(choice, "", nullptr, {}, reason, false)))) return false;
  const std::vector<Choice>& choices = response_->choices();
  if (!std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.finished; })) return true;
  return send_end(sink);
}

// Headers are out already: the error travels as an event, as vLLM and OpenAI send it.
bool GenerateStream::send_failure(httplib::DataSink& sink, const StreamEvent& event) {
  finished_ = true;
  response_->cancel_all();
  if (!send(sink, dump(client_error_body(final_event_error(event), request_log().request_id)))) return false;
  if (!send(sink, kSseDone)) return false;
  sink.done();
  return true;
}

bool GenerateStream::send_end(httplib::DataSink& sink) {
  finished_ = true;
  request_log().completion_tokens = response_->completion_tokens();
  if (response_->include_usage() && !send(sink, dump(response_->usage_chunk()))) return false;
  if (!send(sink, kSseDone)) return false;
  sink.done();
  return true;
}

}  // namespace

void stream_generate(httplib::Response& res, std::unique_ptr<GenerateResponse> response,
                     std::unique_ptr<ActiveRequest> active) {
  auto stream = std::make_shared<GenerateStream>(std::move(response), std::move(active));
  stream_sse(
      res, [stream](httplib::DataSink& sink) { return stream->write_next(sink); },
      [stream](bool success) { stream->release(success); });
}

}  // namespace tessera::http
