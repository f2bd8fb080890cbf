// server/frontend/frontend.cpp: validation, tokenization and engine submission shared by HTTP and gRPC.
#include "server/frontend/frontend.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/scheduler/engine_loop.h"
#include "models/config/encoder_input.h"
#include "models/config/model_mask_policy.h"
#include "models/tokenizer/tokenizer.h"
#include "server/frontend/mask_policy_json.h"
#include "server/metrics/server_metrics.h"

namespace tessera {
namespace {

// Compares without an early exit, so response time does not leak how much of a key matched.
bool equal_constant_time(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::string token_text(const Tokenizer& tokenizer, int64_t id) {
  return id >= 0 && id < tokenizer.vocab_size() ? tokenizer.id_to_token(static_cast<int32_t>(id)) : std::string();
}

void check_token_ids(const FrontendModel& model, const std::vector<int32_t>& ids, const std::string& field) {
  const int64_t vocab = model.tokenizer->vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw ApiError(ErrorKind::kInvalidRequest,
                     field + "[" + std::to_string(i) + "]: token id " + std::to_string(ids[i]) +
                         " is outside the vocabulary [0, " + std::to_string(vocab) + ")",
                     field);
    }
  }
}

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

std::string new_tool_call_id() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

const char* model_kind_name(ModelKind kind) { return kind == ModelKind::kLlm ? "llm" : "embedding"; }

std::string context_length_message(int64_t max_len, int64_t prompt_tokens, int64_t completion_tokens, bool chat) {
  std::ostringstream os;
  os << "This model's maximum context length is " << max_len << " tokens. However, you requested "
     << prompt_tokens + completion_tokens << " tokens (" << prompt_tokens
     << (chat ? " in the messages, " : " in your prompt; ") << completion_tokens
     << (chat ? " in the completion). Please reduce the length of the messages or completion."
              : " for the completion). Please reduce your prompt; or completion length.");
  return os.str();
}

void validate_sampling(const SamplingParams& params) {
  try {
    params.validate();
  } catch (const Error& e) {
    std::string message = user_message(e);
    // SamplingParams names the field first: "top_p must be in (0, 1], got 1.5".
    const std::string param = message.substr(0, message.find_first_of(" :["));
    throw ApiError(ErrorKind::kInvalidRequest, message, param);
  }
}

std::optional<MaskPolicy> parse_tessera_extension(const nlohmann::json& tessera_object) {
  if (tessera_object.is_null()) return std::nullopt;
  if (!tessera_object.is_object()) {
    throw ApiError(ErrorKind::kInvalidRequest, "tessera: expected an object, e.g. {\"attention\": {\"causal\": {}}}",
                   "tessera");
  }
  std::optional<MaskPolicy> policy;
  for (auto it = tessera_object.begin(); it != tessera_object.end(); ++it) {
    if (it.key() != "attention") {
      throw ApiError(ErrorKind::kInvalidRequest,
                     "tessera." + it.key() + ": unknown field (known: attention)", "tessera." + it.key());
    }
    try {
      policy = mask_policy_from_json(it.value());
    } catch (const Error& e) {
      std::string message = user_message(e);
      if (message.rfind("attention", 0) == 0) message = "tessera." + message;
      throw ApiError(ErrorKind::kInvalidRequest, message, "tessera.attention");
    } catch (const nlohmann::json::exception& e) {
      throw ApiError(ErrorKind::kInvalidRequest, std::string("tessera.attention: ") + e.what(), "tessera.attention");
    }
  }
  return policy;
}

Frontend::Frontend(const ServerConfig& config, EngineLoop* engine, ServerMetrics* metrics)
    : config_(config), engine_(engine), metrics_(metrics), api_keys_(config.auth.api_keys) {}

void Frontend::add_model(FrontendModel model) {
  if (model.kind == ModelKind::kEmbedding) {
    // limits.max_model_len sizes generation contexts; an embedding input is bounded by the model's
    // own rule, the same one `tessera embed` applies.
    model.max_model_len = encoder_input_limit(model.config).tokens;
  } else {
    int64_t max_len = model.config.max_position_embeddings;
    if (config_.limits.max_model_len > 0 && (max_len <= 0 || config_.limits.max_model_len < max_len)) {
      max_len = config_.limits.max_model_len;
    }
    if (engine_ && engine_->max_model_len(model.name) > 0) max_len = engine_->max_model_len(model.name);
    model.max_model_len = max_len;
  }
  if (model.created == 0) model.created = static_cast<int64_t>(std::time(nullptr));
  models_.push_back(std::make_unique<FrontendModel>(std::move(model)));
}

std::vector<const FrontendModel*> Frontend::models() const {
  std::vector<const FrontendModel*> out;
  for (const auto& m : models_) out.push_back(m.get());
  return out;
}

void Frontend::check_api_key(std::string_view authorization) const {
  if (api_keys_.empty()) return;
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  if (authorization.empty()) {
    throw ApiError(ErrorKind::kUnauthorized,
                   "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.", "",
                   "invalid_api_key");
  }
  constexpr std::string_view kBearer = "bearer ";
  std::string prefix(authorization.substr(0, std::min(authorization.size(), kBearer.size())));
  std::transform(prefix.begin(), prefix.end(), prefix.begin(), [](unsigned char c) { return std::tolower(c); });
  if (prefix != kBearer) {
    throw ApiError(ErrorKind::kUnauthorized, "The Authorization header must be 'Bearer YOUR_KEY'.", "",
                   "invalid_api_key");
  }
  std::string_view key = authorization.substr(kBearer.size());
  while (!key.empty() && (key.back() == ' ' || key.back() == '\r')) key.remove_suffix(1);
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  bool match = false;
  for (const std::string& k : api_keys_) match |= equal_constant_time(key, k);
  if (!match) throw ApiError(ErrorKind::kUnauthorized, "Incorrect API key provided.", "", "invalid_api_key");
}

const FrontendModel& Frontend::find_any_model(const std::string& name) const {
  for (const auto& m : models_) {
    if (m->name == name) return *m;
  }
  if (name.empty()) throw ApiError(ErrorKind::kInvalidRequest, "model: required", "model");
  throw ApiError(ErrorKind::kNotFound, "The model `" + name + "` does not exist.", "model", "model_not_found");
}

const FrontendModel& Frontend::find_model(const std::string& name, ModelKind kind) const {
  const FrontendModel& m = find_any_model(name);
  if (m.kind != kind) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   "model: `" + name + "` is an " + model_kind_name(m.kind) + " model; this endpoint needs an " +
                       model_kind_name(kind) + " model",
                   "model");
  }
  return m;
}

