// server/http/openai_response.cpp: OpenAI's response, chunk, usage, logprobs, embeddings, models and
// error shapes.
#include "server/http/openai_response.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <utility>

#include "models/tokenizer/tokenizer.h"

namespace tessera::http {
namespace {

using nlohmann::json;

std::string base64(const void* data, size_t size) {
  static const char* kTable = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < size; i += 3) {
    const uint32_t v = (uint32_t(p[i]) << 16) | (uint32_t(p[i + 1]) << 8) | p[i + 2];
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += kTable[(v >> 6) & 63];
    out += kTable[v & 63];
  }
  if (i < size) {
    uint32_t v = uint32_t(p[i]) << 16;
    if (i + 1 < size) v |= uint32_t(p[i + 1]) << 8;
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += i + 1 < size ? kTable[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void append(ParsedOutput& to, ParsedOutput more) {
  to.content += more.content;
  for (ToolCallDelta& d : more.tool_calls) to.tool_calls.push_back(std::move(d));
}

}  // namespace

std::string dump(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(ErrorKind kind, const std::string& message, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", openai_error_type(kind)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json client_error_body(const ApiError& error, const std::string& request_id) {
  const ApiError sent = client_facing(error, request_id);
  return error_body(sent.kind(), sent.what(), sent.param(), sent.code());
}

const char* openai_finish_reason(RequestFinishReason reason) {
  return reason == RequestFinishReason::kLength ? "length" : "stop";
}

bool finished_normally(const StreamEvent& event) {
  return event.finish_reason == RequestFinishReason::kStop || event.finish_reason == RequestFinishReason::kLength;
}

ApiError deadline_error() { return ApiError(ErrorKind::kDeadline, "The request did not finish before its deadline."); }

ApiError final_event_error(const StreamEvent& event) {
  switch (event.finish_reason) {
    case RequestFinishReason::kDeadline: return deadline_error();
    case RequestFinishReason::kCancelled: return ApiError(ErrorKind::kCancelled, "The request was cancelled.");
    default:
      return ApiError(ErrorKind::kInternal, event.error.empty() ? std::string("generation failed") : event.error);
  }
}

GenerateResponse::GenerateResponse(const ParsedGenerate& parsed, const PreparedGenerate& first_choice)
    : chat_(parsed.chat),
      echo_(parsed.echo),
      include_usage_(parsed.include_usage),
      logprobs_(parsed.chat ? (parsed.chat_logprobs ? parsed.logprobs.value_or(0) : -1) : parsed.logprobs.value_or(-1)),
      tokenizer_(first_choice.model->tokenizer.get()),
      id_((parsed.chat ? "chatcmpl-" : "cmpl-") + first_choice.request.request_id),
      model_(first_choice.model->name),
      created_(unix_now()) {}

void GenerateResponse::cancel_all() {
  for (Choice& c : choices_) c.stream->cancel();
}

int64_t GenerateResponse::completion_tokens() const {
  int64_t total = 0;
  for (const Choice& c : choices_) total += c.final_event.completion_tokens;
  return total;
}

json GenerateResponse::head(bool chunk) const {
  return {{"id", id_},
          {"object", chat_ ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", created_},
          {"model", model_}};
}

// Over every choice: each prompt counted once, every choice's completion. cached_tokens: prompt
// tokens whose K/V was reused (prefix cache, document copies), as OpenAI reports its own cache.
json GenerateResponse::usage() const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const Choice& c : choices_) {
    if (c.counts_prompt) {
      prompt += c.final_event.prompt_tokens;
      cached += c.final_event.cached_prompt_tokens;
    }
    completion += c.final_event.completion_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json GenerateResponse::logprobs(Choice& choice, const std::vector<StreamTokenLogprob>* prompt,
                                const std::vector<StreamTokenLogprob>& items) const {
  if (logprobs_ < 0) return nullptr;
  return chat_ ? chat_logprobs(items) : completion_logprobs(choice, prompt, items);
}

json GenerateResponse::chat_logprobs(const std::vector<StreamTokenLogprob>& items) const {
  json content = json::array();
  for (const auto& item : items) {
    json top = json::array();
    for (const auto& [id, lp] : item.top) top.push_back(token_entry(id, lp));
    json entry = token_entry(item.token, item.logprob);
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

json GenerateResponse::completion_logprobs(Choice& choice, const std::vector<StreamTokenLogprob>* prompt,
                                           const std::vector<StreamTokenLogprob>& items) const {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  // text_offset counts the text before each token: token strings add up as the text does.
  auto add = [&](int32_t token, json logprob, json top) {
    const std::string piece = token_string(token);
    tokens.push_back(piece);
    token_logprobs.push_back(std::move(logprob));
    top_logprobs.push_back(std::move(top));
    offsets.push_back(choice.text_offset);
    choice.text_offset += static_cast<int64_t>(piece.size());
  };
  auto top_of = [&](const StreamTokenLogprob& item) {
    json top = json::object();
    for (const auto& [id, lp] : item.top) top[token_string(id)] = lp;
    return top;
  };
  if (prompt != nullptr) {
    for (size_t i = 0; i < choice.prompt.size(); ++i) {
      if (i == 0 || i > prompt->size()) {
        add(choice.prompt[i], nullptr, nullptr);  // the first token has nothing before it
      } else {
        add(choice.prompt[i], (*prompt)[i - 1].logprob, top_of((*prompt)[i - 1]));
      }
    }
  }
  for (const auto& item : items) add(item.token, item.logprob, top_of(item));
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
          {"text_offset", offsets}};
}

const char* GenerateResponse::finish_reason(const Choice& choice) {
  const bool called = choice.tool_parser && choice.tool_parser->calls_started() > 0;
  if (called && choice.final_event.finish_reason == RequestFinishReason::kStop) return "tool_calls";
  return openai_finish_reason(choice.final_event.finish_reason);
}

json GenerateResponse::chat_message(Choice& choice, const std::string& text) {
  if (!choice.tool_parser) return {{"role", "assistant"}, {"content", text}};
  ParsedOutput parsed = choice.tool_parser->push(text);
  append(parsed, choice.tool_parser->finish());
  // Calls by index: the first delta names the call, every delta adds to its arguments.
  std::map<int32_t, std::pair<std::string, std::string>> calls;
  for (const ToolCallDelta& d : parsed.tool_calls) {
    auto& [name, arguments] = calls[d.index];
    if (!d.name.empty()) name = d.name;
    arguments += d.arguments;
  }
  json message = {{"role", "assistant"}};
  message["content"] = parsed.content.empty() && !calls.empty() ? json(nullptr) : json(parsed.content);
  if (calls.empty()) return message;
  json tool_calls = json::array();
  for (const auto& [index, call] : calls) {
    tool_calls.push_back({{"id", new_tool_call_id()},
                          {"type", "function"},
                          {"function", {{"name", call.first}, {"arguments", call.second}}}});
  }
  message["tool_calls"] = std::move(tool_calls);
  return message;
}

json GenerateResponse::complete_choice(Choice& choice, const std::string& text,
                                       const std::vector<StreamTokenLogprob>& prompt_logprobs,
                                       const std::vector<StreamTokenLogprob>& items) {
  json out = {{"index", choice.index}};
  if (chat_) {
    out["message"] = chat_message(choice, text);
  } else {
    out["text"] = choice.echo + text;
  }
  out["logprobs"] = logprobs(choice, echo_ ? &prompt_logprobs : nullptr, items);
  out["finish_reason"] = finish_reason(choice);
  return out;
}

json GenerateResponse::complete(json choices) const {
  json out = head(false);
  out["choices"] = std::move(choices);
  out["usage"] = usage();
  return out;
}

json GenerateResponse::chunk(Choice& choice, const std::string& text, const std::vector<StreamTokenLogprob>* prompt,
                             const std::vector<StreamTokenLogprob>& items, const char* finish_reason, bool first) {
  json out = head(true);
  json c = {{"index", choice.index}};
  if (chat_) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = (prompt != nullptr ? choice.echo : std::string()) + text;
  }
  c["logprobs"] = logprobs(choice, prompt, items);
  c["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  out["choices"] = json::array({std::move(c)});
  if (include_usage_) out["usage"] = nullptr;  // OpenAI: null on every chunk but the last
  return out;
}

json GenerateResponse::chunk_head(const Choice& choice, json delta) {
  json out = head(true);
  json c = {{"index", choice.index}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  out["choices"] = json::array({std::move(c)});
  if (include_usage_) out["usage"] = nullptr;
  return out;
}

std::vector<json> GenerateResponse::tool_call_chunks(Choice& choice, const std::vector<ToolCallDelta>& deltas) {
  std::vector<json> out;
  for (const ToolCallDelta& d : deltas) {
    if (!d.name.empty()) {
      choice.tool_call_ids.resize(std::max(choice.tool_call_ids.size(), static_cast<size_t>(d.index) + 1));
      choice.tool_call_ids[d.index] = new_tool_call_id();
      json opening = {{"index", d.index},
                      {"id", choice.tool_call_ids[d.index]},
                      {"type", "function"},
                      {"function", {{"name", d.name}, {"arguments", ""}}}};
      out.push_back(chunk_head(choice, {{"tool_calls", json::array({std::move(opening)})}}));
    }
    if (d.arguments.empty()) continue;
    json fragment = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
    out.push_back(chunk_head(choice, {{"tool_calls", json::array({std::move(fragment)})}}));
  }
  return out;
}

json GenerateResponse::usage_chunk() const {
  json out = head(true);
  out["choices"] = json::array();
  out["usage"] = usage();
  return out;
}

std::string GenerateResponse::token_string(int32_t id) const { return tokenizer_->decode({id}, /*skip_special=*/false); }

json GenerateResponse::token_entry(int32_t id, float logprob) const {
  const std::string piece = token_string(id);
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return {{"token", piece}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

json embeddings_body(const EmbedResult& result, const std::string& model, bool base64_floats) {
  json data = json::array();
  for (size_t i = 0; i < result.embeddings.size(); ++i) {
    const std::vector<float>& e = result.embeddings[i];
    json item = {{"object", "embedding"}, {"index", i}};
    // base64: the float32 values' bytes, little-endian (x86 and ARM are), as OpenAI sends them.
    item["embedding"] = base64_floats ? json(base64(e.data(), e.size() * sizeof(float))) : json(e);
    data.push_back(std::move(item));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", result.prompt_tokens}, {"total_tokens", result.prompt_tokens}}}};
}

json models_body(const std::vector<const FrontendModel*>& models) {
  json data = json::array();
  for (const FrontendModel* model : models) {
    data.push_back({{"id", model->name},
                    {"object", "model"},
                    {"created", model->created},
                    {"owned_by", "tessera"},
                    {"root", model->name},
                    {"max_model_len", model->max_model_len},
                    {"tessera", {{"kind", model_kind_name(model->kind)}}}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

json tokenize_body(const std::vector<int32_t>& ids, int64_t max_model_len) {
  return {{"count", ids.size()}, {"max_model_len", max_model_len}, {"tokens", ids}};
}

json detokenize_body(const std::string& prompt) { return {{"prompt", prompt}}; }


json tokenizer_info_body(const FrontendModel& model) {
  const Tokenizer& tokenizer = *model.tokenizer;
  const ModelConfig& config = model.config;
  auto token = [&](int64_t id) -> json {
    return id >= 0 && id < tokenizer.vocab_size() ? json(tokenizer.id_to_token(static_cast<int32_t>(id))) : json(nullptr);
  };
  const int64_t eos_id = config.eos_token_ids.empty() ? -1 : config.eos_token_ids.front();
  const int32_t unk_id = tokenizer.token_to_id("<unk>");
  json out = {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"model", model.name},
              {"bos_token", token(config.bos_token_id)},
              {"eos_token", token(eos_id)},
              {"pad_token", token(config.pad_token_id)},
              {"unk_token", token(unk_id)},
              {"bos_token_id", config.bos_token_id >= 0 ? json(config.bos_token_id) : json(nullptr)},
              {"eos_token_id", eos_id >= 0 ? json(eos_id) : json(nullptr)},
              {"model_max_length", model.max_model_len},
              {"vocab_size", tokenizer.vocab_size()},
              {"clean_up_tokenization_spaces", false}};
  if (!model.chat_template_source.empty()) out["chat_template"] = model.chat_template_source;
  return out;
}

}  // namespace tessera::http
