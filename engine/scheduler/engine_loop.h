// engine/scheduler/engine_loop.h: the engine thread. It owns the models and the KV cache, and runs
// continuous batching (every running decode plus prefill chunks under a token budget, one packed
// varlen forward per step). Front ends post requests to its bounded queue and read each request's
// RequestStream. Every request ends in exactly one FinalEvent: a complete response or an error.
//
// Thread safety: every public EngineLoop member, RequestStream and the std::future of an embedding
// are safe from any thread; the models, KV cache, samplers and decoders are touched only by the
// engine thread.
//
// Names: the request-level finish reason and logprob are RequestFinishReason and StreamTokenLogprob
// (not FinishReason / TokenLogprob) because engine/sampler/{stop_checker,sampler}.h already declare
// those names in tessera with other members, and this header includes them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/generation.h"
#include "engine/scheduler/engine_config.h"
#include "engine/sampler/sampler.h"
#include "engine/sampler/sampling_params.h"
#include "engine/sampler/stop_checker.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/mask_policy.h"
#include "models/config/model_config.h"
#include "models/model.h"

namespace tessera {

class Tokenizer;

using Clock = std::chrono::steady_clock;

// How a request ended. The sampler's FinishReason (kNone, kStop, kLength) is one sequence's view;
// this one adds the ways a request ends from outside.
enum class RequestFinishReason { kStop, kLength, kCancelled, kDeadline, kError };
// "stop", "length", "cancelled", "deadline", "error"
const char* finish_reason_name(RequestFinishReason reason);

struct StreamTokenLogprob {
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

// kFailed: the request was valid but the server could not run it (an embedding forward threw).
enum class SubmitError { kNone, kQueueFull, kUnknownModel, kInvalid, kDraining, kFailed };

struct SubmitResult {
  SubmitError error = SubmitError::kNone;
  std::string message;  // names the field / the numbers (e.g. context length exceeded)
  std::shared_ptr<RequestStream> stream;  // set when error == kNone
};

struct EmbedResult {
  SubmitError error = SubmitError::kNone;
  std::string message;
  std::vector<std::vector<float>> embeddings;  // one per input, in input order
  int64_t prompt_tokens = 0;
  // Set (with error kInvalid) when the deadline passed before the batch ran: map it to 504 /
  // DEADLINE_EXCEEDED, not 400. Shutdown gives kDraining.
  bool deadline_exceeded = false;
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
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  double kv_cache_usage = 0.0;  // fraction of KV blocks in use
  int64_t steps = 0;
  // Added beside the lead's fields (additive):
  int32_t kv_blocks_used = 0;   // over every served LM's pool
  int32_t kv_blocks_total = 0;
  int64_t preemptions = 0;      // since start
  int64_t requests_finished = 0;  // final events sent, any reason
  int32_t embed_waiting = 0;    // embedding batches queued
  int64_t prefix_cache_queries = 0;  // tokens looked up at admissions, since start
  int64_t prefix_cache_hits = 0;     // of those, tokens found cached
  int64_t prompt_tokens_computed = 0;  // prompt positions run through a forward (not found cached), since start
  int32_t kv_blocks_cached = 0;      // blocks in the prefix cache, held or not
  int64_t prefix_cache_evictions = 0;  // cached blocks taken for new K/V, since start
  int64_t segment_reused_tokens = 0;   // document tokens whose K/V was copied from the segment index
};

// The engine thread and its queues. Construct, start(), then submit from any thread. The engine
// thread owns the models and, per served LM, one Generator (paged KV pool of
// EngineConfig::kv_num_blocks blocks).
class EngineLoop {
 public:
  struct ServedLm {
    std::string name;  // what requests put in GenerateRequest::model
    ModelConfig config;
    std::unique_ptr<CausalLm> model;
    std::shared_ptr<const Tokenizer> tokenizer;  // required: streamed text and stop strings
  };
  struct ServedEncoder {
    std::string name;
    ModelConfig config;
    std::unique_ptr<Encoder> model;
    std::shared_ptr<const Tokenizer> tokenizer;  // optional here; front ends tokenize
  };

  // Validates config (throws tessera::Error naming the field) and builds one Generator per LM.
  // backend must outlive the loop; observer may be null and must outlive the loop otherwise.
  EngineLoop(EngineConfig config, Backend& backend, std::vector<ServedLm> lms, std::vector<ServedEncoder> encoders,
             EngineObserver* observer);
  // Stops the engine thread; every request still queued or running ends with a kError final event
  // "server shutting down" and every pending embedding with the same message.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Before start(): runs each LM's Generator::warm_up with this engine's largest step (sizes the
  // GPU step workspace, captures the decode graphs). Returns one report per LM, by name.
  std::vector<std::pair<std::string, WarmUpReport>> warm_up();
  // Spawns the engine thread. Requests submitted before start() wait in the queue.
  void start();

  // Checks the request against the model (unknown model: kUnknownModel; empty prompt, token ids
  // outside the vocabulary, prompt + max_tokens over the context or over the KV pool, a mask policy
  // the model refuses: kInvalid with a message naming the field and the numbers), then queues it.
  // kQueueFull when max_queue_size requests are waiting; kDraining after stop_accepting().
  SubmitResult submit_generate(GenerateRequest request);

  // Sentence embeddings for token-id inputs (front ends tokenize, with special tokens). Batched
  // with other embedding requests into one packed bidirectional forward on the engine thread. An
  // input over the encoder's limit (encoder_input_limit: max_seq_length, else
  // max_position_embeddings) is kInvalid naming its index and the numbers: front ends truncate
  // before submitting, the engine never does. The future is always fulfilled (error set on failure).
  std::future<EmbedResult> submit_embed(const std::string& model, std::vector<std::vector<int32_t>> inputs,
                                        Clock::time_point deadline);

  // SIGTERM: new submits get kDraining; queued and running work continues to its end.
  void stop_accepting();
  // True once nothing is queued or running (generate and embed); false on timeout.
  bool wait_idle(std::chrono::milliseconds timeout);

  EngineStats stats() const;  // snapshot, updated every step
  bool ready() const;         // the engine thread is running (and not stopped)
  bool accepting() const;     // false after stop_accepting()

  std::vector<std::string> model_names() const;  // LMs then encoders, in the order given
  bool is_embedding_model(const std::string& model) const;
  const ModelConfig* find_config(const std::string& model) const;  // null when unknown
  std::shared_ptr<const Tokenizer> find_tokenizer(const std::string& model) const;
  // Effective context for a model: EngineConfig::max_model_len capped by the model's; 0 when unknown.
  int64_t max_model_len(const std::string& model) const;
  // Blocks in an LLM's KV pool (EngineConfig::kv_num_blocks, or its default); 0 when unknown.
  int32_t kv_num_blocks(const std::string& model) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
