// engine/scheduler/engine_loop.h: the engine thread. It owns the models and the KV cache, and runs
// continuous batching (every running decode plus prefill chunks under a token budget, one packed
// varlen forward per step). Front ends post requests to its bounded queue and read each request's
// RequestStream. Every request ends in exactly one FinalEvent: a complete response or an error.
//
// Thread safety: submit_*(), RequestStream and stats() are safe from any thread; everything else in
// the engine runs on its one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/attention/mask_policy.h"
#include "engine/sampler/sampling_params.h"

namespace tessera {

struct ModelConfig;
class Tokenizer;

using Clock = std::chrono::steady_clock;

struct EngineConfig {
  int32_t max_queue_size = 256;         // waiting requests; beyond it submit fails with kQueueFull
  int32_t max_batch_tokens = 2048;      // tokens per step (decodes + prefill chunks)
  int32_t max_running_sequences = 128;  // decoding at once
  int32_t kv_block_size = 16;
  int32_t kv_num_blocks = 0;            // 0: sized for max_model_len * max(4, ...) tokens; see engine_loop.cpp
  int32_t max_model_len = 0;            // 0: the model's context length; prompt + max_tokens must fit
  void validate() const;                // throws naming the field
};

enum class FinishReason { kStop, kLength, kCancelled, kDeadline, kError };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "deadline", "error"

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top-n alternatives when requested
};

struct GenerateRequest {
  std::string request_id;                 // for logs and metrics
  std::string model;                      // served model name
  std::vector<int32_t> prompt;            // token ids (front ends tokenize / apply the chat template)
  SamplingParams sampling;                // validated by the front end
  std::optional<MaskPolicy> attention;    // validated against the model by submit
  Clock::time_point deadline = Clock::time_point::max();
};

// What a request's channel carries: zero or more deltas, then exactly one final event.
struct StreamEvent {
  std::vector<int32_t> tokens;        // new token ids (stop tokens excluded from text)
  std::string text;                   // new, complete UTF-8 text (stop strings cut, held-back text released)
  std::vector<TokenLogprob> logprobs; // one per token when requested
  bool final = false;
  // final only:
  FinishReason finish_reason = FinishReason::kStop;
  std::string error;                  // kError: what went wrong
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Blocks until the next event or the timeout (nullopt on timeout). After the final event, returns
  // nullopt at once.
  virtual std::optional<StreamEvent> next(std::chrono::milliseconds timeout) = 0;
  // The client went away: the engine stops the work and frees its KV blocks within one step; a
  // final kCancelled event follows. Safe to call more than once and after the end.
  virtual void cancel() = 0;
};

enum class SubmitError { kNone, kQueueFull, kUnknownModel, kInvalid, kDraining };

struct SubmitResult {
  SubmitError error = SubmitError::kNone;
  std::string message;  // names the field / the numbers (e.g. context length exceeded)
  std::shared_ptr<RequestStream> stream;  // set when error == kNone
};

struct EmbedResult {
  SubmitError error = SubmitError::kNone;
  std::string message;
  std::vector<std::vector<float>> embeddings;
  int64_t prompt_tokens = 0;
};

// Hooks the server's metrics implement (engine/ does not depend on server/). Called on the engine
// thread; implementations must be cheap and thread-safe.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void on_step(int32_t running, int32_t waiting, double kv_cache_usage) = 0;
  virtual void on_request_started(const GenerateRequest& request, double queue_seconds, const std::string& policy) = 0;
  virtual void on_first_token(const GenerateRequest& request, double ttft_seconds) = 0;
  virtual void on_token_interval(double seconds) = 0;
  virtual void on_request_finished(const GenerateRequest& request, FinishReason reason, int64_t prompt_tokens,
                                   int64_t completion_tokens, double e2e_seconds) = 0;
  virtual void on_preemption() = 0;
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  double kv_cache_usage = 0.0;  // fraction of KV blocks in use
  int64_t steps = 0;
};

}  // namespace tessera
