// server/http/openai_request.cpp: strict, field-naming parsing of OpenAI request bodies.
#include "server/http/openai_request.h"

#include <cmath>
#include <limits>
#include <set>

namespace tessera::http {
namespace {

using nlohmann::json;

[[noreturn]] void invalid(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::kInvalidRequest, message, param);
}

std::string type_of(const json& j) {
  if (j.is_number_integer() || j.is_number_unsigned()) return "integer";
  if (j.is_number_float()) return "number";
  return j.type_name();
}

// Reads one JSON object's fields by name with type checks; finish() rejects fields never asked for.
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  // The value, or null when absent / JSON null (OpenAI treats null as "not given").
  const json* find(const std::string& key) {
    known_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<double> number(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    if (!j->is_number()) invalid(key, key + ": expected a number, got " + type_of(*j));
    return j->get<double>();
  }

  std::optional<int64_t> integer(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    return as_integer(*j, key);
  }

  static int64_t as_integer(const json& j, const std::string& key) {
    if (j.is_number_unsigned()) {
      if (j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        invalid(key, key + ": " + j.dump() + " is too large");
      }
      return static_cast<int64_t>(j.get<uint64_t>());
    }
    if (j.is_number_integer()) return j.get<int64_t>();
    if (j.is_number_float()) {
      const double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
    }
    invalid(key, key + ": expected an integer, got " + type_of(j) + (j.is_number() ? " " + j.dump() : ""));
  }

  std::optional<bool> boolean(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    if (!j->is_boolean()) invalid(key, key + ": expected a boolean, got " + type_of(*j));
    return j->get<bool>();
  }

  std::optional<std::string> string(const std::string& key) {
    const json* j = find(key);
    if (!j) return std::nullopt;
    if (!j->is_string()) invalid(key, key + ": expected a string, got " + type_of(*j));
    return j->get<std::string>();
  }

  // Accepted and ignored: they do not change what Tessera returns.
  void accept(std::initializer_list<const char*> keys) {
    for (const char* k : keys) known_.insert(k);
  }

  // Fields Tessera cannot honour: an error when given with anything but their default.
  template <typename IsDefault>
  void reject_unless(const std::string& key, IsDefault&& is_default, const std::string& why) {
    const json* j = find(key);
    if (j && !is_default(*j)) invalid(key, key + ": " + why);
  }

  void finish() const {
    std::string unknown;
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!known_.count(it.key())) unknown += (unknown.empty() ? "" : ", ") + it.key();
    }
    if (!unknown.empty()) {
      const std::string first = unknown.substr(0, unknown.find(','));
      invalid(first, "Unrecognized request argument supplied: " + unknown);
    }
  }

 private:
  const json& object_;
  std::set<std::string> known_;
};

float to_float(double value) { return static_cast<float>(value); }

// Choices one request may ask for: prompts times n.
constexpr int64_t kMaxChoices = 128;

std::string required_model(Fields& f) {
  std::optional<std::string> model = f.string("model");
  if (!model || model->empty()) invalid("model", "model: required");
  return *model;
}

std::vector<int32_t> token_list(const json& j, const std::string& key) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string name = key + "[" + std::to_string(i) + "]";
    if (!j[i].is_number_integer() && !j[i].is_number_unsigned()) {
      invalid(key, name + ": expected a token id (integer), got " + type_of(j[i]));
    }
    const int64_t id = Fields::as_integer(j[i], name);
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) invalid(key, name + ": token id " + j[i].dump() + " is out of range");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

bool is_token_list(const json& j) {
  return j.is_array() && !j.empty() && (j[0].is_number_integer() || j[0].is_number_unsigned());
}

void read_stop(Fields& f, SamplingParams& s) {
  const json* stop = f.find("stop");
  if (!stop) return;
  if (stop->is_string()) {
    if (!stop->get<std::string>().empty()) s.stop.push_back(stop->get<std::string>());
    return;
  }
  if (!stop->is_array()) invalid("stop", "stop: expected a string or a list of strings, got " + type_of(*stop));
  for (size_t i = 0; i < stop->size(); ++i) {
    if (!(*stop)[i].is_string()) {
      invalid("stop", "stop[" + std::to_string(i) + "]: expected a string, got " + type_of((*stop)[i]));
    }
    s.stop.push_back((*stop)[i].get<std::string>());
  }
}

