// engine/speculative/speculative_config.cpp: SpeculativeConfig and make_drafter (see speculative_config.h).
#include "engine/speculative/speculative_config.h"

#include "common/error.h"

namespace tessera {

void SpeculativeConfig::validate() const {
  TESSERA_CHECK(method == "none" || method == "ngram" || method == "suffix",
                "speculative.method: expected one of none, ngram, suffix, got '" << method << "'");
  TESSERA_CHECK(num_speculative_tokens >= 1 && num_speculative_tokens <= 16,
                "speculative.num_speculative_tokens: must be in [1, 16], got " << num_speculative_tokens);
  TESSERA_CHECK(disable_by_batch_size >= 0,
                "speculative.disable_by_batch_size: must be >= 0 (0: no limit), got " << disable_by_batch_size);
  ngram.validate();
  suffix.validate();
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config) {
  config.validate();
  if (config.method == "ngram") return std::make_unique<NgramDrafter>(config.ngram);
  if (config.method == "suffix") return std::make_unique<SuffixDrafter>(config.suffix);
  return nullptr;
}

}  // namespace tessera
