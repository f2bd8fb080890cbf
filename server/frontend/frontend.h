// server/frontend/frontend.h: what the HTTP and gRPC front ends share, so that no validation is
// written twice: API-key check, model lookup, request validation into a GenerateRequest (sampling
// parameters, max_tokens against the context, mask policy), chat templates, tokenization,
// embeddings, drain state, and the mapping of engine submit errors to ApiError.
//
// Thread safety: after the models are added (before serving starts), every const member and
// submit_generate / embed / begin_drain are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/grammar/grammar.h"
#include "engine/sampler/sampling_params.h"
#include "engine/scheduler/engine_loop.h"
#include "kernels/backend/mask_policy.h"
#include "models/config/model_config.h"
#include "models/tokenizer/chat_template.h"
#include "server/config/server_config.h"
#include "server/frontend/api_error.h"
#include "server/frontend/tool_calls.h"

namespace tessera {

class EngineLoop;
class Tokenizer;
class ServerMetrics;

enum class ModelKind { kLlm, kEmbedding };
const char* model_kind_name(ModelKind kind);  // "llm", "embedding"

// One served model as the front ends see it.
struct FrontendModel {
  std::string name;
  ModelKind kind = ModelKind::kLlm;
  ModelConfig config;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;  // LLMs whose template is known (or overridden)
  // The Jinja source the model ships, for /tokenizer_info ("" when it ships none), with the BOS/EOS
  // strings its template writes.
  std::string chat_template_source;
  // LLMs: compiles response formats and tool-call constraints for this model's tokenizer; null when
  // the model cannot be constrained (requests asking for it are refused).
  std::shared_ptr<GrammarCompiler> grammar_compiler;
  // LLMs: min(server limit, the model's context); embedding models: encoder_input_limit(config).
  int64_t max_model_len = 0;
  int64_t created = 0;                        // unix seconds, for /v1/models
};

// A generate request before validation, whatever protocol it came in on. Exactly one of
// prompt_text, prompt_tokens, messages is set.
struct GenerateInput {
  std::string model;
  std::string request_id;
  std::optional<std::string> prompt_text;          // completions: BOS added as the tokenizer does
  std::optional<std::vector<int32_t>> prompt_tokens;
  std::optional<std::vector<ChatMessage>> messages;  // rendered with the model's chat template
  bool add_generation_prompt = true;               // chat only
  SamplingParams sampling;                         // its max_tokens is replaced by the one below
  // Unset: the rest of the context for chat, 16 for completions (OpenAI's defaults).
  std::optional<int64_t> max_tokens;
  std::optional<MaskPolicy> attention;
  // The client's deadline; the server's request timeout caps it.
  Clock::time_point deadline = Clock::time_point::max();
  // What the output must match (a response format or vLLM's structured outputs); constraint_param
  // names the request field it came from, so that a constraint that does not compile is reported
  // against it.
  std::optional<OutputConstraint> constraint;
  std::string constraint_param = "response_format";
  // Chat only: functions the model may call, rendered into the prompt by the chat template.
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
};

struct PreparedGenerate {
  GenerateRequest request;     // ready for submit_generate
  const FrontendModel* model = nullptr;
  std::string policy_name;     // the resolved mask policy ("causal", "sliding_window", ...)
  // Set when the output is to be split into content and tool calls (tools given, tool_choice not
  // "none"): the format the model writes calls in.
  std::optional<ToolCallFormat> tool_call_format;
};


// A tool call's id as OpenAI writes them: "call_" and 24 random letters and digits.
std::string new_tool_call_id();

// Most tools one request may define.
constexpr size_t kMaxTools = 128;

struct EmbedInput {
  std::string model;
  std::string request_id;
  std::vector<std::string> texts;                    // either texts
  std::vector<std::vector<int32_t>> token_inputs;    // or token ids (exactly one non-empty)
  // Inputs over the model's limit (encoder_input_limit: max_seq_length, else
  // max_position_embeddings) are truncated to it, as SentenceTransformer.encode does; false refuses
  // them with kContextLengthExceeded naming the input, its tokens and the limit.
  bool truncate = true;
  Clock::time_point deadline = Clock::time_point::max();
};

class Frontend {
 public:
  // engine may be null (unit tests of validation); submit_* then fail with kInternal.
  Frontend(const ServerConfig& config, EngineLoop* engine, ServerMetrics* metrics);

  // Before serving starts. Sets max_model_len: an LLM's from the config limit and the model's
  // context, an embedding model's from its input limit (what longer inputs are truncated to).
  void add_model(FrontendModel model);
  std::vector<const FrontendModel*> models() const;

  // `authorization` is the Authorization header / metadata value ("" when absent). Throws
  // kUnauthorized when keys are configured and it is not "Bearer <a configured key>".
  void check_api_key(std::string_view authorization) const;
  bool keys_required() const { return !api_keys_.empty(); }
  const ServerConfig::Auth& auth() const { return config_.auth; }

  // kNotFound (code "model_not_found") when no model has this name; kInvalidRequest when it is of
  // the other kind (an embedding model asked to generate).
  const FrontendModel& find_model(const std::string& name, ModelKind kind) const;
  const FrontendModel& find_any_model(const std::string& name) const;