std::string Frontend::render_chat(const FrontendModel& model, const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt, const std::vector<ToolDefinition>& tools) const {
  if (!model.chat_template) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   "model `" + model.name +
                       "` has no chat template Tessera knows; use /v1/completions or set the model's chat_template in "
                       "the server config",
                   "messages");
  }
  if (messages.empty()) throw ApiError(ErrorKind::kInvalidRequest, "messages: must not be empty", "messages");
  const ModelConfig& c = model.config;
  const std::string bos = token_text(*model.tokenizer, c.bos_token_id);
  const std::string eos = c.eos_token_ids.empty() ? "" : token_text(*model.tokenizer, c.eos_token_ids[0]);
  try {
    return apply_chat_template(*model.chat_template, messages, tools, add_generation_prompt, bos, eos);
  } catch (const Error& e) {
    throw ApiError(ErrorKind::kInvalidRequest, "messages: " + user_message(e), "messages");
  }
}

std::vector<int32_t> Frontend::tokenize(const FrontendModel& model, std::string_view text, bool add_special) const {
  try {
    return model.tokenizer->encode(text, add_special).ids;
  } catch (const Error& e) {
    throw ApiError(ErrorKind::kInvalidRequest, "prompt: " + user_message(e), "prompt");
  }
}

std::string Frontend::detokenize(const FrontendModel& model, const std::vector<int32_t>& ids, bool skip_special) const {
  check_token_ids(model, ids, "tokens");
  return model.tokenizer->decode(ids, skip_special);
}

