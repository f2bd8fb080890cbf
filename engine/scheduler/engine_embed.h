// engine/scheduler/engine_embed.h: embedding work on the engine thread: checking inputs at submit
// (the engine never truncates: front ends fit inputs to the model's limit first) and running a
// round of queued jobs as packed varlen bidirectional forwards (no padding, no KV cache).
//
// Thread safety: check_embed_inputs is pure; run_embed_round runs on the engine thread only.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "engine/scheduler/engine_loop.h"

namespace tessera {

struct EmbedJob {
  size_t encoder = 0;  // index into the served encoders
  std::vector<std::vector<int32_t>> inputs;
  Clock::time_point deadline = Clock::time_point::max();
  std::promise<EmbedResult> promise;

  int64_t num_tokens() const;
};

// "" when every input can run; else a message naming the first bad input's index and the numbers
// (empty input, a token id outside the vocabulary, more tokens than encoder_input_limit(config)).
std::string check_embed_inputs(const std::vector<std::vector<int32_t>>& inputs, const ModelConfig& config);

// Runs every job of the round and fulfils each promise (a result or an error; a job whose deadline
// passed is not run). Inputs of several jobs of one encoder share a forward, up to max_batch_tokens
// tokens per forward (one longer input runs alone).
void run_embed_round(std::vector<std::unique_ptr<EmbedJob>>& round, std::vector<EngineLoop::ServedEncoder>& encoders,
                     Backend& backend, int64_t max_batch_tokens);

}  // namespace tessera
