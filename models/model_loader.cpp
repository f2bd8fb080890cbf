// models/model_loader.cpp: architecture -> graph.
#include "models/model_loader.h"

#include "common/error.h"
#include "models/bert.h"
#include "models/llama.h"
#include "models/mistral.h"

namespace tessera {

std::string GraphOptions::describe() const {
  const auto word = [](bool fused) { return fused ? "fused" : "separate"; };
  return std::string("add_rms_norm=") + word(fuse_add_rms_norm) + " qkv=" + word(fuse_qkv) +
         " gate_up=" + word(fuse_gate_up);
}

void GraphOptions::check_backend(const Backend& backend) const {
  if (all_fused() || backend.runs_unfused_graphs()) return;
  const char* field = !fuse_add_rms_norm ? "fusions.add_rms_norm" : !fuse_qkv ? "fusions.qkv" : "fusions.gate_up";
  TESSERA_FAIL(field << ": separate is not available on the " << backend.name()
                     << " backend (it runs only the fused graph)");
}

std::unique_ptr<CausalLm> make_causal_lm(const ModelConfig& config, const WeightStore& weights, Backend& backend,
                                         const GraphOptions& options) {
  options.check_backend(backend);
  switch (config.arch) {
    case Architecture::kLlama:
      return std::make_unique<LlamaModel>(config, weights, backend, options);
    case Architecture::kMistral:
      return std::make_unique<MistralModel>(config, weights, backend, options);
    case Architecture::kBert:
      break;
  }
  TESSERA_FAIL(config.source << ": " << architecture_name(config.arch)
                             << " is an encoder; it makes embeddings (tessera embed), not text");
}

std::unique_ptr<Encoder> make_encoder(const ModelConfig& config, const WeightStore& weights, Backend& backend,
                                      const GraphOptions& options) {
  TESSERA_CHECK(config.arch == Architecture::kBert,
                config.source << ": " << architecture_name(config.arch)
                              << " is a decoder; embeddings need an encoder (bert)");
  TESSERA_CHECK(options.all_fused(), "fusions: " << options.describe() << " asked for a bert model, whose graph has "
                                                 "no such switches (only the fused defaults apply)");
  return std::make_unique<BertModel>(config, weights, backend);
}

}  // namespace tessera
