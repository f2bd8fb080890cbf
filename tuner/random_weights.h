// tuner/random_weights.h: a Llama-family decoder's weights drawn from a fixed seed, for timing a model
// shape whose weights are not at hand (`tessera tune --random-weights`: the Llama-2-7B shape from its
// config.json alone). Latency and memory do not depend on the values; quality means nothing here.
#pragma once

#include <cstdint>

#include "models/config/model_config.h"
#include "models/weights/weight_store.h"

namespace tessera::tuner {

// Every tensor a Llama / Mistral model of `config` loads, in bf16 (the precision a GPU checkpoint
// ships in): matrices uniform with standard deviation 0.02 (the usual initialisation, so activations
// stay finite through the layers), norm weights 1. Value i of tensor t is a hash of (seed, t, i), so
// the weights are the same for a seed whatever the thread count; all cores draw them (the 7B shape's
// 13.5 GB in seconds). An lm_head is drawn unless the config ties the embeddings. Throws naming the
// architecture for anything but a Llama-family decoder.
WeightStore random_llama_weights(const ModelConfig& config, uint64_t seed);

}  // namespace tessera::tuner