std::vector<int32_t> Frontend::prompt_tokens(const FrontendModel& model, const GenerateInput& input,
                                             SamplingParams& sampling) const {
  const bool chat = input.messages.has_value();
  std::vector<int32_t> prompt;
  if (chat) {
    const std::string text = render_generate_chat(model, input);
    prompt = tokenize(model, text, /*add_special=*/false);  // the template writes BOS itself
    // The template's end-of-turn token ends generation even when the model's EOS is another token.
    // It counts as an EOS id, so ignore_eos and min_tokens hold it off like the model's EOS.
    add_end_of_turn_ids(*model.tokenizer, sampling.eos_token_ids);
  } else if (input.prompt_text) {
    prompt = tokenize(model, *input.prompt_text, /*add_special=*/true);
  } else {
    prompt = *input.prompt_tokens;
    check_token_ids(model, prompt, "prompt");
  }
  check_token_ids(model, sampling.stop_token_ids, "stop_token_ids");
  const char* prompt_field = chat ? "messages" : "prompt";
  if (prompt.empty()) {
    throw ApiError(ErrorKind::kInvalidRequest, std::string(prompt_field) + ": the prompt is empty", prompt_field);
  }
  return prompt;
}

int64_t Frontend::resolve_max_tokens(const FrontendModel& model, const GenerateInput& input, int64_t prompt_len,
                                     bool scores_prompt) const {
  const bool chat = input.messages.has_value();
  const char* prompt_field = chat ? "messages" : "prompt";
  const int64_t max_len = model.max_model_len;
  int64_t max_tokens = 0;
  if (input.max_tokens) {
    max_tokens = *input.max_tokens;
    // 0: a request that only scores its prompt (prompt logprobs, as an echo with logprobs asks).
    if (max_tokens < 1 && !(max_tokens == 0 && scores_prompt)) {
      throw ApiError(ErrorKind::kInvalidRequest,
                     "max_tokens: must be at least 1, got " + std::to_string(max_tokens) +
                         (max_tokens == 0 && !chat ? " (0 is accepted with echo, to score the prompt)" : ""),
                     "max_tokens");
    }
    if (max_len > 0 && prompt_len + max_tokens > max_len) {
      throw ApiError(ErrorKind::kContextLengthExceeded, context_length_message(max_len, prompt_len, max_tokens, chat),
                     prompt_field);
    }
  } else if (chat) {
    if (max_len > 0 && prompt_len >= max_len) {
      throw ApiError(ErrorKind::kContextLengthExceeded,
                     "This model's maximum context length is " + std::to_string(max_len) +
                         " tokens. However, your messages resulted in " + std::to_string(prompt_len) +
                         " tokens. Please reduce the length of the messages.",
                     "messages");
    }
    max_tokens = max_len > 0 ? max_len - prompt_len : 16;
  } else {
    max_tokens = 16;
    if (max_len > 0 && prompt_len + max_tokens > max_len) {
      throw ApiError(ErrorKind::kContextLengthExceeded, context_length_message(max_len, prompt_len, max_tokens, chat),
                     prompt_field);
    }
  }
  if (max_tokens > std::numeric_limits<int32_t>::max()) {
    throw ApiError(ErrorKind::kInvalidRequest, "max_tokens: " + std::to_string(max_tokens) + " is too large",
                   "max_tokens");
  }
  return max_tokens;
}

