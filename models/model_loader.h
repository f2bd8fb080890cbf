// models/model_loader.h: builds the graph for a model's architecture (models/llama, mistral, bert)
// on a backend from its config and weights.
#pragma once

#include <memory>

#include "kernels/backend/backend.h"
#include "models/config/model_config.h"
#include "models/model.h"
#include "models/weights/weight_store.h"

namespace tessera {

// Llama or Mistral. Throws tessera::Error naming the architecture for encoders.
std::unique_ptr<CausalLm> make_causal_lm(const ModelConfig& config, const WeightStore& weights, Backend& backend);
// BERT. Throws tessera::Error naming the architecture for decoders.
std::unique_ptr<Encoder> make_encoder(const ModelConfig& config, const WeightStore& weights, Backend& backend);

}  // namespace tessera
