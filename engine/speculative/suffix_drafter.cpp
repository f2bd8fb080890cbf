// engine/speculative/suffix_drafter.cpp: SuffixDrafter, the two indexes and how a guess is chosen
// between them.
#include "engine/speculative/suffix_drafter.h"

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace tessera {

namespace {
// Ends each output in the global index: a context that ended an answer votes for stopping.
constexpr int32_t kEndOfOutput = -1;
// How many of the last indexed tokens a call must repeat to count as extending them. Checking all
// would cost O(tokens) per call; a restart that regenerated differently differs near the end, and
// an index that missed an earlier difference only guesses worse, never wrongly: the target model
// verifies every guess.
constexpr size_t kExtendCheckTokens = 64;

SuffixDrafterConfig validated(SuffixDrafterConfig config) {
  config.validate();
  return config;
}
}  // namespace

void SuffixDrafterConfig::validate() const {
  TESSERA_CHECK(max_match >= 1, "max_match must be >= 1, got " << max_match);
  TESSERA_CHECK(max_cached_outputs >= 0, "max_cached_outputs must be >= 0, got " << max_cached_outputs);
  TESSERA_CHECK(max_cached_output_tokens >= 1,
                "max_cached_output_tokens must be >= 1, got " << max_cached_output_tokens);
  TESSERA_CHECK(min_share >= 0.0f && min_share <= 1.0f, "min_share must be in [0, 1], got " << min_share);
}

SuffixDrafter::SuffixDrafter(SuffixDrafterConfig config)
    : config_(validated(config)), global_(config_.max_match) {}

bool SuffixDrafter::extends(const std::vector<int32_t>& indexed, std::span<const int32_t> tokens) {
  if (tokens.size() < indexed.size()) return false;
  const size_t from = indexed.size() - std::min(indexed.size(), kExtendCheckTokens);
  return std::ranges::equal(std::span(indexed).subspan(from), tokens.subspan(from, indexed.size() - from));
}

// The sequence's index, brought up to `tokens`: extended by the new ones, or built again when the
// call does not extend what it holds (a sequence restarted after preemption).
SuffixAutomaton& SuffixDrafter::sequence_index(int64_t seq, std::span<const int32_t> tokens) {
  auto it = sequences_.find(seq);
  if (it != sequences_.end() && !extends(it->second.tokens, tokens)) {
    sequences_.erase(it);
    it = sequences_.end();
  }
  if (it == sequences_.end()) {
    it = sequences_.emplace(seq, SequenceIndex{{}, SuffixAutomaton(config_.max_match)}).first;
  }
  SequenceIndex& index = it->second;
  const std::span<const int32_t> new_tokens = tokens.subspan(index.tokens.size());
  for (int32_t token : new_tokens) index.automaton.append(token);
  index.tokens.insert(index.tokens.end(), new_tokens.begin(), new_tokens.end());
  return index.automaton;
}

std::vector<int32_t> SuffixDrafter::propose(int64_t seq, std::span<const int32_t> tokens, int32_t max_tokens) {
  if (max_tokens <= 0) return {};
  const SuffixAutomaton& own = sequence_index(seq, tokens);
  const SuffixAutomaton::Match own_match = own.longest_repeated_suffix();
  const SuffixAutomaton::Match global_match = global_.longest_suffix_in(tokens);
  // The longer context is the more specific one; on a tie the sequence's own text, which predicts
  // itself best. When it has no confident guess the other index may still have one.
  std::pair<const SuffixAutomaton*, SuffixAutomaton::Match> first{&own, own_match};
  std::pair<const SuffixAutomaton*, SuffixAutomaton::Match> second{&global_, global_match};
  if (global_match.length > own_match.length) std::swap(first, second);
  const double min_share = config_.min_share;
  std::vector<int32_t> draft = first.first->continue_greedily(first.second, max_tokens, min_share);
  if (draft.empty()) draft = second.first->continue_greedily(second.second, max_tokens, min_share);
  return draft;
}

void SuffixDrafter::finished(int64_t seq, std::span<const int32_t> tokens, int64_t prompt_size) {
  sequences_.erase(seq);
  const int64_t output_start = std::clamp<int64_t>(prompt_size, 0, static_cast<int64_t>(tokens.size()));
  const std::span<const int32_t> output = tokens.subspan(static_cast<size_t>(output_start));
  if (config_.max_cached_outputs == 0 || output.empty()) return;
  cache_output(output.first(std::min(output.size(), static_cast<size_t>(config_.max_cached_output_tokens))));
}

void SuffixDrafter::append_to_global(std::span<const int32_t> output) {
  for (int32_t token : output) global_.append(token);
  global_.append(kEndOfOutput);
}

// An automaton cannot forget text, so evicting rebuilds the global index from the outputs kept. An
// eighth of them goes at a time, so that a rebuild (O(tokens kept)) comes once per max/8 finished
// requests rather than at every one.
void SuffixDrafter::cache_output(std::span<const int32_t> output) {
  const size_t capacity = static_cast<size_t>(config_.max_cached_outputs);
  outputs_.emplace_back(output.begin(), output.end());
  if (outputs_.size() <= capacity) {
    append_to_global(output);
    return;
  }
  const size_t evict = std::max<size_t>(1, capacity / 8);
  outputs_.erase(outputs_.begin(), outputs_.begin() + static_cast<ptrdiff_t>(evict));
  global_ = SuffixAutomaton(config_.max_match);
  for (const std::vector<int32_t>& kept : outputs_) append_to_global(kept);
}

}  // namespace tessera
