// engine/speculative/speculative_config.cpp: SpeculativeConfig and make_drafter (see speculative_config.h).
#include "engine/speculative/speculative_config.h"

#include "common/error.h"

namespace tessera {

void SpeculativeConfig::validate() const {
  TESSERA_CHECK(method == "none" || method == "ngram",
                "speculative.method: expected one of none, ngram, got '" << method << "'");
  TESSERA_CHECK(num_speculative_tokens >= 1 && num_speculative_tokens <= 16,
                "speculative.num_speculative_tokens: must be in [1, 16], got " << num_speculative_tokens);
  ngram.validate();
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config) {
  config.validate();
  if (config.method == "ngram") return std::make_unique<NgramDrafter>(config.ngram);
  return nullptr;
}

}  // namespace tessera
