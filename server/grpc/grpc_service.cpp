// server/grpc/grpc_service.cpp: tessera.v1.InferenceService on the shared front-end layer.
#include "server/grpc/grpc_service.h"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "models/tokenizer/tokenizer.h"
#include "server/frontend/api_error.h"
#include "server/frontend/frontend.h"
#include "server/grpc/grpc_request.h"

namespace tessera {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

// An internal error's detail goes to the log with the request id; the caller gets only the id.
grpc::Status status_from(const ApiError& error, const std::string& request_id) {
  const ApiError sent = client_facing(error, request_id);
  return grpc::Status(static_cast<grpc::StatusCode>(grpc_status_code(sent.kind())), sent.what());
}

// One place that turns whatever a handler throws into a status: ApiError as mapped by the front
// end, tessera::Error (input the front end did not catch) as INVALID_ARGUMENT, anything else as
// INTERNAL, its message logged (never swallowed) and the caller given the request id.
// Refusals of Generate and Embed count in request_failure_total (frontend non-null), as HTTP's do.
// A refusal that says when to retry (a full queue) carries it as gRPC's own retry pushback, which
// grpcio's retry policy honours, as HTTP carries Retry-After.
template <typename Handler>
grpc::Status guarded(const char* rpc, grpc::ServerContext& context, const std::string& request_id,
                     const Frontend* counting, const std::string& model, Handler&& handler) {
  try {
    return handler();
  } catch (const ApiError& error) {
    spdlog::info("grpc {} {}: {} ({})", rpc, request_id, error_kind_name(error.kind()), error.what());
    if (counting != nullptr) counting->count_rejection(error.kind(), model);
    if (error.retry_after_seconds() > 0) {
      context.AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(error.retry_after_seconds() * 1000));
    }
    return status_from(error, request_id);
  } catch (const Error& error) {
    spdlog::info("grpc {} {}: invalid_request ({})", rpc, request_id, user_message(error));
    if (counting != nullptr) counting->count_rejection(ErrorKind::kInvalidRequest, model);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, user_message(error));
  } catch (const std::exception& error) {
    return status_from(ApiError(ErrorKind::kInternal, std::string("grpc ") + rpc + ": " + error.what()), request_id);
  }
}

void fill_logprob(const StreamTokenLogprob& lp, v1::TokenLogprob& out) {
  out.set_token_id(lp.token);
  out.set_logprob(lp.logprob);
  for (const auto& [token, logprob] : lp.top) {
    v1::TokenLogprob::Alternative* alt = out.add_top();
    alt->set_token_id(token);
    alt->set_logprob(logprob);
  }
}

void fill_chunk(const StreamEvent& event, v1::GenerateResponse& chunk) {
  chunk.mutable_token_ids()->Add(event.tokens.begin(), event.tokens.end());
  chunk.set_text(event.text);
  for (const StreamTokenLogprob& lp : event.logprobs) fill_logprob(lp, *chunk.add_logprobs());
  for (const StreamTokenLogprob& lp : event.prompt_logprobs) fill_logprob(lp, *chunk.add_prompt_logprobs());
}

// With tools, a chunk's text is the content outside calls and the calls go to tool_calls; the
// final chunk releases what the parser held back.
void fill_tool_calls(ToolCallParser& parser, const StreamEvent& event,
                     v1::GenerateResponse& chunk) {
  ParsedOutput parsed = parser.push(event.text);
  if (event.final) {
    ParsedOutput rest = parser.finish();
    parsed.content += rest.content;
    parsed.tool_calls.insert(parsed.tool_calls.end(), rest.tool_calls.begin(), rest.tool_calls.end());
  }
  chunk.set_text(parsed.content);
  for (const ToolCallDelta& delta : parsed.tool_calls) {
    v1::ToolCallDelta* out = chunk.add_tool_calls();
    out->set_index(delta.index);
    if (!delta.name.empty()) {
      out->set_id(new_tool_call_id());
      out->set_name(delta.name);
    }
    out->set_arguments(delta.arguments);
  }
}

