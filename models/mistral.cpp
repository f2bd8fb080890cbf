// models/mistral.cpp: Mistral hyper-parameters; tensors and graph are Llama's.
#include "models/mistral.h"

#include "common/error.h"

namespace tessera {

MistralHyperParams MistralHyperParams::from_config(const ModelConfig& config) {
  TESSERA_CHECK(config.arch == Architecture::kMistral,
                config.source << ": a " << architecture_name(config.arch) << " model is not Mistral");
  MistralHyperParams hp;
  hp.llama = LlamaHyperParams::from_config(config);
  hp.sliding_window = config.sliding_window;
  TESSERA_CHECK(!hp.sliding_window.has_value() || *hp.sliding_window >= 1,
                config.source << ": sliding_window must be >= 1, got " << *hp.sliding_window);
  return hp;
}

MistralModel::MistralModel(ModelConfig config, const WeightStore& store, Backend& backend, const GraphOptions& options)
    : LlamaModel(config, store, backend, options), mistral_hp_(MistralHyperParams::from_config(config)) {}

}  // namespace tessera