  // Validates and tokenizes: throws ApiError (kInvalidRequest naming the field, kNotFound,
  // kContextLengthExceeded with OpenAI's wording and numbers, kDraining).
  PreparedGenerate prepare_generate(GenerateInput input) const;
  // n choices of one prompt (n > 1: OpenAI's `n`), each its own engine sequence: choice k samples
  // with seed + k when a seed is given, and has request id "<id>-k".
  std::vector<PreparedGenerate> prepare_choices(const GenerateInput& input, int32_t n) const;
  // Posts to the engine: kQueueFull, kDraining, kInvalidRequest, kNotFound mapped from SubmitError.
  std::shared_ptr<RequestStream> submit_generate(PreparedGenerate& prepared);

  // Validates, tokenizes, fits the inputs to the model's limit (truncating unless input.truncate is
  // false) and waits for the engine (until the deadline: kDeadline). prompt_tokens counts the tokens
  // embedded, after truncation.
  EmbedResult embed(const EmbedInput& input);

  // Chat messages -> prompt text with the model's template (kInvalidRequest when it has none),
  // showing the model `tools` where the template does.
  std::string render_chat(const FrontendModel& model, const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt, const std::vector<ToolDefinition>& tools = {}) const;
  std::vector<int32_t> tokenize(const FrontendModel& model, std::string_view text, bool add_special) const;
  // Ids must be in [0, vocab): kInvalidRequest naming "tokens[i]" otherwise.
  std::string detokenize(const FrontendModel& model, const std::vector<int32_t>& ids, bool skip_special) const;

  // Checks tools (at most kMaxTools, names unique and [a-zA-Z0-9_-]{1,64}, parameters a JSON
  // object) and that a named tool_choice is one of them: kInvalidRequest naming "tools" or
  // "tool_choice".
  static void validate_tools(const std::vector<ToolDefinition>& tools, const ToolChoice& choice);

  // SIGTERM: from now on prepare_* / submit_* fail with kDraining and ready() is false.
  void begin_drain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  // Models loaded, engine started and healthy (engine_health), not draining.
  bool ready() const;
  // The engine's heartbeat now; without an engine, a dead thread ("engine thread is not running").
  EngineHealth engine_health() const;

  const ServerConfig& config() const { return config_; }
  EngineLoop* engine() const { return engine_; }
  ServerMetrics* metrics() const { return metrics_; }
  // A fresh id ("req-" + 24 hex digits) when the client sent none; a client's id is kept if it is
  // 1..128 printable ASCII characters, else replaced.
  static std::string request_id_or_new(std::string_view client_id);
  // Counts a request the front end refused (request_failure_total{reason=error_kind_name}); the
  // model label is kept only when `model` is served, so clients cannot grow the label set.
  void count_rejection(ErrorKind kind, const std::string& model) const;

 private:
  ServerConfig config_;
  EngineLoop* engine_;
  ServerMetrics* metrics_;
  std::vector<std::string> api_keys_;
  std::vector<std::unique_ptr<FrontendModel>> models_;
  std::atomic<bool> draining_{false};

  // The prompt's text: the chat template with the request's tools, or nothing for completions.
  std::string render_generate_chat(const FrontendModel& model, const GenerateInput& input) const;
  // The prompt's token ids: a chat rendered with the model's template (whose end-of-turn token joins
  // sampling's EOS ids), a text tokenized, or ids checked against the vocabulary. Never empty.
  std::vector<int32_t> prompt_tokens(const FrontendModel& model, const GenerateInput& input,
                                     SamplingParams& sampling) const;
  // max_tokens as given or as OpenAI defaults it, checked against the model's context.
  int64_t resolve_max_tokens(const FrontendModel& model, const GenerateInput& input, int64_t prompt_len,
                             bool scores_prompt) const;
  // The tool format the request's output is parsed with (nullopt: no tools or tool_choice none);
  // kInvalidRequest on "tools" when the model's template has no tool format.
  std::optional<ToolCallFormat> request_tool_format(const FrontendModel& model, const GenerateInput& input) const;
  // The compiled grammar for the request's constraint or tool calls (null: unconstrained). A
  // GrammarError becomes kInvalidRequest naming the field and where in it.
  std::shared_ptr<const CompiledGrammar> compile_constraint(const FrontendModel& model, const GenerateInput& input,
                                                            const std::optional<ToolCallFormat>& tool_format) const;
};

// The `tessera` extension object of a request body: {"attention": {"sliding_window": {...}}} or
// {"attention": {"segments": {...}}}, ... Unknown keys are errors. Throws ApiError naming
// "tessera.attention..." on bad input. Returns the requested policy, nullopt when none.
std::optional<MaskPolicy> parse_tessera_extension(const nlohmann::json& tessera_object);

// Maps SamplingParams::validate()'s tessera::Error to kInvalidRequest with param = the field.
void validate_sampling(const SamplingParams& params);

// OpenAI's context-length message: "This model's maximum context length is N tokens. However, you
// requested T tokens (P in the messages, C in the completion). Please reduce the length of the
// messages or completion." (`in your prompt` for completions).
std::string context_length_message(int64_t max_len, int64_t prompt_tokens, int64_t completion_tokens, bool chat);

}  // namespace tessera
