// tests/fuzz/request_checks.h: what both request fuzzers do with a parsed request beyond the
// parser: the attention checks the front end makes against a model (here a Llama of 4,096
// positions), then the policy's lowering to the kernels' form.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/backend/mask_policy.h"
#include "models/config/model_config.h"
#include "models/config/model_mask_policy.h"

namespace tessera::fuzz {

// prompt_tokens: the prompt's length when the request gives token ids, else a stand-in.
inline void check_attention(const std::optional<MaskPolicy>& attention, size_t prompt_tokens) {
  static const ModelConfig config = [] {
    ModelConfig c;
    c.arch = Architecture::kLlama;
    c.max_position_embeddings = 4096;
    return c;
  }();
  const MaskPolicy policy = resolve_mask_policy(attention, config, static_cast<int64_t>(std::max<size_t>(prompt_tokens, 1)));
  std::vector<int32_t> segment_ends;
  policy.lower(segment_ends);
}

}  // namespace tessera::fuzz
