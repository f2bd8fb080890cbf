// engine/speculative/ngram_drafter.cpp: NgramDrafter, a backwards scan for the sequence's suffix.
#include "engine/speculative/ngram_drafter.h"

#include <algorithm>
#include <optional>

#include "common/error.h"

namespace tessera {

void NgramDrafterConfig::validate() const {
  TESSERA_CHECK(min_n >= 1, "min_n must be >= 1, got " << min_n);
  TESSERA_CHECK(max_n >= min_n, "max_n must be >= min_n = " << min_n << ", got " << max_n);
  TESSERA_CHECK(unambiguous_min_n >= 1 && unambiguous_min_n <= min_n,
                "unambiguous_min_n must be in [1, min_n = " << min_n << "], got " << unambiguous_min_n);
}

namespace {

// Whether `suffix` occurs at `start`; the last token is compared first, as it rejects most
// positions at once.
bool occurs_at(std::span<const int32_t> tokens, size_t start, std::span<const int32_t> suffix) {
  const std::span<const int32_t> candidate = tokens.subspan(start, suffix.size());
  return candidate.back() == suffix.back() && std::ranges::equal(candidate, suffix);
}

// Where the latest occurrence of the last n tokens that ends before the last token starts, if any.
// O(size * n) compares in the worst case and no allocation.
std::optional<size_t> latest_earlier_occurrence(std::span<const int32_t> tokens, size_t n) {
  if (tokens.size() < n + 1) return std::nullopt;
  const std::span<const int32_t> suffix = tokens.last(n);
  for (size_t start = tokens.size() - n; start-- > 0;) {
    if (occurs_at(tokens, start, suffix)) return start;
  }
  return std::nullopt;
}

// The latest earlier occurrence of the last n tokens, if every earlier one was followed by the
// same token as it. Scans every position: O(size * n).
std::optional<size_t> unambiguous_occurrence(std::span<const int32_t> tokens, size_t n) {
  const std::optional<size_t> latest = latest_earlier_occurrence(tokens, n);
  if (!latest) return std::nullopt;
  const std::span<const int32_t> suffix = tokens.last(n);
  const int32_t next = tokens[*latest + n];
  for (size_t start = *latest; start-- > 0;) {
    if (occurs_at(tokens, start, suffix) && tokens[start + n] != next) return std::nullopt;
  }
  return latest;
}

}  // namespace

NgramDrafter::NgramDrafter(NgramDrafterConfig config) : config_(config) { config_.validate(); }

std::vector<int32_t> NgramDrafter::propose(int64_t /*seq*/, std::span<const int32_t> tokens, int32_t max_tokens) {
  if (max_tokens <= 0) return {};
  for (int32_t n = config_.max_n; n >= config_.unambiguous_min_n; --n) {
    const std::optional<size_t> start = n >= config_.min_n ? latest_earlier_occurrence(tokens, static_cast<size_t>(n))
                                                           : unambiguous_occurrence(tokens, static_cast<size_t>(n));
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