// Fields shared by completions and chat: sampling, streaming, vLLM's extras, the tessera object.
void read_common(Fields& f, ParsedGenerate& out) {
  SamplingParams& s = out.input.sampling;
  out.input.model = required_model(f);
  if (auto v = f.number("temperature")) s.temperature = to_float(*v);
  if (auto v = f.number("top_p")) s.top_p = to_float(*v);
  if (auto v = f.integer("top_k")) {
    if (*v < -1 || *v > std::numeric_limits<int32_t>::max()) invalid("top_k", "top_k must be >= -1, got " + std::to_string(*v));
    s.top_k = static_cast<int32_t>(*v);
  }
  if (auto v = f.number("min_p")) s.min_p = to_float(*v);
  if (auto v = f.number("repetition_penalty")) s.repetition_penalty = to_float(*v);
  if (auto v = f.number("presence_penalty")) s.presence_penalty = to_float(*v);
  if (auto v = f.number("frequency_penalty")) s.frequency_penalty = to_float(*v);
  if (auto v = f.integer("seed")) s.seed = static_cast<uint64_t>(*v);
  if (auto v = f.integer("max_tokens")) out.input.max_tokens = *v;
  if (auto v = f.integer("min_tokens")) {
    if (*v < 0 || *v > std::numeric_limits<int32_t>::max()) invalid("min_tokens", "min_tokens must be >= 0, got " + std::to_string(*v));
    s.min_tokens = static_cast<int32_t>(*v);
  }
  read_stop(f, s);
  if (const json* ids = f.find("stop_token_ids")) {
    if (!ids->is_array()) invalid("stop_token_ids", "stop_token_ids: expected a list of token ids, got " + type_of(*ids));
    s.stop_token_ids = token_list(*ids, "stop_token_ids");
  }
  if (auto v = f.boolean("ignore_eos")) s.ignore_eos = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) s.include_stop_str_in_output = *v;
  if (auto v = f.boolean("skip_special_tokens")) out.skip_special_tokens = *v;
  if (auto v = f.boolean("stream")) out.stream = *v;
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) invalid("stream_options", "stream_options: expected an object, got " + type_of(*so));
    Fields sf(*so);
    if (auto v = sf.boolean("include_usage")) out.include_usage = *v;
    sf.accept({"continuous_usage_stats"});
    try {
      sf.finish();
    } catch (const ApiError& e) {
      invalid("stream_options", std::string("stream_options: ") + e.what());
    }
  }
  if (auto n = f.integer("n")) {
    if (*n < 1 || *n > kMaxChoices) {
      invalid("n", "n must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(*n));
    }
    out.n = static_cast<int32_t>(*n);
  }
  f.reject_unless("logit_bias", [](const json& j) { return j.is_object() && j.empty(); }, "logit_bias is not supported");
  if (const json* t = f.find("tessera")) out.input.attention = parse_tessera_extension(*t);
  // Fields that do not change results.
  f.accept({"user", "metadata", "service_tier", "store", "prompt_cache_key", "safety_identifier"});
}

std::vector<ChatMessage> read_messages(const json* messages) {
  if (!messages) invalid("messages", "messages: required");
  if (!messages->is_array()) invalid("messages", "messages: expected a list of messages, got " + type_of(*messages));
  if (messages->empty()) invalid("messages", "messages: must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string name = "messages[" + std::to_string(i) + "]";
    const json& m = (*messages)[i];
    if (!m.is_object()) invalid(name, name + ": expected an object, got " + type_of(m));
    Fields f(m);
    ChatMessage msg;
    std::optional<std::string> role = f.string("role");
    if (!role) invalid(name + ".role", name + ".role: required");
    if (*role == "developer") role = "system";  // OpenAI's newer name for system
    if (*role != "system" && *role != "user" && *role != "assistant") {
      invalid(name + ".role", name + ".role: '" + *role + "' is not supported (system, developer, user, assistant)");
    }
    msg.role = *role;
    if (const json* content = f.find("content")) {
      if (content->is_string()) {
        msg.content = content->get<std::string>();
      } else if (content->is_array()) {
        for (size_t k = 0; k < content->size(); ++k) {
          const std::string part_name = name + ".content[" + std::to_string(k) + "]";
          const json& part = (*content)[k];
          if (!part.is_object()) invalid(part_name, part_name + ": expected an object, got " + type_of(part));
          Fields pf(part);
          std::optional<std::string> type = pf.string("type");
          if (type != "text") {
            invalid(part_name + ".type", part_name + ".type: only \"text\" parts are supported, got " +
                                             (type ? "\"" + *type + "\"" : std::string("none")));
          }
          std::optional<std::string> text = pf.string("text");
          if (!text) invalid(part_name + ".text", part_name + ".text: required");
          msg.content += *text;
          pf.finish();
        }
      } else {
        invalid(name + ".content", name + ".content: expected a string or a list of text parts, got " + type_of(*content));
      }
    } else if (msg.role != "assistant") {
      invalid(name + ".content", name + ".content: required");
    }
    f.accept({"name"});
    f.reject_unless("tool_calls", [](const json& j) { return j.is_array() && j.empty(); }, "tool calls are not supported");
    f.reject_unless("tool_call_id", [](const json&) { return false; }, "tool messages are not supported");
    f.accept({"refusal"});
    try {
      f.finish();
    } catch (const ApiError& e) {
      invalid(name, name + ": " + e.what());
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

nlohmann::json parse_body(std::string_view body) {
  const size_t bad = find_invalid_utf8(body);
  if (bad != std::string_view::npos) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   "The request body is not valid UTF-8 (invalid byte at offset " + std::to_string(bad) + ").");
  }
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   "The request body is not valid JSON (at byte " + std::to_string(e.byte) + ").");
  } catch (const json::out_of_range&) {  // a number such as 1e309 that no double holds
    throw ApiError(ErrorKind::kInvalidRequest, "The request body holds a number out of range.");
  }
  if (!j.is_object()) {
    throw ApiError(ErrorKind::kInvalidRequest, "The request body must be a JSON object, got " + type_of(j) + ".");
  }
  return j;
}

