// models/model_loader.h: builds the graph for a model's architecture (models/llama, mistral, bert)
// on a backend from its config and weights.
#pragma once

#include <memory>

#include "kernels/backend/backend.h"
#include "models/config/model_config.h"
#include "models/graph_options.h"
#include "models/model.h"
#include "models/weights/weight_store.h"

namespace tessera {

// The graph a model runs without a tuned profile: a decoder's with every fusion the backend runs
// (on the CUDA backend the gate-up SiLU epilogue and RoPE in the KV write, each applied only in the
// steps where it measured faster: on the H100 they cut a 7B batch-1 decode step by 1-8% depending on
// the weight format and left no prefill or batched row slower); an encoder's, which has no switches.
GraphOptions default_graph_options(const ModelConfig& config, const Backend& backend);

// Llama or Mistral. Throws tessera::Error naming the architecture for encoders.
// `options` switches fusions on or off (models/graph_options.h); checked against the backend.
std::unique_ptr<CausalLm> make_causal_lm(const ModelConfig& config, const WeightStore& weights, Backend& backend,
                                         const GraphOptions& options = {});
// BERT. Throws tessera::Error naming the architecture for decoders.
// BERT's graph has its own fusions (LayerNorm with the residual add, QKV stacked); only the defaults
// of `options` apply, anything else is refused naming the field.
std::unique_ptr<Encoder> make_encoder(const ModelConfig& config, const WeightStore& weights, Backend& backend,
                                      const GraphOptions& options = {});

}  // namespace tessera