PreparedGenerate Frontend::prepare_generate(GenerateInput input) const {
  if (draining()) throw ApiError(ErrorKind::kDraining, "The server is shutting down and accepts no new requests.");
  const FrontendModel& model = find_model(input.model, ModelKind::kLlm);
  const int forms = int(input.prompt_text.has_value()) + int(input.prompt_tokens.has_value()) +
                    int(input.messages.has_value());
  if (forms != 1) {
    throw ApiError(ErrorKind::kInvalidRequest, "give exactly one of prompt (text or token ids) and messages",
                   "prompt");
  }
  validate_tools(input.tools, input.tool_choice);
  const std::optional<ToolCallFormat> tool_format = request_tool_format(model, input);
  SamplingParams sampling = input.sampling;
  std::vector<int32_t> prompt = prompt_tokens(model, input, sampling);
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  const int64_t max_tokens = resolve_max_tokens(model, input, prompt_len, sampling.prompt_logprobs.has_value());
  sampling.max_tokens = static_cast<int32_t>(max_tokens);
  // Mistral's [TOOL_CALLS] is a control token: the parser must see it in the text.
  if (tool_format == ToolCallFormat::kMistral) sampling.skip_special_tokens = false;
  validate_sampling(sampling);

  PreparedGenerate out;
  try {
    out.policy_name = resolve_mask_policy(input.attention, model.config, prompt_len).name();
  } catch (const Error& e) {
    std::string message = user_message(e);
    if (message.rfind("attention", 0) == 0) message = "tessera." + message;
    throw ApiError(ErrorKind::kInvalidRequest, message, "tessera.attention");
  }
  out.request.grammar = compile_constraint(model, input, tool_format);
  out.tool_call_format = tool_format;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config_.limits.request_timeout_s));
  const Clock::time_point server_deadline = Clock::now() + timeout;
  out.request.request_id = input.request_id.empty() ? request_id_or_new("") : input.request_id;
  out.request.model = model.name;
  out.request.prompt = std::move(prompt);
  out.request.sampling = std::move(sampling);
  out.request.attention = std::move(input.attention);
  out.request.deadline = std::min(input.deadline, server_deadline);
  out.model = &model;
  return out;
}

void Frontend::validate_tools(const std::vector<ToolDefinition>& tools, const ToolChoice& choice) {
  if (tools.size() > kMaxTools) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   "tools: at most " + std::to_string(kMaxTools) + " tools, got " + std::to_string(tools.size()),
                   "tools");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string field = "tools[" + std::to_string(i) + "]";
    const std::string& name = tools[i].name;
    if (!valid_tool_name(name)) {
      throw ApiError(ErrorKind::kInvalidRequest,
                     field + ": the name '" + name + "' must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -", "tools");
    }
    if (!names.insert(name).second) {
      throw ApiError(ErrorKind::kInvalidRequest, field + ": the name '" + name + "' is used by another tool", "tools");
    }
    if (!tools[i].parameters.empty()) {
      const nlohmann::json parameters = nlohmann::json::parse(tools[i].parameters, nullptr, /*allow_exceptions=*/false);
      if (!parameters.is_object()) {
        throw ApiError(ErrorKind::kInvalidRequest, field + ": parameters must be a JSON schema object", "tools");
      }
    }
  }
  const bool needs_tools = choice.mode == ToolChoice::Mode::kRequired || choice.mode == ToolChoice::Mode::kFunction;
  if (needs_tools && tools.empty()) {
    throw ApiError(ErrorKind::kInvalidRequest, "tool_choice: needs tools to choose from", "tool_choice");
  }
  if (choice.mode == ToolChoice::Mode::kFunction && !names.count(choice.function)) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
    throw ApiError(ErrorKind::kInvalidRequest,
                   "tool_choice: no tool is named '" + choice.function + "' (tools: " + known + ")", "tool_choice");
  }
}

std::string Frontend::render_generate_chat(const FrontendModel& model, const GenerateInput& input) const {
  return render_chat(model, *input.messages, input.add_generation_prompt, input.tools);
}

std::optional<ToolCallFormat> Frontend::request_tool_format(const FrontendModel& model,
                                                            const GenerateInput& input) const {
  if (input.tools.empty()) return std::nullopt;
  if (!input.messages) {
    throw ApiError(ErrorKind::kInvalidRequest, "tools: only chat requests take tools", "tools");
  }
  const std::optional<ToolCallFormat> format =
      model.chat_template ? tool_call_format(model.chat_template->kind) : std::nullopt;
  if (!format) {
    const std::string template_name = model.chat_template ? chat_template_name(model.chat_template->kind) : "none";
    throw ApiError(ErrorKind::kInvalidRequest,
                   "tools: model `" + model.name + "` has no tool-call format (its chat template: " + template_name +
                       ")",
                   "tools");
  }
  if (input.tool_choice.mode == ToolChoice::Mode::kNone) return std::nullopt;
  return format;
}

