// server/http/generate_route.cpp: a generate request's choices prepared and submitted, and its
// non-streamed response collected while the client is watched.
#include "server/http/generate_route.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include "server/frontend/frontend.h"
#include "server/http/client_socket.h"
#include "server/http/generate_stream.h"
#include "server/http/openai_request.h"
#include "server/http/openai_response.h"
#include "server/http/request_log.h"

namespace tessera::http {
namespace {

// A generate request with every choice validated and none submitted.
struct PreparedChoices {
  ParsedGenerate parsed;
  std::vector<CompletionPrompt> prompts;
  std::vector<PreparedGenerate> choices;
  std::vector<size_t> prompt_of;  // per choice, its prompt

  bool first_of_its_prompt(size_t choice) const { return choice == 0 || prompt_of[choice] != prompt_of[choice - 1]; }
};

// What one choice of a non-streamed response has produced.
struct ChoiceOutput {
  std::string text;
  std::vector<StreamTokenLogprob> logprobs;
  std::vector<StreamTokenLogprob> prompt_logprobs;
};

// Every choice is validated before any is submitted: one bad prompt refuses the whole request.
PreparedChoices prepare_choices(const Frontend& frontend, const httplib::Request& req, bool chat) {
  const nlohmann::json body = parse_body(req.body);
  PreparedChoices request;
  request.parsed = chat ? parse_chat_request(body, req.body) : parse_completion_request(body, req.body);
  ParsedGenerate& parsed = request.parsed;
  RequestLog& log = request_log();
  log.model = parsed.input.model;
  parsed.input.request_id = log.request_id;
  request.prompts = parsed.prompts;
  if (request.prompts.empty()) request.prompts.push_back({parsed.input.prompt_text, parsed.input.prompt_tokens});
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    GenerateInput input = parsed.input;
    if (!chat) {
      input.prompt_text = request.prompts[p].text;
      input.prompt_tokens = request.prompts[p].tokens;
      if (request.prompts.size() > 1) input.request_id += "-p" + std::to_string(p);
    }
    for (PreparedGenerate& choice : frontend.prepare_choices(input, parsed.n)) {
      request.choices.push_back(std::move(choice));
      request.prompt_of.push_back(p);
    }
  }
  log.prompt_tokens = 0;
  for (size_t i = 0; i < request.choices.size(); ++i) {
    if (request.first_of_its_prompt(i)) log.prompt_tokens += static_cast<int64_t>(request.choices[i].request.prompt.size());
  }
  return request;
}

// Submits every choice; when one is refused (queue full), those already submitted are cancelled.
std::unique_ptr<GenerateResponse> submit_choices(Frontend& frontend, PreparedChoices& request) {
  auto response = std::make_unique<GenerateResponse>(request.parsed, request.choices[0]);
  std::vector<Choice>& choices = response->choices();
  try {
    for (size_t i = 0; i < request.choices.size(); ++i) {
      Choice c;
      c.index = static_cast<int32_t>(i);
      c.counts_prompt = request.first_of_its_prompt(i);
      c.prompt = request.choices[i].request.prompt;
      if (const std::optional<ToolCallFormat>& format = request.choices[i].tool_call_format) {
        c.tool_parser = std::make_shared<ToolCallParser>(*format);
      }
      if (request.parsed.echo) {
        const std::optional<std::string>& text = request.prompts[request.prompt_of[i]].text;
        c.echo = text ? *text : frontend.detokenize(*request.choices[i].model, c.prompt, false);
      }
      c.stream = frontend.submit_generate(request.choices[i]);
      choices.push_back(std::move(c));
    }
  } catch (...) {
    response->cancel_all();
    throw;
  }
  return response;
}

// One choice's events up to its final one; nullopt when the client closed the connection first.
// Throws the final event's error, after cancelling every choice.
std::optional<ChoiceOutput> collect_choice(const ClientSocket& client, GenerateResponse& response, Choice& choice,
                                           Clock::time_point deadline) {
  ChoiceOutput out;
  for (;;) {
    std::optional<StreamEvent> event = choice.stream->next(std::chrono::milliseconds(20));
    if (client.closed()) return std::nullopt;
    if (!event) {
      // The engine ends every request by its deadline; this only guards against a lost final event.
      if (deadline != Clock::time_point::max() && Clock::now() > deadline + std::chrono::seconds(10)) {
        response.cancel_all();
        throw deadline_error();
      }
      continue;
    }
    out.text += event->text;
    out.logprobs.insert(out.logprobs.end(), event->logprobs.begin(), event->logprobs.end());
    out.prompt_logprobs.insert(out.prompt_logprobs.end(), event->prompt_logprobs.begin(), event->prompt_logprobs.end());
    if (!event->final) continue;
    request_log().finish = finish_reason_name(event->finish_reason);
    if (!finished_normally(*event)) {
      response.cancel_all();
      throw final_event_error(*event);
    }
    choice.final_event = std::move(*event);
    return out;
  }
}

// Nothing is written until the whole response is ready, so the connection is watched for a client
// that gives up first: its sequences are cancelled at the next token or within 20 ms.
void respond_whole(const httplib::Request& req, httplib::Response& res, GenerateResponse& response,
                   Clock::time_point deadline) {
  const ClientSocket client = ClientSocket::find(req.remote_addr, req.remote_port, req.local_port);
  nlohmann::json out_choices = nlohmann::json::array();
  for (Choice& choice : response.choices()) {
    const std::optional<ChoiceOutput> out = collect_choice(client, response, choice, deadline);
    if (!out) {
      response.cancel_all();
      request_log().finish = "client_disconnected";
      res.status = 499;  // for the request log; nobody is left to read it
      return;
    }
    out_choices.push_back(response.complete_choice(choice, out->text, out->prompt_logprobs, out->logprobs));
  }
  request_log().completion_tokens = response.completion_tokens();
  res.set_content(dump(response.complete(std::move(out_choices))), kJsonContentType);
}

}  // namespace

void serve_generate(Frontend& frontend, const std::shared_ptr<std::atomic<int>>& active, const httplib::Request& req,
                    httplib::Response& res, bool chat) {
  PreparedChoices request = prepare_choices(frontend, req, chat);
  const Clock::time_point deadline = request.choices[0].request.deadline;
  std::unique_ptr<GenerateResponse> response = submit_choices(frontend, request);
  if (request.parsed.stream) {
    stream_generate(res, std::move(response), std::make_unique<ActiveRequest>(active));
  } else {
    respond_whole(req, res, *response, deadline);
  }
}

}  // namespace tessera::http
