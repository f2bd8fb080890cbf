// engine/scheduler/engine_config.h: EngineConfig, the engine's sizes and switches, apart from the
// engine itself so that a front end's config can name it without the engine's headers.
#pragma once

#include <cstdint>

#include "engine/speculative/speculative_config.h"

namespace tessera {

// Fault injection for tests of the health check and the fatal-error exit; both off in production.
struct EngineFaults {
  int32_t step_delay_ms = 0;  // every step sleeps this long before its forward, as a hung device would
  int64_t fail_step = 0;      // N > 0: the N-th step fails as a sticky backend error would; 0: never
  void validate() const;      // throws naming the field
};

// How prompt chunks share a step with the decodes. Every decoding sequence gets its token first
// (a prefill chunk never takes a decode's place in the token budget), then prefills run oldest first,
// each chunk at most chunk_tokens, at most max_per_step of them: first come first served keeps the
// mean time to first token lowest when prompts queue, and a cap on the chunk bounds the
// inter-token latency that the decodes riding in the same step see.
struct PrefillPolicy {
  int32_t chunk_tokens = 0;  // one sequence's prompt tokens per step; 0: the whole step budget
  int32_t max_per_step = 0;  // sequences prefilling in one step; 0: as many as the budget takes
  void validate() const;     // throws naming the field
};

struct EngineConfig {
  int32_t max_queue_size = 256;         // waiting requests; beyond it submit fails with kQueueFull
  int32_t max_batch_tokens = 2048;      // tokens per step (decodes + prefill chunks)
  int32_t max_running_sequences = 128;  // decoding at once
  PrefillPolicy prefill;
  SpeculativeConfig speculative;        // off by default
  int32_t kv_block_size = 16;
  int32_t kv_num_blocks = 0;            // per served LM; 0: enough for 4 sequences of max_model_len tokens
  int32_t max_model_len = 0;            // 0: the model's context length; prompt + max_tokens must fit
  bool prefix_caching = true;           // reuse cached full KV blocks of earlier prompts (prefix_cache_key.h)
  // EngineLoop::health() calls the engine stalled when work is pending and no step finished for this
  // long; it must exceed the slowest legitimate step.
  double stall_timeout_s = 60.0;
  EngineFaults faults;
  void validate() const;                // throws naming the field
};

}  // namespace tessera
