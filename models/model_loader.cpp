// models/model_loader.cpp: architecture -> graph.
#include "models/model_loader.h"

#include "common/error.h"
#include "models/bert.h"
#include "models/llama.h"
#include "models/mistral.h"

namespace tessera {

std::unique_ptr<CausalLm> make_causal_lm(const ModelConfig& config, const WeightStore& weights, Backend& backend) {
  switch (config.arch) {
    case Architecture::kLlama:
      return std::make_unique<LlamaModel>(config, weights, backend);
    case Architecture::kMistral:
      return std::make_unique<MistralModel>(config, weights, backend);
    case Architecture::kBert:
      break;
  }
  TESSERA_FAIL(config.source << ": " << architecture_name(config.arch)
                             << " is an encoder; it makes embeddings (tessera embed), not text");
}

std::unique_ptr<Encoder> make_encoder(const ModelConfig& config, const WeightStore& weights, Backend& backend) {
  TESSERA_CHECK(config.arch == Architecture::kBert,
                config.source << ": " << architecture_name(config.arch)
                              << " is a decoder; embeddings need an encoder (bert)");
  return std::make_unique<BertModel>(config, weights, backend);
}

}  // namespace tessera
