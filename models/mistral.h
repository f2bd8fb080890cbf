// models/mistral.h: the Mistral architecture: Llama's tensors and graph plus a trained sliding
// window. The window is not in the graph: it is the model's default mask policy
// (default_mask_policy), lowered into the per-step attention plan, and requests may only narrow it.
#pragma once

#include <cstdint>
#include <optional>

#include "models/config/model_mask_policy.h"
#include "models/llama.h"

namespace tessera {

// --- hyper-parameters ---
struct MistralHyperParams {
  LlamaHyperParams llama;
  std::optional<int64_t> sliding_window;  // q sees k when q - window < k <= q; none: full causal

  static MistralHyperParams from_config(const ModelConfig& config);
};

// --- tensors ---
// Mistral's checkpoints use Llama's names (models/tensor_names.h) and weights unchanged.
using MistralWeights = LlamaWeights;

// --- graph ---
class MistralModel final : public LlamaModel {
 public:
  MistralModel(ModelConfig config, const WeightStore& store, Backend& backend, const GraphOptions& options = {});
  const MistralHyperParams& mistral_hyper_params() const { return mistral_hp_; }

 private:
  MistralHyperParams mistral_hp_;
};

}  // namespace tessera
