// server/http/openai_request.h: OpenAI-shaped JSON bodies (completions, chat completions,
// embeddings, tokenize, detokenize) -> the front end's protocol-neutral inputs. Type errors name the
// field and the expected type; fields Tessera cannot honour (best_of > n, logit_bias, tools,
// response_format json_schema, ...) are rejected by name; fields that do not change results (user,
// metadata, service_tier, ...) are accepted; anything else is "Unrecognized request argument".
// Everything that both protocols check (ranges, context length, policies) is left to Frontend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/frontend/frontend.h"

namespace tessera::http {

// One prompt of a completions request: text or token ids.
struct CompletionPrompt {
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> tokens;
};

struct ParsedGenerate {
  // Everything but the prompt is shared by every choice; for a single prompt (and chat) the prompt
  // is here too.
  GenerateInput input;
  // Completions: every prompt, in order (one for a string or a token list; several for a list of
  // them). Each gives n choices, indexed prompt * n + k as vLLM does. Empty for chat.
  std::vector<CompletionPrompt> prompts;
  int32_t n = 1;                      // choices per prompt
  bool chat = false;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool echo = false;                  // completions: prepend the prompt text (and, with logprobs, its logprobs)
  std::optional<int32_t> logprobs;    // completions: logprobs (int); chat: top_logprobs when logprobs=true
  bool chat_logprobs = false;         // chat: logprobs=true
};

struct ParsedEmbeddings {
  EmbedInput input;
  bool base64 = false;  // encoding_format "base64": little-endian float32 bytes
};

struct ParsedTokenize {
  std::string model;                 // "" = the first served model
  std::optional<std::string> prompt;
  std::optional<std::vector<ChatMessage>> messages;
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
};

struct ParsedDetokenize {
  std::string model;
  std::vector<int32_t> tokens;
};

// Throw ApiError(kInvalidRequest) naming the field. Completions and chat take response_format
// (text, json_object, json_schema) and vLLM's structured_outputs (json, regex, choice, grammar,
// json_object); chat also takes tools, tool_choice and parallel_tool_calls, and tool messages.
// `raw_body` (the text `body` was parsed from) keeps schemas in the client's key order; without it
// their keys are sorted.
ParsedGenerate parse_completion_request(const nlohmann::json& body, std::string_view raw_body = {});
ParsedGenerate parse_chat_request(const nlohmann::json& body, std::string_view raw_body = {});
ParsedEmbeddings parse_embeddings_request(const nlohmann::json& body);
ParsedTokenize parse_tokenize_request(const nlohmann::json& body);
ParsedDetokenize parse_detokenize_request(const nlohmann::json& body);

// The body as a JSON object: kInvalidRequest for invalid UTF-8 (with the byte offset), malformed
// JSON (with the parser's position) or a top-level value that is not an object.
nlohmann::json parse_body(std::string_view body);
// Index of the first byte that is not part of valid UTF-8 (overlongs, surrogates and code points
// past U+10FFFF are invalid), or npos.
size_t find_invalid_utf8(std::string_view text);

}  // namespace tessera::http
