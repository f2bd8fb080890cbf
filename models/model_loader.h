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

// Llama or Mistral. Throws tessera::Error naming the architecture for encoders.
// `options` switches fusions off (models/graph_options.h); checked against the backend.
std::unique_ptr<CausalLm> make_causal_lm(const ModelConfig& config, const WeightStore& weights, Backend& backend,
                                         const GraphOptions& options = {});
// BERT. Throws tessera::Error naming the architecture for decoders.
// BERT's graph has its own fusions (LayerNorm with the residual add, QKV stacked); only the defaults
// of `options` apply, anything else is refused naming the field.
std::unique_ptr<Encoder> make_encoder(const ModelConfig& config, const WeightStore& weights, Backend& backend,
                                      const GraphOptions& options = {});

}  // namespace tessera
