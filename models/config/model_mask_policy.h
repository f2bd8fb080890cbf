// models/config/model_mask_policy.h: which attention mask policies a model accepts: its default
// (bidirectional for encoders, the trained sliding window for Mistral-style models, causal
// otherwise) and the check of a requested policy against the model and the prompt.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/backend/mask_policy.h"
#include "models/config/model_config.h"

namespace tessera {

// The policy a model uses when the request gives none: bidirectional for encoders, the trained
// sliding window for Mistral-style models, causal otherwise.
MaskPolicy default_mask_policy(const ModelConfig& config);

// Checks a requested policy against the model and the prompt, throwing tessera::Error naming the
// field: a request may narrow the model's trained sliding window but never widen it (a windowed
// model accepts only sliding_window with window <= its own); a window is >= 1 and sinks >= 0;
// segment lengths are >= 1 and shared_prefix + sum(lengths) <= prompt_tokens.
void validate_mask_policy(const MaskPolicy& policy, const ModelConfig& config, int64_t prompt_tokens);

// The requested policy if any (validated), else the model's default.
MaskPolicy resolve_mask_policy(const std::optional<MaskPolicy>& requested, const ModelConfig& config,
                               int64_t prompt_tokens);

}  // namespace tessera
