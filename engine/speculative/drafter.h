// engine/speculative/drafter.h: Drafter, a source of draft tokens for speculative decoding: guesses
// of a sequence's next tokens that one forward of the target model then verifies. Draft-free
// drafters (n-gram prompt lookup, suffix decoding) guess from tokens already seen, so a good guess
// costs no extra weights.
//
// Thread safety: none. The engine thread owns a Drafter.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// One sequence's request for drafts: up to max_tokens guesses of what follows `tokens` (its prompt
// then its output so far).
struct DraftAsk {
  int64_t seq = 0;
  std::span<const int32_t> tokens;
  int32_t max_tokens = 0;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to max_tokens guesses of what follows `tokens` (sequence `seq`'s prompt then its output so
  // far); empty when the drafter has no guess. Fewer tokens asked for give a prefix of the same
  // guesses.
  virtual std::vector<int32_t> propose(int64_t seq, std::span<const int32_t> tokens, int32_t max_tokens) = 0;
  // The guesses for several sequences, one entry per ask in order: one propose() each, unless the
  // drafter does better by batching (a draft model runs every sequence's next token in one forward).
  virtual std::vector<std::vector<int32_t>> propose_all(std::span<const DraftAsk> asks) {
    std::vector<std::vector<int32_t>> drafts;
    drafts.reserve(asks.size());
    for (const DraftAsk& ask : asks) drafts.push_back(propose(ask.seq, ask.tokens, ask.max_tokens));
    return drafts;
  }
  // Sequence `seq` ended with these tokens (prompt then output): per-sequence state goes, and a
  // drafter that learns across requests keeps what it wants of the output.
  virtual void finished(int64_t seq, std::span<const int32_t> tokens, int64_t prompt_size) = 0;
};

}  // namespace tessera