ParsedGenerate parse_completion_request(const json& body) {
  ParsedGenerate out;
  Fields f(body);
  read_common(f, out);
  const json* prompt = f.find("prompt");
  if (!prompt) invalid("prompt", "prompt: required");
  if (prompt->is_string()) {
    out.prompts.push_back({prompt->get<std::string>(), std::nullopt});
  } else if (is_token_list(*prompt)) {
    out.prompts.push_back({std::nullopt, token_list(*prompt, "prompt")});
  } else if (prompt->is_array() && !prompt->empty()) {
    // A batch: strings, or token lists, not mixed (as OpenAI takes them).
    const bool strings = (*prompt)[0].is_string();
    for (size_t i = 0; i < prompt->size(); ++i) {
      const json& item = (*prompt)[i];
      const std::string name = "prompt[" + std::to_string(i) + "]";
      if (strings && item.is_string()) {
        out.prompts.push_back({item.get<std::string>(), std::nullopt});
      } else if (!strings && is_token_list(item)) {
        out.prompts.push_back({std::nullopt, token_list(item, name)});
      } else {
        invalid("prompt", name + ": expected " + std::string(strings ? "a string" : "a non-empty list of token ids") +
                              " like prompt[0], got " + (item.is_array() && item.empty() ? "an empty list" : type_of(item)));
      }
    }
  } else {
    invalid("prompt", "prompt: expected a string, a list of token ids, or a non-empty list of either");
  }
  if (static_cast<int64_t>(out.prompts.size()) * out.n > kMaxChoices) {
    invalid("n", "prompts times n must be at most " + std::to_string(kMaxChoices) + ", got " +
                     std::to_string(out.prompts.size()) + " x " + std::to_string(out.n));
  }
  out.input.prompt_text = out.prompts[0].text;
  out.input.prompt_tokens = out.prompts[0].tokens;
  if (auto v = f.integer("logprobs")) {
    if (*v < 0 || *v > SamplingParams::kMaxLogprobs) {
      invalid("logprobs", "logprobs must be in [0, " + std::to_string(SamplingParams::kMaxLogprobs) + "], got " +
                              std::to_string(*v));
    }
    out.logprobs = static_cast<int32_t>(*v);
    out.input.sampling.logprobs = out.logprobs;
  }
  if (auto v = f.boolean("echo")) out.echo = *v;
  // Echo with logprobs returns the prompt tokens' logprobs too; max_tokens 0 with echo only scores
  // the prompt (lm-evaluation-harness's log-likelihood request).
  if (out.echo && (out.logprobs || out.input.max_tokens == 0)) out.input.sampling.prompt_logprobs = out.logprobs.value_or(0);
  if (out.input.max_tokens == 0 && !out.echo) {
    invalid("max_tokens", "max_tokens: must be at least 1, got 0 (0 is accepted with echo, to score the prompt)");
  }
  if (auto b = f.integer("best_of"); b && *b != 1 && *b != out.n) {
    invalid("best_of", "best_of: only best_of=1 or best_of=n is supported (no server-side ranking), got " + std::to_string(*b));
  }
  f.reject_unless("suffix", [](const json& j) { return j.is_string() && j.get<std::string>().empty(); },
                  "suffix is not supported");
  f.finish();
  return out;
}

