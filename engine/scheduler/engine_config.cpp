// engine/scheduler/engine_config.cpp: EngineConfig::validate (see engine_config.h).
#include "engine/scheduler/engine_config.h"

#include "common/error.h"

namespace tessera {

void EngineFaults::validate() const {
  TESSERA_CHECK(step_delay_ms >= 0, "engine: faults.step_delay_ms must be >= 0, got " << step_delay_ms);
  TESSERA_CHECK(fail_step >= 0, "engine: faults.fail_step must be >= 0 (0: off), got " << fail_step);
}

void PrefillPolicy::validate() const {
  TESSERA_CHECK(chunk_tokens >= 0, "engine: prefill.chunk_tokens must be >= 0 (0: the step budget), got "
                                       << chunk_tokens);
  TESSERA_CHECK(max_per_step >= 0, "engine: prefill.max_per_step must be >= 0 (0: no cap), got " << max_per_step);
}

void EngineConfig::validate() const {
  TESSERA_CHECK(max_queue_size >= 1, "engine: max_queue_size must be >= 1, got " << max_queue_size);
  TESSERA_CHECK(max_batch_tokens >= 1, "engine: max_batch_tokens must be >= 1, got " << max_batch_tokens);
  TESSERA_CHECK(max_running_sequences >= 1,
                "engine: max_running_sequences must be >= 1, got " << max_running_sequences);
  TESSERA_CHECK(kv_block_size >= 1 && kv_block_size <= 1024,
                "engine: kv_block_size must be in [1, 1024], got " << kv_block_size);
  TESSERA_CHECK(kv_num_blocks >= 0, "engine: kv_num_blocks must be >= 0 (0: sized from max_model_len), got "
                                        << kv_num_blocks);
  TESSERA_CHECK(max_model_len >= 0, "engine: max_model_len must be >= 0 (0: the model's context), got "
                                        << max_model_len);
  TESSERA_CHECK(stall_timeout_s > 0, "engine: stall_timeout_s must be > 0, got " << stall_timeout_s);
  prefill.validate();
  speculative.validate();
  faults.validate();
}

}  // namespace tessera
