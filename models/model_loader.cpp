// models/model_loader.cpp: architecture -> graph.
#include "models/model_loader.h"

#include "common/error.h"
#include "models/bert.h"
#include "models/llama.h"
#include "models/mistral.h"

namespace tessera {

std::string GraphOptions::describe() const {
  const auto word = [](bool fused) { return fused ? "fused" : "separate"; };
  std::string s = std::string("add_rms_norm=") + word(fuse_add_rms_norm) + " qkv=" + word(fuse_qkv) +
                  " gate_up=" + (gate_up_epilogue ? "epilogue" : word(fuse_gate_up));
  if (rope_in_kv_write) s += " rope_kv_write=fused";
  if (!split_lm_head) s += " lm_head=replicated";
  return s;
}

void GraphOptions::check_backend(const Backend& backend) const {
  TESSERA_CHECK(!gate_up_epilogue || fuse_gate_up,
                "fusions.gate_up: epilogue needs the gate and up projections stacked (fuse_gate_up), which is off");
  if (!all_fused() && !backend.runs_unfused_graphs()) {
    const char* field = !fuse_add_rms_norm ? "fusions.add_rms_norm" : !fuse_qkv ? "fusions.qkv" : "fusions.gate_up";
    TESSERA_FAIL(field << ": separate is not available on the " << backend.name()
                       << " backend (it runs only the fused graph)");
  }
  TESSERA_CHECK(!gate_up_epilogue || backend.runs_gate_up_epilogue(),
                "fusions.gate_up: epilogue (SiLU·mul in the gate-up GEMM) is not available on the " << backend.name()
                                                                                         << " backend");
  TESSERA_CHECK(!rope_in_kv_write || backend.runs_rope_in_kv_write(),
                "fusions.rope_kv_write: fused (RoPE applied while K is written to the cache) is not available on the "
                    << backend.name() << " backend");
}

GraphOptions default_graph_options(const ModelConfig& config, const Backend& backend) {
  GraphOptions options;
  if (config.arch == Architecture::kBert) return options;
  options.gate_up_epilogue = backend.runs_gate_up_epilogue();
  options.rope_in_kv_write = backend.runs_rope_in_kv_write();
  return options;
}

namespace {
// A head shape the backend has no attention kernel for fails at load, by name.
void check_attention_supported(const ModelConfig& config, const Backend& backend) {
  const int32_t kv_heads = config.num_kv_heads > 0 ? config.num_kv_heads : config.num_heads;
  const std::string why = backend.attention_unsupported(config.num_heads, kv_heads, config.head_dim);
  TESSERA_CHECK(why.empty(), config.source << ": the " << backend.name() << " backend has no attention kernel for "
                                           << config.num_heads << " heads on " << kv_heads << " KV heads of head_dim "
                                           << config.head_dim << " (" << why << ")");
}
}  // namespace

std::unique_ptr<CausalLm> make_causal_lm(const ModelConfig& config, const WeightStore& weights, Backend& backend,
                                         const GraphOptions& options) {
  options.check_backend(backend);
  check_attention_supported(config, backend);
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
  TESSERA_CHECK(options.all_fused() && !options.gate_up_epilogue && !options.rope_in_kv_write,
                "fusions: " << options.describe() << " asked for a bert model, whose graph has "
                               "no such switches (only the fused defaults apply)");
  check_attention_supported(config, backend);
  return std::make_unique<BertModel>(config, weights, backend);
}

}  // namespace tessera