std::shared_ptr<const CompiledGrammar> Frontend::compile_constraint(
    const FrontendModel& model, const GenerateInput& input, const std::optional<ToolCallFormat>& tool_format) const {
  std::optional<OutputConstraint> constraint = input.constraint;
  std::string param = input.constraint_param;
  if (tool_format) {
    std::optional<OutputConstraint> calls =
        tool_call_constraint(*tool_format, input.tools, input.tool_choice, input.parallel_tool_calls);
    if (calls && constraint) {
      throw ApiError(ErrorKind::kInvalidRequest,
                     param + ": cannot be combined with tools unless tool_choice is \"none\"", param);
    }
    if (calls) {
      constraint = std::move(calls);
      param = "tools";
    }
  }
  if (!constraint) return nullptr;
  if (!model.grammar_compiler) {
    throw ApiError(ErrorKind::kInvalidRequest, param + ": model `" + model.name + "` cannot constrain its output",
                   param);
  }
  const Clock::time_point start = Clock::now();
  try {
    std::shared_ptr<const CompiledGrammar> grammar = model.grammar_compiler->compile(*constraint);
    if (metrics_) metrics_->on_grammar_compile(model.name, seconds_since(start));
    return grammar;
  } catch (const GrammarError& e) {
    const std::string where = e.where().empty() ? "" : " (at " + e.where() + ")";
    throw ApiError(ErrorKind::kInvalidRequest,
                   param + ": the " + constraint_kind_name(constraint->kind) + " does not compile" + where + ": " +
                       e.what(),
                   param);
  } catch (const Error& e) {
    throw ApiError(ErrorKind::kInvalidRequest,
                   param + ": the " + constraint_kind_name(constraint->kind) + " does not compile: " + user_message(e),
                   param);
  }
}

std::vector<PreparedGenerate> Frontend::prepare_choices(const GenerateInput& input, int32_t n) const {
  if (n < 1) throw ApiError(ErrorKind::kInvalidRequest, "n must be >= 1, got " + std::to_string(n), "n");
  std::vector<PreparedGenerate> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) {
    GenerateInput choice = input;
    // Choice k draws from seed + k, so that a seeded request's n choices differ and each repeats.
    if (choice.sampling.seed && k > 0) choice.sampling.seed = *choice.sampling.seed + static_cast<uint64_t>(k);
    if (n > 1 && !choice.request_id.empty()) choice.request_id += "-" + std::to_string(k);
    out.push_back(prepare_generate(std::move(choice)));
  }
  return out;
}

std::shared_ptr<RequestStream> Frontend::submit_generate(PreparedGenerate& prepared) {
  if (!engine_) throw ApiError(ErrorKind::kInternal, "no engine is running");
  if (draining()) throw ApiError(ErrorKind::kDraining, "The server is shutting down and accepts no new requests.");
  SubmitResult result = engine_->submit_generate(prepared.request);
  switch (result.error) {
    case SubmitError::kNone: return result.stream;
    case SubmitError::kQueueFull:
      throw ApiError(ErrorKind::kQueueFull,
                     "The server is busy: " + std::to_string(config_.limits.max_queue_size) +
                         " requests are already waiting. Retry after a moment.");
    case SubmitError::kUnknownModel:
      throw ApiError(ErrorKind::kNotFound, "The model `" + prepared.request.model + "` does not exist.", "model",
                     "model_not_found");
    case SubmitError::kInvalid: {
      const bool context = result.message.find("context") != std::string::npos;
      throw ApiError(context ? ErrorKind::kContextLengthExceeded : ErrorKind::kInvalidRequest, result.message);
    }
    case SubmitError::kDraining:
      throw ApiError(ErrorKind::kDraining, "The server is shutting down and accepts no new requests.");
    case SubmitError::kFailed:
      throw ApiError(ErrorKind::kInternal, result.message);
  }
  throw ApiError(ErrorKind::kInternal, "unexpected engine submit result");
}

