// engine/scheduler/engine_loop.h: the engine thread. It owns the models and, per served LM, a
// Scheduler and an Executor; each step is schedule -> execute -> update (continuous batching: every
// running decode plus prefill chunks under a token budget, one packed varlen forward per step). Front ends post requests to its bounded queue and read each request's
// RequestStream. Every request ends in exactly one FinalEvent: a complete response or an error.
//
// Thread safety: every public EngineLoop member, RequestStream and the std::future of an embedding
// are safe from any thread; the models, KV cache, samplers and decoders are touched only by the
// engine thread.
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

#include "engine/executor.h"
#include "engine/scheduler/engine_config.h"
#include "engine/scheduler/request.h"
#include "kernels/backend/backend.h"
#include "models/config/model_config.h"
#include "models/model.h"

namespace tessera {

class Tokenizer;

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

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  double kv_cache_usage = 0.0;  // fraction of KV blocks in use
  int64_t steps = 0;
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
  int64_t spec_drafts = 0;             // speculative verify rows run, since start
  int64_t spec_draft_tokens = 0;       // draft tokens in them
  int64_t spec_accepted_tokens = 0;    // of those, kept
};

// What a health probe needs to know about the engine thread (EngineLoop::health).
struct EngineHealth {
  bool thread_alive = false;        // started, and its loop has not ended
  int64_t pending = 0;              // requests and embedding jobs waiting or running
  double seconds_since_step = 0.0;  // since the loop last finished a pass (a step, or an idle wake-up)
  bool stalled = false;             // work pending and no pass finished within stall_timeout_s
  std::string fatal_error;          // set once the engine stopped for good (a sticky backend error)

  bool has_work() const { return pending > 0; }
  bool healthy() const { return thread_alive && !stalled && fatal_error.empty(); }
  // Why it is not healthy, for a probe's body and the log; empty when healthy.
  std::string reason() const;
};

// The engine thread and its queues. Construct, start(), then submit from any thread. The engine
// thread owns the models and, per served LM, a Scheduler (paged KV pool of
// EngineConfig::kv_num_blocks blocks) and an Executor.
class EngineLoop {
 public:
  struct ServedLm {
    std::string name;  // what requests put in GenerateRequest::model
    ModelConfig config;
    std::unique_ptr<CausalLm> model;
    std::shared_ptr<const Tokenizer> tokenizer;  // required: streamed text and stop strings
    // speculative.method draft_model: the model whose greedy tokens are the drafts (the same
    // tokenizer), on the same backend; required then, and only then.
    std::unique_ptr<CausalLm> draft_model;
    // A tensor-parallel model: its shards on ranks 1, 2, ..., each on its rank's backend (`model`
    // is rank 0's, on the engine's backend). Empty on one GPU.
    struct OtherRank {
      std::unique_ptr<CausalLm> model;
      Backend* backend = nullptr;
    };
    std::vector<OtherRank> other_ranks;
  };
  struct ServedEncoder {
    std::string name;
    ModelConfig config;
    std::unique_ptr<Encoder> model;
    std::shared_ptr<const Tokenizer> tokenizer;  // optional here; front ends tokenize
  };

  // Validates config (throws tessera::Error naming the field) and builds each LM's Scheduler and Executor.
  // backend must outlive the loop; observer may be null and must outlive the loop otherwise.
  EngineLoop(EngineConfig config, Backend& backend, std::vector<ServedLm> lms, std::vector<ServedEncoder> encoders,
             EngineObserver* observer);
  // Stops the engine thread; every request still queued or running ends with a kError final event
  // "server shutting down" and every pending embedding with the same message.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Before start(): runs each LM's Executor::warm_up with this engine's largest step (sizes the
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
  // The heartbeat: cheap (atomics and one short lock), for probes and the serve loop's watch.
  EngineHealth health(Clock::time_point now) const;

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
