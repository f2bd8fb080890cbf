// server/grpc/grpc_request.cpp: gRPC requests as front-end input (see grpc_request.h).
#include "server/grpc/grpc_request.h"

#include <vector>

#include "server/frontend/api_error.h"

namespace tessera {

std::vector<ChatMessage> chat_messages(const v1::ChatMessages& chat) {
  std::vector<ChatMessage> messages;
  messages.reserve(chat.messages_size());
  for (const v1::ChatMessage& m : chat.messages()) messages.push_back({m.role(), m.content()});
  return messages;
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
  input.deadline = deadline;
  return input;
}

}  // namespace tessera