ParsedGenerate parse_chat_request(const json& body) {
  ParsedGenerate out;
  out.chat = true;
  Fields f(body);
  read_common(f, out);
  out.input.messages = read_messages(f.find("messages"));
  if (auto v = f.integer("max_completion_tokens")) out.input.max_tokens = *v;
  if (auto v = f.boolean("add_generation_prompt")) out.input.add_generation_prompt = *v;
  if (auto v = f.boolean("logprobs")) out.chat_logprobs = *v;
  if (auto v = f.integer("top_logprobs")) {
    if (*v < 0 || *v > SamplingParams::kMaxLogprobs) {
      invalid("top_logprobs", "top_logprobs must be in [0, " + std::to_string(SamplingParams::kMaxLogprobs) +
                                  "], got " + std::to_string(*v));
    }
    if (!out.chat_logprobs) invalid("top_logprobs", "top_logprobs: needs logprobs=true");
    out.logprobs = static_cast<int32_t>(*v);
  }
  if (out.chat_logprobs) out.input.sampling.logprobs = out.logprobs.value_or(0);
  const auto empty_list = [](const json& j) { return j.is_array() && j.empty(); };
  f.reject_unless("tools", empty_list, "tools (function calling) are not supported");
  f.reject_unless("functions", empty_list, "functions (function calling) are not supported");
  f.reject_unless("tool_choice", [](const json& j) { return j == "none" || j == "auto"; },
                  "tool_choice is not supported");
  f.reject_unless("function_call", [](const json& j) { return j == "none" || j == "auto"; },
                  "function_call is not supported");
  f.reject_unless("response_format", [](const json& j) { return j.is_object() && j.value("type", "") == "text"; },
                  "only {\"type\": \"text\"} is supported (json_object and json_schema are not)");
  f.reject_unless("modalities", [](const json& j) { return j == json::array({"text"}); },
                  "only [\"text\"] is supported");
  f.reject_unless("audio", [](const json&) { return false; }, "audio output is not supported");
  f.reject_unless("prediction", [](const json&) { return false; }, "predicted outputs are not supported");
  f.reject_unless("reasoning_effort", [](const json&) { return false; }, "reasoning_effort is not supported");
  f.reject_unless("web_search_options", [](const json&) { return false; }, "web search is not supported");
  f.accept({"parallel_tool_calls"});
  f.finish();
  return out;
}

ParsedEmbeddings parse_embeddings_request(const json& body) {
  ParsedEmbeddings out;
  Fields f(body);
  out.input.model = required_model(f);
  const json* input = f.find("input");
  if (!input) invalid("input", "input: required");
  if (input->is_string()) {
    out.input.texts.push_back(input->get<std::string>());
  } else if (is_token_list(*input)) {
    out.input.token_inputs.push_back(token_list(*input, "input"));
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const json& item = (*input)[i];
      const std::string name = "input[" + std::to_string(i) + "]";
      if (item.is_string() && out.input.token_inputs.empty()) {
        out.input.texts.push_back(item.get<std::string>());
      } else if (item.is_array() && out.input.texts.empty()) {
        if (item.empty()) invalid("input", name + ": must not be empty");
        out.input.token_inputs.push_back(token_list(item, name));
      } else {
        invalid("input", name + ": expected " +
                             std::string(out.input.token_inputs.empty() ? "a string" : "a list of token ids") +
                             " like the other items, got " + type_of(item));
      }
    }
  } else {
    invalid("input", "input: expected a string, a list of strings, a list of token ids or a list of those");
  }
  if (auto format = f.string("encoding_format")) {
    if (*format == "base64") out.base64 = true;
    else if (*format != "float") invalid("encoding_format", "encoding_format: expected float or base64, got '" + *format + "'");
  }
  // Not an OpenAI field: false refuses inputs over the model's limit instead of truncating them.
  if (auto v = f.boolean("truncate")) out.input.truncate = *v;
  f.reject_unless("dimensions", [](const json&) { return false; }, "dimensions is not supported (the model's size is returned)");
  f.accept({"user"});
  f.finish();
  return out;
}

ParsedTokenize parse_tokenize_request(const json& body) {
  ParsedTokenize out;
  Fields f(body);
  out.model = f.string("model").value_or("");
  out.prompt = f.string("prompt");
  if (const json* m = f.find("messages")) out.messages = read_messages(m);
  if (out.prompt.has_value() == out.messages.has_value()) {
    invalid("prompt", "give exactly one of prompt and messages");
  }
  if (auto v = f.boolean("add_special_tokens")) out.add_special_tokens = *v;
  if (auto v = f.boolean("add_generation_prompt")) out.add_generation_prompt = *v;
  f.finish();
  return out;
}

ParsedDetokenize parse_detokenize_request(const json& body) {
  ParsedDetokenize out;
  Fields f(body);
  out.model = f.string("model").value_or("");
  const json* tokens = f.find("tokens");
  if (!tokens) invalid("tokens", "tokens: required");
  if (!tokens->is_array()) invalid("tokens", "tokens: expected a list of token ids, got " + type_of(*tokens));
  out.tokens = token_list(*tokens, "tokens");
  f.finish();
  return out;
}

}  // namespace tessera::http
