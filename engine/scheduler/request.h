// engine/scheduler/request.h: what a generate request is to the engine and what comes back: the
// request, its stream of events, how it ended, and the hooks a front end's metrics implement.
//
// Names: the request-level finish reason is RequestFinishReason (not FinishReason) because
// engine/sampler/stop_checker.h already declares that name in tessera with other members.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/grammar/grammar.h"
#include "engine/sampler/sampler.h"
#include "engine/sampler/sampling_params.h"
#include "kernels/backend/mask_policy.h"

namespace tessera {

using Clock = std::chrono::steady_clock;

// How a request ended. The sampler's FinishReason (kNone, kStop, kLength) is one sequence's view;
// this one adds the ways a request ends from outside.
enum class RequestFinishReason { kStop, kLength, kCancelled, kDeadline, kError };
// "stop", "length", "cancelled", "deadline", "error"
const char* finish_reason_name(RequestFinishReason reason);

struct GenerateRequest {
  std::string request_id;                 // for logs and metrics
  std::string model;                      // served model name
  std::vector<int32_t> prompt;            // token ids (front ends tokenize / apply the chat template)
  SamplingParams sampling;                // validated by the front end
  std::optional<MaskPolicy> attention;    // validated against the model by submit
  // Constrained decoding: every sampled token is one the grammar allows (compiled by the front end
  // for this model's tokenizer). Null: unconstrained.
  std::shared_ptr<const CompiledGrammar> grammar;
  Clock::time_point deadline = Clock::time_point::max();
};

// What a request's channel carries: zero or more deltas, then exactly one final event.
struct StreamEvent {
  std::vector<int32_t> tokens;        // new token ids (stop tokens excluded from text)
  std::string text;                   // new, complete UTF-8 text (stop strings cut, held-back text released)
  std::vector<StreamTokenLogprob> logprobs; // one per token when requested
  // On a request's first event, with sampling.prompt_logprobs: one per prompt token after the
  // first, in order.
  std::vector<StreamTokenLogprob> prompt_logprobs;
  bool final = false;
  // final only:
  RequestFinishReason finish_reason = RequestFinishReason::kStop;
  std::string error;                  // kError: what went wrong
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;   // prompt tokens whose K/V was reused (prefix cache, document copies)
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

// Hooks the server's metrics implement (engine/ does not depend on server/). Called on the engine
// thread; implementations must be cheap and thread-safe.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void on_step(int32_t running, int32_t waiting, double kv_cache_usage) = 0;
  virtual void on_request_started(const GenerateRequest& request, double queue_seconds, const std::string& policy) = 0;
  virtual void on_first_token(const GenerateRequest& request, double ttft_seconds) = 0;
  virtual void on_token_interval(double seconds) = 0;
  virtual void on_request_finished(const GenerateRequest& request, RequestFinishReason reason, int64_t prompt_tokens,
                                   int64_t completion_tokens, double e2e_seconds) = 0;
  virtual void on_preemption() = 0;
  // A sequence was admitted: `queried` tokens were looked up in the prefix cache, `hit` of them
  // found (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens).
  virtual void on_prefix_cache_query(int64_t queried, int64_t hit) = 0;
  // A step with constrained sequences: how long their allowed-token masks took to fill.
  virtual void on_grammar_masks(double /*seconds*/) {}
  // A speculative verify row ran: `drafted` draft tokens, of which the first `accepted` were kept
  // (vLLM's spec_decode_* counters, with accepted tokens per draft position).
  virtual void on_speculation(int32_t /*drafted*/, int32_t /*accepted*/) {}
};

}  // namespace tessera
