// engine/speculative/ngram_drafter.cpp: NgramDrafter, a backwards scan for the sequence's suffix.
#include "engine/speculative/ngram_drafter.h"

#include <algorithm>
#include <optional>

#include "common/error.h"

namespace tessera {

void NgramDrafterConfig::validate() const {
  TESSERA_CHECK(min_n >= 1, "min_n must be >= 1, got " << min_n);
  TESSERA_CHECK(max_n >= min_n, "max_n must be >= min_n = " << min_n << ", got " << max_n);
}

namespace {

// Where the latest occurrence of the last n tokens that ends before the last token starts, if any.
// O(size * n) compares in the worst case and no allocation; the last token is compared first, as
// it rejects most positions at once.
std::optional<size_t> latest_earlier_occurrence(std::span<const int32_t> tokens, size_t n) {
  if (tokens.size() < n + 1) return std::nullopt;
  const std::span<const int32_t> suffix = tokens.last(n);
  for (size_t start = tokens.size() - n; start-- > 0;) {
    const std::span<const int32_t> candidate = tokens.subspan(start, n);
    if (candidate.back() == suffix.back() && std::ranges::equal(candidate, suffix)) return start;
  }
  return std::nullopt;
}

}  // namespace

NgramDrafter::NgramDrafter(NgramDrafterConfig config) : config_(config) { config_.validate(); }

std::vector<int32_t> NgramDrafter::propose(int64_t /*seq*/, std::span<const int32_t> tokens, int32_t max_tokens) {
  if (max_tokens <= 0) return {};
  for (int32_t n = config_.max_n; n >= config_.min_n; --n) {
    const std::optional<size_t> start = latest_earlier_occurrence(tokens, static_cast<size_t>(n));
    if (!start) continue;
    // The continuation may run into the suffix itself (a repeating pattern), never past the end.
    const size_t from = *start + static_cast<size_t>(n);
    const size_t count = std::min(static_cast<size_t>(max_tokens), tokens.size() - from);
    return {tokens.begin() + static_cast<ptrdiff_t>(from), tokens.begin() + static_cast<ptrdiff_t>(from + count)};
  }
  return {};
}

void NgramDrafter::finished(int64_t /*seq*/, std::span<const int32_t> /*tokens*/, int64_t /*prompt_size*/) {}

}  // namespace tessera