v1::FinishReason finish_reason(const StreamEvent& event, const std::optional<ToolCallParser>& tools) {
  if (event.finish_reason == RequestFinishReason::kLength) return v1::FINISH_REASON_LENGTH;
  return tools && tools->calls_started() > 0 ? v1::FINISH_REASON_TOOL_CALLS : v1::FINISH_REASON_STOP;
}

ErrorKind error_kind(SubmitError error) {
  switch (error) {
    case SubmitError::kQueueFull: return ErrorKind::kQueueFull;
    case SubmitError::kUnknownModel: return ErrorKind::kNotFound;
    case SubmitError::kInvalid: return ErrorKind::kInvalidRequest;
    case SubmitError::kDraining: return ErrorKind::kDraining;
    case SubmitError::kFailed: return ErrorKind::kInternal;
    case SubmitError::kNone: break;
  }
  return ErrorKind::kInternal;
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

std::chrono::steady_clock::time_point steady_deadline(std::chrono::system_clock::time_point deadline) {
  const auto system_now = std::chrono::system_clock::now();
  // gRPC reports "no deadline" as a time far in the future (gpr_inf_future); a year is beyond any
  // request timeout the config allows to matter.
  if (deadline - system_now > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + duration_cast<Clock::duration>(deadline - system_now);
}

void InferenceService::check_api_key(const grpc::ServerContext& context) const {
  std::string_view authorization;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it != metadata.end()) authorization = std::string_view(it->second.data(), it->second.size());
  frontend_.check_api_key(authorization);
}

grpc::Status InferenceService::Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const Clock::time_point start = Clock::now();
  const std::string request_id = Frontend::request_id_or_new(request->request_id());
  context->AddInitialMetadata("x-request-id", request_id);
  return guarded("Generate", *context, request_id, &frontend_, request->model(), [&]() -> grpc::Status {
    check_api_key(*context);
    const Clock::time_point deadline = steady_deadline(context->deadline());
    PreparedGenerate prepared = frontend_.prepare_generate(generate_input(*request, request_id, deadline));
    const auto prompt_tokens = static_cast<int64_t>(prepared.request.prompt.size());  // before submit moves it
    const std::string policy = prepared.policy_name;
    std::optional<ToolCallParser> tools;
    if (prepared.tool_call_format) tools.emplace(*prepared.tool_call_format);
    const std::shared_ptr<RequestStream> stream = frontend_.submit_generate(prepared);

    auto log_end = [&](const char* outcome, int64_t prompt_count, int64_t completion_tokens) {
      spdlog::info("grpc Generate {} model={} policy={} {} prompt_tokens={} completion_tokens={} {:.1f}ms", request_id,
                   request->model(), policy, outcome, prompt_count, completion_tokens, ms_since(start));
    };
    int64_t streamed_tokens = 0;
    for (;;) {
      if (context->IsCancelled()) {
        // The client went away or its deadline passed: the engine frees the KV blocks within a step.
        stream->cancel();
        const bool expired = Clock::now() >= deadline;
        log_end(expired ? "deadline" : "cancelled", prompt_tokens, streamed_tokens);
        return expired ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded")
                       : grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
      }
      std::optional<StreamEvent> event = stream->next(kCancelPoll);
      if (!event) continue;
      streamed_tokens += static_cast<int64_t>(event->tokens.size());
      v1::GenerateResponse chunk;
      chunk.set_request_id(request_id);
      fill_chunk(*event, chunk);
      if (tools) fill_tool_calls(*tools, *event, chunk);
      if (!event->final) {
        if (!writer->Write(chunk)) {
          stream->cancel();
          log_end("cancelled", prompt_tokens, streamed_tokens);
          return grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
        }
        continue;
      }
      log_end(finish_reason_name(event->finish_reason), event->prompt_tokens, event->completion_tokens);
      switch (event->finish_reason) {
        case RequestFinishReason::kStop:
        case RequestFinishReason::kLength: {
          chunk.set_finish_reason(finish_reason(*event, tools));
          v1::Usage* usage = chunk.mutable_usage();
          usage->set_prompt_tokens(event->prompt_tokens);
          usage->set_completion_tokens(event->completion_tokens);
          usage->set_total_tokens(event->prompt_tokens + event->completion_tokens);
          writer->WriteLast(chunk, grpc::WriteOptions());
          return grpc::Status::OK;
        }
        case RequestFinishReason::kCancelled:
          return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        case RequestFinishReason::kDeadline:
          return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              "deadline exceeded after " + std::to_string(event->completion_tokens) + " tokens");
        case RequestFinishReason::kError:
          return status_from(ApiError(ErrorKind::kInternal, event->error.empty() ? "engine error" : event->error),
                             request_id);
      }
      return status_from(ApiError(ErrorKind::kInternal, "unknown finish reason"), request_id);
    }
  });
}

