// server/grpc/grpc_request.cpp: gRPC requests as front-end input (see grpc_request.h).
#include "server/grpc/grpc_request.h"

#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/frontend/api_error.h"

namespace tessera {

namespace {

[[noreturn]] void invalid(const std::string& field, const std::string& message) {
  throw ApiError(ErrorKind::kInvalidRequest, field + ": " + message, field);
}

OutputConstraint constraint_of(OutputConstraint::Kind kind, std::string text = "") {
  OutputConstraint c;
  c.kind = kind;
  c.text = std::move(text);
  return c;
}

// A JSON schema given as text: checked to be a JSON object, kept as the client wrote it.
std::string schema_text(const std::string& text, const std::string& field) {
  if (!nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_object()) {
    invalid(field, "expected a JSON schema object as JSON text");
  }
  return text;
}

ToolChoice tool_choice(const v1::ToolChoice& choice) {
  ToolChoice out;
  switch (choice.choice_case()) {
    case v1::ToolChoice::kFunction:
      out.mode = ToolChoice::Mode::kFunction;
      out.function = choice.function();
      break;
    case v1::ToolChoice::kMode:
      out.mode = choice.mode() == v1::ToolChoice::MODE_NONE       ? ToolChoice::Mode::kNone
                 : choice.mode() == v1::ToolChoice::MODE_REQUIRED ? ToolChoice::Mode::kRequired
                                                                  : ToolChoice::Mode::kAuto;
      break;
    case v1::ToolChoice::CHOICE_NOT_SET:
      break;
  }
  return out;
}

void read_tools(const v1::GenerateRequest& request, GenerateInput& input) {
  for (int i = 0; i < request.tools_size(); ++i) {
    const v1::Tool& tool = request.tools(i);
    const std::string field = "tools[" + std::to_string(i) + "].parameters";
    input.tools.push_back({tool.name(), tool.description(), tool.parameters().empty() ? "" : schema_text(tool.parameters(), field)});
  }
  input.tool_choice = tool_choice(request.tool_choice());
  if (input.tools.empty() && !request.has_tool_choice()) input.tool_choice.mode = ToolChoice::Mode::kNone;
  if (request.has_parallel_tool_calls()) input.parallel_tool_calls = request.parallel_tool_calls();
}

}  // namespace

std::vector<ChatMessage> chat_messages(const v1::ChatMessages& chat) {
  std::vector<ChatMessage> messages;
  messages.reserve(chat.messages_size());
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    ChatMessage message(m.role(), m.content());
    for (const v1::ToolCall& call : m.tool_calls()) message.tool_calls.push_back({call.id(), call.name(), call.arguments()});
    message.tool_call_id = m.tool_call_id();
    if (message.role == "tool" && message.tool_call_id.empty()) {
      invalid("chat.messages[" + std::to_string(i) + "].tool_call_id", "required for role tool");
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

std::optional<OutputConstraint> output_constraint(const v1::StructuredOutput& output) {
  const std::string field = "structured_output";
  std::optional<OutputConstraint> out;
  switch (output.kind_case()) {
    case v1::StructuredOutput::kJsonObject:
      if (output.json_object()) out = constraint_of(OutputConstraint::Kind::kJsonObject);
      break;
    case v1::StructuredOutput::kJsonSchema:
      out = constraint_of(OutputConstraint::Kind::kJsonSchema, schema_text(output.json_schema(), field + ".json_schema"));
      break;
    case v1::StructuredOutput::kRegex:
      if (output.regex().empty()) invalid(field + ".regex", "must not be empty");
      out = constraint_of(OutputConstraint::Kind::kRegex, output.regex());
      break;
    case v1::StructuredOutput::kChoice:
      if (output.choice().choices().empty()) invalid(field + ".choice", "give at least one string");
      out = constraint_of(OutputConstraint::Kind::kChoice);
      out->choices.assign(output.choice().choices().begin(), output.choice().choices().end());
      break;
    case v1::StructuredOutput::kGrammar:
      if (output.grammar().empty()) invalid(field + ".grammar", "must not be empty");
      out = constraint_of(OutputConstraint::Kind::kEbnf, output.grammar());
      break;
    case v1::StructuredOutput::KIND_NOT_SET:
      invalid(field, "set one of json_object, json_schema, regex, choice, grammar (or leave structured_output unset)");
  }
  if (out) out->any_whitespace = !output.disable_any_whitespace();
  return out;
}

MaskPolicy mask_policy(const v1::AttentionPolicy& attention) {
  MaskPolicy policy;
  switch (attention.policy_case()) {
    case v1::AttentionPolicy::kCausal:
      policy.kind = MaskPolicy::Kind::kCausal;
      break;
    case v1::AttentionPolicy::kBidirectional:
      policy.kind = MaskPolicy::Kind::kBidirectional;
      break;
    case v1::AttentionPolicy::kSlidingWindow:
      policy.kind = MaskPolicy::Kind::kSlidingWindow;
      policy.window = attention.sliding_window().window();
      policy.sinks = attention.sliding_window().sinks();
      break;
    case v1::AttentionPolicy::kSegments:
      policy.kind = MaskPolicy::Kind::kSegments;
      policy.segment_lengths.assign(attention.segments().lengths().begin(), attention.segments().lengths().end());
      policy.shared_prefix = attention.segments().shared_prefix();
      policy.parallel_positions = attention.segments().parallel_positions();
      break;
    case v1::AttentionPolicy::POLICY_NOT_SET:
      throw ApiError(ErrorKind::kInvalidRequest,
                     "attention: set one of causal, bidirectional, sliding_window, segments (or leave attention unset)",
                     "attention");
  }
  return policy;
}

SamplingParams sampling_params(const v1::GenerateRequest& request) {
  SamplingParams params;
  const v1::SamplingParams& s = request.sampling();
  if (s.has_temperature()) params.temperature = s.temperature();
  if (s.has_top_p()) params.top_p = s.top_p();
  if (s.has_top_k()) params.top_k = s.top_k();
  if (s.has_min_p()) params.min_p = s.min_p();
  if (s.has_repetition_penalty()) params.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) params.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) params.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) params.seed = s.seed();
  if (s.has_logprobs()) params.logprobs = s.logprobs();
  if (s.has_min_tokens()) params.min_tokens = s.min_tokens();
  if (s.has_prompt_logprobs()) params.prompt_logprobs = s.prompt_logprobs();
  params.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  params.ignore_eos = s.ignore_eos();
  params.include_stop_str_in_output = s.include_stop_str_in_output();
  params.stop.assign(request.stop().begin(), request.stop().end());
  return params;
}

GenerateInput generate_input(const v1::GenerateRequest& request, const std::string& request_id,
                             Clock::time_point deadline) {
  GenerateInput input;
  input.model = request.model();
  input.request_id = request_id;
  switch (request.input_case()) {
    case v1::GenerateRequest::kText:
      input.prompt_text = request.text();
      break;
    case v1::GenerateRequest::kTokenIds:
      input.prompt_tokens.emplace(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    case v1::GenerateRequest::kChat:
      input.messages = chat_messages(request.chat());
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      throw ApiError(ErrorKind::kInvalidRequest, "input: set one of text, token_ids, chat", "input");
  }
  input.sampling = sampling_params(request);
  if (request.has_max_tokens()) input.max_tokens = request.max_tokens();
  if (request.has_attention()) input.attention = mask_policy(request.attention());
  if (request.has_structured_output()) {
    input.constraint = output_constraint(request.structured_output());
    input.constraint_param = "structured_output";
  }
  read_tools(request, input);
  input.deadline = deadline;
  return input;
}

}  // namespace tessera
