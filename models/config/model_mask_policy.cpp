// models/config/model_mask_policy.cpp: default policies and validation against the model.
#include "models/config/model_mask_policy.h"

#include <string>

#include "common/error.h"

namespace tessera {

MaskPolicy default_mask_policy(const ModelConfig& config) {
  if (config.arch == Architecture::kBert) return MaskPolicy::bidirectional();
  if (config.sliding_window.has_value()) {
    return MaskPolicy::sliding_window(static_cast<int32_t>(*config.sliding_window));
  }
  return MaskPolicy::causal();
}

void validate_mask_policy(const MaskPolicy& policy, const ModelConfig& config, int64_t prompt_tokens) {
  const std::string field = "attention." + policy.name();
  if (config.sliding_window.has_value()) {
    const int64_t trained = *config.sliding_window;
    TESSERA_CHECK(policy.kind == MaskPolicy::Kind::kSlidingWindow,
                  "attention: " << policy.name() << " would widen the model's trained sliding window of "
                                << trained << " tokens; use sliding_window with window <= " << trained);
    TESSERA_CHECK(policy.window <= trained, field << ".window " << policy.window
                                                  << " widens the model's trained window of " << trained
                                                  << " tokens (a request may only narrow it)");
  }
  switch (policy.kind) {
    case MaskPolicy::Kind::kCausal:
      break;
    case MaskPolicy::Kind::kBidirectional:
      // A decoder's prompt is prefilled in chunks and recomputed after a preemption: with a
      // bidirectional mask each chunk would see a different part of the prompt, so what the prompt
      // attends to would depend on scheduling. Encoders run whole texts in one step.
      TESSERA_CHECK(config.arch == Architecture::kBert,
                    field << ": a " << architecture_name(config.arch)
                          << " decoder generates causally and its prompt is prefilled in chunks; use causal, "
                             "sliding_window or segments");
      break;
    case MaskPolicy::Kind::kSlidingWindow:
      TESSERA_CHECK(policy.window >= 1, field << ".window must be >= 1, got " << policy.window);
      TESSERA_CHECK(policy.sinks >= 0, field << ".sinks must be >= 0, got " << policy.sinks);
      break;
    case MaskPolicy::Kind::kSegments: {
      TESSERA_CHECK(policy.shared_prefix >= 0,
                    field << ".shared_prefix must be >= 0, got " << policy.shared_prefix);
      TESSERA_CHECK(!policy.segment_lengths.empty(), field << ".lengths must not be empty");
      int64_t total = policy.shared_prefix;
      for (size_t i = 0; i < policy.segment_lengths.size(); ++i) {
        TESSERA_CHECK(policy.segment_lengths[i] >= 1,
                      field << ".lengths[" << i << "] must be >= 1, got " << policy.segment_lengths[i]);
        total += policy.segment_lengths[i];
      }
      TESSERA_CHECK(total <= prompt_tokens, field << ": shared_prefix + sum(lengths) = " << total
                                                  << " exceeds the prompt's " << prompt_tokens << " tokens");
      break;
    }
  }
}

MaskPolicy resolve_mask_policy(const std::optional<MaskPolicy>& requested, const ModelConfig& config,
                               int64_t prompt_tokens) {
  if (!requested.has_value()) return default_mask_policy(config);
  validate_mask_policy(*requested, config, prompt_tokens);
  return *requested;
}

}  // namespace tessera
