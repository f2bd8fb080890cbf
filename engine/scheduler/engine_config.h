// engine/scheduler/engine_config.h: EngineConfig, the engine's sizes and switches, apart from the
// engine itself so that a front end's config can name it without the engine's headers.
#pragma once

#include <cstdint>

namespace tessera {

struct EngineConfig {
  int32_t max_queue_size = 256;         // waiting requests; beyond it submit fails with kQueueFull
  int32_t max_batch_tokens = 2048;      // tokens per step (decodes + prefill chunks)
  int32_t max_running_sequences = 128;  // decoding at once
  int32_t kv_block_size = 16;
  int32_t kv_num_blocks = 0;            // per served LM; 0: enough for 4 sequences of max_model_len tokens
  int32_t max_model_len = 0;            // 0: the model's context length; prompt + max_tokens must fit
  bool prefix_caching = true;           // reuse cached full KV blocks of earlier prompts (prefix_cache_key.h)
  void validate() const;                // throws naming the field
};

}  // namespace tessera