grpc::Status InferenceService::Embed(grpc::ServerContext* context, const v1::EmbedRequest* request,
                                     v1::EmbedResponse* response) {
  const Clock::time_point start = Clock::now();
  const std::string request_id = Frontend::request_id_or_new(request->request_id());
  context->AddInitialMetadata("x-request-id", request_id);
  return guarded("Embed", *context, request_id, &frontend_, request->model(), [&]() -> grpc::Status {
    check_api_key(*context);
    EmbedInput input;
    input.model = request->model();
    input.request_id = request_id;
    input.texts.assign(request->inputs().begin(), request->inputs().end());
    if (request->has_truncate()) input.truncate = request->truncate();
    input.deadline = steady_deadline(context->deadline());
    EmbedResult result = frontend_.embed(input);
    if (result.error != SubmitError::kNone) throw ApiError(error_kind(result.error), result.message);
    response->set_model(request->model());
    for (const std::vector<float>& values : result.embeddings) {
      response->add_embeddings()->mutable_values()->Add(values.begin(), values.end());
    }
    response->mutable_usage()->set_prompt_tokens(result.prompt_tokens);
    response->mutable_usage()->set_total_tokens(result.prompt_tokens);
    spdlog::info("grpc Embed {} model={} inputs={} prompt_tokens={} {:.1f}ms", request_id, request->model(),
                 request->inputs_size(), result.prompt_tokens, ms_since(start));
    return grpc::Status::OK;
  });
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                                        v1::TokenizeResponse* response) {
  return guarded("Tokenize", *context, "-", nullptr, "", [&]() -> grpc::Status {
    check_api_key(*context);
    const FrontendModel& model = frontend_.find_any_model(request->model());
    std::vector<int32_t> ids;
    switch (request->input_case()) {
      case v1::TokenizeRequest::kText:
        ids = frontend_.tokenize(model, request->text(),
                                 request->has_add_special_tokens() ? request->add_special_tokens() : true);
        break;
      case v1::TokenizeRequest::kChat:
        // The template writes the special tokens itself.
        ids = frontend_.tokenize(model, frontend_.render_chat(model, chat_messages(request->chat()), true),
                                 request->has_add_special_tokens() && request->add_special_tokens());
        break;
      case v1::TokenizeRequest::INPUT_NOT_SET:
        throw ApiError(ErrorKind::kInvalidRequest, "input: set one of text, chat", "input");
    }
    response->mutable_token_ids()->Add(ids.begin(), ids.end());
    for (int32_t id : ids) response->add_tokens(model.tokenizer->id_to_token(id));
    response->set_max_model_len(model.max_model_len);
    return grpc::Status::OK;
  });
}

grpc::Status InferenceService::Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                                          v1::DetokenizeResponse* response) {
  return guarded("Detokenize", *context, "-", nullptr, "", [&]() -> grpc::Status {
    check_api_key(*context);
    const FrontendModel& model = frontend_.find_any_model(request->model());
    const std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
    response->set_text(frontend_.detokenize(model, ids, request->skip_special_tokens()));
    return grpc::Status::OK;
  });
}

grpc::Status InferenceService::ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* /*request*/,
                                          v1::ListModelsResponse* response) {
  return guarded("ListModels", *context, "-", nullptr, "", [&]() -> grpc::Status {
    check_api_key(*context);
    for (const FrontendModel* model : frontend_.models()) {
      v1::Model* out = response->add_models();
      out->set_id(model->name);
      out->set_task(model->kind == ModelKind::kLlm ? "generate" : "embed");
      out->set_architecture(architecture_name(model->config.arch));
      out->set_max_model_len(model->max_model_len);
    }
    return grpc::Status::OK;
  });
}

}  // namespace tessera
