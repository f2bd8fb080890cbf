// server/http/openai_response.h: the JSON bodies the HTTP front end sends, in OpenAI's shapes:
// errors, completions and chat completions (whole, or as stream chunks, with usage and logprobs),
// embeddings and models; and the tokenize / detokenize bodies of vLLM's server.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/frontend/frontend.h"
#include "server/http/openai_request.h"

namespace tessera::http {

constexpr const char* kJsonContentType = "application/json";

// The body's text. Invalid UTF-8 (a token cut mid-character in logprobs) becomes U+FFFD rather
// than an exception.
std::string dump(const nlohmann::json& body);

// {"error": {"message", "type", "param", "code"}}; an empty param or code is null.
nlohmann::json error_body(ErrorKind kind, const std::string& message, const std::string& param,
                          const std::string& code);
// The body a client gets for an error. An internal error's detail goes to the log with the request
// id; the client gets only the id.
nlohmann::json client_error_body(const ApiError& error, const std::string& request_id);

// OpenAI's finish_reason: "length", else "stop".
const char* openai_finish_reason(RequestFinishReason reason);
// A final event ended in stop or length, the two finishes OpenAI reports as a success.
bool finished_normally(const StreamEvent& event);
// A request that ran past its deadline.
ApiError deadline_error();
// The error a final event that did not finish normally becomes.
ApiError final_event_error(const StreamEvent& event);

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
  // Chat with tools: splits the output into content and tool calls; each call's id by its index.
  std::shared_ptr<ToolCallParser> tool_parser;
  std::vector<std::string> tool_call_ids;
};


// One generate request's response, built from its choices' stream events (non-streamed and SSE).
class GenerateResponse {
 public:
  GenerateResponse(const ParsedGenerate& parsed, const PreparedGenerate& first_choice);

  std::vector<Choice>& choices() { return choices_; }
  bool chat() const { return chat_; }
  bool include_usage() const { return include_usage_; }
  // Every choice's sequence stops: the client went away, or one choice failed.
  void cancel_all();
  // The completion tokens of every choice, once all have finished.
  int64_t completion_tokens() const;

  // Non-streamed: one choice of the whole response.
  nlohmann::json complete_choice(Choice& choice, const std::string& text,
                                 const std::vector<StreamTokenLogprob>& prompt_logprobs,
                                 const std::vector<StreamTokenLogprob>& items);
  // Non-streamed: the whole response around its choices, with usage.
  nlohmann::json complete(nlohmann::json choices) const;

  // Streamed: the chunk for one choice's delta. `first`: chat's opening chunk with the role;
  // `prompt`: completions' echo, whose text goes first.
  nlohmann::json chunk(Choice& choice, const std::string& text, const std::vector<StreamTokenLogprob>* prompt,
                       const std::vector<StreamTokenLogprob>& items, const char* finish_reason, bool first);
  // Streamed: the last chunk, with usage and no choices (stream_options.include_usage).
  nlohmann::json usage_chunk() const;
  // Streamed, with tools: the chunks for some of a choice's tool-call deltas. A call opens with its
  // index, id, type and name (arguments ""); its argument fragments follow, each a chunk.
  std::vector<nlohmann::json> tool_call_chunks(Choice& choice, const std::vector<ToolCallDelta>& deltas);
  // "tool_calls" when the choice made calls and stopped; else openai_finish_reason.
  static const char* finish_reason(const Choice& choice);

 private:
  // The object fields every response and chunk starts with.
  nlohmann::json head(bool chunk) const;
  nlohmann::json usage() const;
  // The logprobs of some of a choice's tokens in the endpoint's shape; null when not requested.
  // `prompt` (completions with echo): the prompt's logprobs go first, the first token's null.
  nlohmann::json logprobs(Choice& choice, const std::vector<StreamTokenLogprob>* prompt,
                          const std::vector<StreamTokenLogprob>& items) const;
  nlohmann::json chat_logprobs(const std::vector<StreamTokenLogprob>& items) const;
  // Non-streamed chat: the message, its content split from tool calls when the choice has tools.
  nlohmann::json chat_message(Choice& choice, const std::string& text);
  nlohmann::json chunk_head(const Choice& choice, nlohmann::json delta);
  nlohmann::json completion_logprobs(Choice& choice, const std::vector<StreamTokenLogprob>* prompt,
                                     const std::vector<StreamTokenLogprob>& items) const;
  std::string token_string(int32_t id) const;
  nlohmann::json token_entry(int32_t id, float logprob) const;

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

// /v1/embeddings: one item per input, its floats as numbers or, with `base64_floats`, as base64 text.
nlohmann::json embeddings_body(const EmbedResult& result, const std::string& model, bool base64_floats);
// /v1/models: every served model.
nlohmann::json models_body(const std::vector<const FrontendModel*>& models);
// /tokenize and /detokenize.
nlohmann::json tokenize_body(const std::vector<int32_t>& ids, int64_t max_model_len);
nlohmann::json detokenize_body(const std::string& prompt);
// /tokenizer_info: the model's tokenizer configuration as vLLM returns it (HF tokenizer_config.json
// keys: tokenizer_class, bos/eos/pad/unk tokens, model_max_length, chat_template, ...).
nlohmann::json tokenizer_info_body(const FrontendModel& model);

}  // namespace tessera::http