EmbedResult Frontend::embed(const EmbedInput& input) {
  if (draining()) throw ApiError(ErrorKind::kDraining, "The server is shutting down and accepts no new requests.");
  const FrontendModel& model = find_model(input.model, ModelKind::kEmbedding);
  if (input.texts.empty() == input.token_inputs.empty()) {
    throw ApiError(ErrorKind::kInvalidRequest, "input: give one or more texts or token-id lists", "input");
  }
  std::vector<std::vector<int32_t>> inputs;
  if (!input.texts.empty()) {
    for (const std::string& text : input.texts) inputs.push_back(tokenize(model, text, /*add_special=*/true));
  } else {
    inputs = input.token_inputs;
    for (size_t i = 0; i < inputs.size(); ++i) check_token_ids(model, inputs[i], "input[" + std::to_string(i) + "]");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) {
      throw ApiError(ErrorKind::kInvalidRequest, "input[" + std::to_string(i) + "]: must not be empty", "input");
    }
  }
  if (const std::optional<EncoderInputOverLimit> over =
          fit_encoder_inputs(inputs, encoder_input_limit(model.config), input.truncate, *model.tokenizer)) {
    throw ApiError(ErrorKind::kContextLengthExceeded, over->message("set truncate to true or shorten it"), "input");
  }
  if (!engine_) throw ApiError(ErrorKind::kInternal, "no engine is running");
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config_.limits.request_timeout_s));
  const Clock::time_point deadline = std::min(input.deadline, Clock::now() + timeout);
  const Clock::time_point start = Clock::now();
  std::future<EmbedResult> future = engine_->submit_embed(model.name, std::move(inputs), deadline);
  if (future.wait_until(deadline) != std::future_status::ready) {
    throw ApiError(ErrorKind::kDeadline, "The embeddings request did not finish before its deadline.");
  }
  EmbedResult result = future.get();
  switch (result.error) {
    case SubmitError::kNone: break;
    case SubmitError::kQueueFull:
      throw ApiError(ErrorKind::kQueueFull, "The server is busy. Retry after a moment.");
    case SubmitError::kUnknownModel:
      throw ApiError(ErrorKind::kNotFound, "The model `" + model.name + "` does not exist.", "model",
                     "model_not_found");
    case SubmitError::kInvalid:
      if (result.message.find("deadline") != std::string::npos) throw ApiError(ErrorKind::kDeadline, result.message);
      throw ApiError(ErrorKind::kInvalidRequest, result.message, "input");
    case SubmitError::kDraining:
      throw ApiError(ErrorKind::kDraining, "The server is shutting down and accepts no new requests.");
    case SubmitError::kFailed:
      throw ApiError(ErrorKind::kInternal, result.message);  // the detail is logged, not sent
  }
  if (metrics_) {
    metrics_->on_embedding(model.name, result.prompt_tokens,
                           std::chrono::duration<double>(Clock::now() - start).count());
  }
  return result;
}

bool Frontend::ready() const {
  return engine_ && engine_->ready() && engine_health().healthy() && !draining() && !models_.empty();
}

EngineHealth Frontend::engine_health() const { return engine_ ? engine_->health(Clock::now()) : EngineHealth{}; }

std::string Frontend::request_id_or_new(std::string_view client_id) {
  const bool usable = !client_id.empty() && client_id.size() <= 128 &&
                      std::all_of(client_id.begin(), client_id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
  if (usable) return std::string(client_id);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[32];
  std::snprintf(buf, sizeof(buf), "req-%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffull));
  return buf;
}

void Frontend::count_rejection(ErrorKind kind, const std::string& model) const {
  if (!metrics_) return;
  const bool served = std::any_of(models_.begin(), models_.end(), [&](const auto& m) { return m->name == model; });
  metrics_->on_rejected(served ? model : std::string(), error_kind_name(kind));
}

}  // namespace tessera
