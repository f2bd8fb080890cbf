// engine/speculative/speculative_config.cpp: SpeculativeConfig and make_drafter (see speculative_config.h).
#include "engine/speculative/speculative_config.h"

#include "common/error.h"

namespace tessera {

void SpeculativeConfig::validate() const {
  TESSERA_CHECK(method == "none" || method == "ngram" || method == "suffix" || method == "draft_model",
                "speculative.method: expected one of none, ngram, suffix, draft_model, got '" << method << "'");
  TESSERA_CHECK((method == "draft_model") == !draft_model.empty(),
                (method == "draft_model" ? std::string("speculative.draft_model: method draft_model needs the "
                                                       "draft's model path")
                                         : "speculative.draft_model: set, but speculative.method is " + method));
  TESSERA_CHECK(draft_kv_tokens >= 16, "speculative.draft_kv_tokens: must be >= 16, got " << draft_kv_tokens);
  TESSERA_CHECK(num_speculative_tokens >= 1 && num_speculative_tokens <= 16,
                "speculative.num_speculative_tokens: must be in [1, 16], got " << num_speculative_tokens);
  TESSERA_CHECK(disable_by_batch_size >= 0,
                "speculative.disable_by_batch_size: must be >= 0 (0: no limit), got " << disable_by_batch_size);
  TESSERA_CHECK(untimed_row_cost >= 0.0 && untimed_row_cost <= 100.0,
                "speculative.untimed_row_cost: must be in [0, 100], got " << untimed_row_cost);
  // The drafters' fields under the server config's (vLLM's) key names.
  TESSERA_CHECK(ngram.min_n >= 1, "speculative.prompt_lookup_min: must be >= 1, got " << ngram.min_n);
  TESSERA_CHECK(ngram.max_n >= ngram.min_n, "speculative.prompt_lookup_max: must be >= prompt_lookup_min ("
                                                << ngram.min_n << "), got " << ngram.max_n);
  TESSERA_CHECK(ngram.unambiguous_min_n >= 1 && ngram.unambiguous_min_n <= ngram.min_n,
                "speculative.prompt_lookup_unambiguous_min: must be in [1, prompt_lookup_min (" << ngram.min_n
                                                                                                << ")], got "
                                                                                                << ngram.unambiguous_min_n);
  TESSERA_CHECK(suffix.max_match >= 1, "speculative.suffix_decoding_max_tree_depth: must be >= 1, got "
                                           << suffix.max_match);
  TESSERA_CHECK(suffix.max_cached_outputs >= 0, "speculative.suffix_decoding_max_cached_requests: must be >= 0, got "
                                                    << suffix.max_cached_outputs);
  TESSERA_CHECK(suffix.min_share >= 0.0f && suffix.min_share <= 1.0f,
                "speculative.suffix_decoding_min_token_prob: must be in [0, 1], got " << suffix.min_share);
  suffix.validate();  // what the server does not expose
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& config) {
  config.validate();
  if (config.method == "ngram") return std::make_unique<NgramDrafter>(config.ngram);
  if (config.method == "suffix") return std::make_unique<SuffixDrafter>(config.suffix);
  return nullptr;
}

}  // namespace tessera
