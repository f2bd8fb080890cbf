// engine/speculative/ngram_drafter.h: NgramDrafter, prompt lookup decoding (vLLM's
// prompt_lookup_min / prompt_lookup_max): the tokens that followed the latest earlier occurrence of
// the sequence's last n tokens are its guess. Suits outputs that quote their prompt (summaries,
// code edits, retrieval answers). Below vLLM's shortest suffix, a suffix is still used where it is
// unambiguous (every earlier occurrence went on with the same token): a paraphrase that returns to
// the prompt's wording after one shared word then gets a guess, while a common token, which went
// on many ways, gets none.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/speculative/drafter.h"

namespace tessera {

struct NgramDrafterConfig {
  // The shortest suffix looked up. >= 1.
  int32_t min_n = 2;
  // The longest suffix looked up, tried first: a longer match is likelier to continue the same
  // way. >= min_n.
  int32_t max_n = 4;
  // Shorter suffixes, down to this length, are looked up after min_n, and guess only when every
  // earlier occurrence was followed by the same token. In [1, min_n]; min_n turns them off.
  int32_t unambiguous_min_n = 1;
  // Throws tessera::Error naming the field.
  void validate() const;
};

// Stateless: each propose() scans the tokens it is given, so `finished` has nothing to drop.
class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(NgramDrafterConfig config = {});

  std::vector<int32_t> propose(int64_t seq, std::span<const int32_t> tokens, int32_t max_tokens) override;
  void finished(int64_t seq, std::span<const int32_t> tokens, int64_t prompt_size) override;

 private:
  NgramDrafterConfig config_;
};

}  // namespace tessera
