// tests/unit/speculative/drafters_test.cpp: the draft-free drafters, NgramDrafter (prompt lookup) and
// SuffixDrafter (suffix decoding), on small hand-made token sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/speculative/ngram_drafter.h"
#include "engine/speculative/suffix_drafter.h"

namespace tessera {
namespace {

using Tokens = std::vector<int32_t>;

// ---- NgramDrafter ----

TEST(NgramDrafter, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  NgramDrafter drafter({.min_n = 2, .max_n = 2});
  // "1 2" occurs at 0 (then 3 4) and at 4 (then 5 6); the later one wins.
  const Tokens tokens = {1, 2, 3, 4, 1, 2, 5, 6, 9, 1, 2};
  EXPECT_EQ(drafter.propose(0, tokens, 2), (Tokens{5, 6}));
}

TEST(NgramDrafter, LongerMatchWinsOverLaterShorterOne) {
  NgramDrafter drafter({.min_n = 1, .max_n = 3});
  // "7 1 2" occurs once, early (then 3); "1 2" alone occurs later (then 5).
  const Tokens tokens = {7, 1, 2, 3, 0, 1, 2, 5, 0, 7, 1, 2};
  EXPECT_EQ(drafter.propose(0, tokens, 1), (Tokens{3}));
}

TEST(NgramDrafter, FallsBackToShorterSuffixDownToMinN) {
  const Tokens tokens = {4, 2, 8, 0, 3, 2};  // only the 1-token suffix "2" recurs
  NgramDrafter min_one({.min_n = 1, .max_n = 4});
  EXPECT_EQ(min_one.propose(0, tokens, 3), (Tokens{8, 0, 3}));
  NgramDrafter min_two({.min_n = 2, .max_n = 4, .unambiguous_min_n = 2});
  EXPECT_TRUE(min_two.propose(0, tokens, 3).empty());
}

TEST(NgramDrafter, ASuffixShorterThanMinNGuessesOnlyWhereEveryOccurrenceWentOnTheSameWay) {
  NgramDrafter drafter({.min_n = 2, .max_n = 4, .unambiguous_min_n = 1});
  // "5" went on with 7 both times: the latest occurrence's continuation.
  EXPECT_EQ(drafter.propose(0, Tokens{5, 7, 1, 5, 7, 2, 9, 5}, 3), (Tokens{7, 2, 9}));
  // "5" went on with 7 and with 8: no guess.
  EXPECT_TRUE(drafter.propose(0, Tokens{5, 7, 1, 5, 8, 2, 9, 5}, 3).empty());
  // A suffix of min_n or more guesses however its occurrences went on: "9 5" -> 8 (the latest).
  EXPECT_EQ(drafter.propose(0, Tokens{9, 5, 7, 9, 5, 8, 9, 5}, 1), (Tokens{8}));
}

TEST(NgramDrafter, IgnoresMatchesLongerThanMaxN) {
  // With max_n = 2, the 3-token match "1 2 3" (then 4) is not looked for: the latest "2 3" (then 9)
  // wins.
  const Tokens tokens = {1, 2, 3, 4, 2, 3, 9, 1, 2, 3};
  EXPECT_EQ(NgramDrafter({.min_n = 2, .max_n = 2}).propose(0, tokens, 1), (Tokens{9}));
  EXPECT_EQ(NgramDrafter({.min_n = 2, .max_n = 3}).propose(0, tokens, 1), (Tokens{4}));
}

TEST(NgramDrafter, ProposesAtMostMaxTokensAndNothingPastTheEnd) {
  NgramDrafter drafter;
  const Tokens tokens = {1, 2, 3, 4, 5, 6, 1, 2};
  EXPECT_EQ(drafter.propose(0, tokens, 3), (Tokens{3, 4, 5}));
  EXPECT_EQ(drafter.propose(0, tokens, 100), (Tokens{3, 4, 5, 6, 1, 2}));
  EXPECT_TRUE(drafter.propose(0, tokens, 0).empty());
}

TEST(NgramDrafter, RepeatingPatternContinuesIntoItsOwnSuffix) {
  NgramDrafter drafter({.min_n = 2, .max_n = 2});
  EXPECT_EQ(drafter.propose(0, Tokens{5, 5, 5}, 4), (Tokens{5}));
}

TEST(NgramDrafter, NoMatchProposesNothing) {
  NgramDrafter drafter;
  EXPECT_TRUE(drafter.propose(0, Tokens{1, 2, 3, 4, 5, 6, 7}, 4).empty());
}

TEST(NgramDrafter, TokensShorterThanMinNProposeNothing) {
  NgramDrafter drafter({.min_n = 3, .max_n = 4, .unambiguous_min_n = 3});
  EXPECT_TRUE(drafter.propose(0, Tokens{}, 4).empty());
  EXPECT_TRUE(drafter.propose(0, Tokens{1}, 4).empty());
  EXPECT_TRUE(drafter.propose(0, Tokens{1, 1}, 4).empty());
  EXPECT_TRUE(drafter.propose(0, Tokens{1, 1, 1}, 4).empty());  // the suffix itself is no match
}

TEST(NgramDrafter, ConfigValidationNamesTheField) {
  auto message = [](NgramDrafterConfig config) -> std::string {
    try {
      config.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message({.min_n = 0, .max_n = 4}).rfind("min_n must be >= 1", 0), 0u);
  EXPECT_EQ(message({.min_n = 3, .max_n = 2}).rfind("max_n must be >= min_n", 0), 0u);
  EXPECT_EQ(message({.min_n = 2, .max_n = 4, .unambiguous_min_n = 3}).rfind("unambiguous_min_n must be in", 0), 0u);
  EXPECT_EQ(message({.min_n = 2, .max_n = 4, .unambiguous_min_n = 0}).rfind("unambiguous_min_n must be in", 0), 0u);
  EXPECT_EQ(message({}), "");
  EXPECT_THROW(NgramDrafter({.min_n = 0}), Error);
}

// ---- SuffixDrafter ----

// The brute-force model of SuffixDrafter the tests check it against: how often each token followed
// `context` in `text`.
std::map<int32_t, int> next_token_counts(const Tokens& text, std::span<const int32_t> context) {
  std::map<int32_t, int> counts;
  for (size_t end = context.size(); end < text.size(); ++end) {
    if (std::equal(context.begin(), context.end(), text.begin() + static_cast<ptrdiff_t>(end - context.size()))) {
      ++counts[text[end]];
    }
  }
  return counts;
}

// The longest suffix of `tokens` (at most max_match) that `text` continues somewhere.
size_t reference_match_length(const Tokens& text, const Tokens& tokens, int32_t max_match) {
  for (size_t length = std::min(tokens.size(), static_cast<size_t>(max_match)); length > 0; --length) {
    if (!next_token_counts(text, std::span(tokens).last(length)).empty()) return length;
  }
  return 0;
}

// Greedy most frequent continuation of `tokens`' last `length` tokens, the context capped at
// max_match tokens; a negative token (end of an output) or a share below min_share stops it.
Tokens reference_continuation(const Tokens& text, const Tokens& tokens, size_t length, const SuffixDrafterConfig& config,
                              int32_t max_tokens) {
  Tokens context(tokens.end() - static_cast<ptrdiff_t>(length), tokens.end()), draft;
  while (length > 0 && static_cast<int32_t>(draft.size()) < max_tokens) {
    int best = 0, total = 0;
    int32_t best_token = -1;
    for (auto [token, count] : next_token_counts(text, context)) {
      total += count;
      if (count > best) best = count, best_token = token;
    }
    if (best == 0 || best_token < 0 || best < static_cast<double>(config.min_share) * total) break;
    draft.push_back(best_token);
    context.push_back(best_token);
    if (context.size() > static_cast<size_t>(config.max_match)) context.erase(context.begin());
  }
  return draft;
}

// What SuffixDrafter::propose should return given the cached outputs (none evicted or truncated).
Tokens reference_propose(const Tokens& tokens, const std::vector<Tokens>& outputs, const SuffixDrafterConfig& config,
                         int32_t max_tokens) {
  Tokens global;
  for (const Tokens& output : outputs) {
    global.insert(global.end(), output.begin(), output.end());
    global.push_back(-1);
  }
  const size_t own_length = reference_match_length(tokens, tokens, config.max_match);
  const size_t global_length = reference_match_length(global, tokens, config.max_match);
  const bool own_first = own_length >= global_length;
  Tokens draft = own_first ? reference_continuation(tokens, tokens, own_length, config, max_tokens)
                           : reference_continuation(global, tokens, global_length, config, max_tokens);
  if (draft.empty()) {
    draft = own_first ? reference_continuation(global, tokens, global_length, config, max_tokens)
                      : reference_continuation(tokens, tokens, own_length, config, max_tokens);
  }
  return draft;
}

Tokens random_tokens(std::mt19937& rng, size_t size, int32_t vocab) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  Tokens tokens(size);
  for (int32_t& t : tokens) t = token(rng);
  return tokens;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(SuffixDrafter, ProposesTheContinuationOfAPhraseRepeatedInTheSequence) {
  SuffixDrafter drafter;
  EXPECT_EQ(drafter.propose(1, Tokens{1, 2, 3, 4, 5, 9, 8, 1, 2, 3}, 3), (Tokens{4, 5, 9}));
  EXPECT_TRUE(drafter.propose(1, Tokens{1, 2, 3, 4, 5, 9, 8, 1, 2, 3}, 0).empty());
  EXPECT_TRUE(drafter.propose(2, Tokens{1, 2, 3, 4, 5}, 3).empty());
}

TEST(SuffixDrafter, ProposesTheMostFrequentContinuation) {
  SuffixDrafter drafter;
  // "1 2" went on to 7 twice and to 8 once.
  EXPECT_EQ(drafter.propose(1, Tokens{1, 2, 7, 3, 1, 2, 7, 4, 1, 2, 8, 5, 1, 2}, 1), (Tokens{7}));
}

TEST(SuffixDrafter, StopsWhereTheContinuationShareFallsBelowMinShare) {
  // "1 2 3" always went on to 4, then to one of 11 tokens: each 1/11 of the time, below 0.1.
  Tokens tokens;
  for (int32_t next = 20; next <= 30; ++next) tokens = concat(tokens, {1, 2, 3, 4, next});
  tokens = concat(tokens, {1, 2, 3});
  EXPECT_EQ(SuffixDrafter().propose(1, tokens, 5), (Tokens{4}));
  EXPECT_EQ(SuffixDrafter({.min_share = 0.05f}).propose(1, tokens, 5), (Tokens{4, 20, 1, 2, 3}));
  // With only weak guesses nothing is proposed at all.
  EXPECT_TRUE(SuffixDrafter().propose(1, concat(tokens, {4}), 5).empty());
}

TEST(SuffixDrafter, LearnsAFinishedOutputAndProposesItForANewSequenceSharingItsPrefix) {
  SuffixDrafter drafter;
  const Tokens prompt = {100, 101}, output = {1, 2, 3, 4, 5, 6};
  drafter.propose(1, concat(prompt, output), 4);
  drafter.finished(1, concat(prompt, output), static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(drafter.indexed_sequences(), 0u);
  EXPECT_EQ(drafter.cached_outputs(), 1u);
  // The output ended after 6: its end stops the guess.
  EXPECT_EQ(drafter.propose(2, Tokens{200, 201, 1, 2, 3}, 10), (Tokens{4, 5, 6}));
  // The prompt is not learned.
  EXPECT_TRUE(drafter.propose(3, Tokens{300, 100}, 10).empty());
}

TEST(SuffixDrafter, PrefersItsOwnSequenceOnEqualMatchesAndTheLongerMatchOtherwise) {
  SuffixDrafter drafter;
  drafter.finished(1, Tokens{7, 1, 2, 4}, 0);
  // Both know "1 2"; the sequence went on to 3, the cached output to 4.
  EXPECT_EQ(drafter.propose(2, Tokens{9, 1, 2, 3, 8, 1, 2}, 1), (Tokens{3}));
  // The cached output knows "7 1 2", the sequence only "1 2".
  EXPECT_EQ(drafter.propose(3, Tokens{9, 1, 2, 3, 7, 1, 2}, 1), (Tokens{4}));
}

TEST(SuffixDrafter, EvictsTheOldestOutputsBeyondMaxCachedOutputs) {
  SuffixDrafter drafter({.max_cached_outputs = 2});
  drafter.finished(1, Tokens{1, 2, 3, 4}, 0);
  drafter.finished(2, Tokens{5, 6, 7, 8}, 0);
  EXPECT_EQ(drafter.propose(10, Tokens{1, 2}, 2), (Tokens{3, 4}));
  drafter.finished(3, Tokens{9, 10, 11, 12}, 0);
  EXPECT_EQ(drafter.cached_outputs(), 2u);
  EXPECT_TRUE(drafter.propose(11, Tokens{1, 2}, 2).empty());
  EXPECT_EQ(drafter.propose(12, Tokens{5, 6}, 2), (Tokens{7, 8}));
  EXPECT_EQ(drafter.propose(13, Tokens{9, 10}, 2), (Tokens{11, 12}));
}

TEST(SuffixDrafter, NeverHoldsMoreThanMaxCachedOutputsAndKeepsTheNewest) {
  SuffixDrafter drafter({.max_cached_outputs = 16});
  for (int32_t i = 0; i < 100; ++i) {
    drafter.finished(i, Tokens{1000 + i, 2000 + i}, 0);
    ASSERT_LE(drafter.cached_outputs(), 16u);
    ASSERT_EQ(drafter.propose(-1, Tokens{1000 + i}, 1), (Tokens{2000 + i}));
  }
  EXPECT_TRUE(drafter.propose(-2, Tokens{1000}, 1).empty());
}

TEST(SuffixDrafter, KeepsOnlyTheFirstMaxCachedOutputTokensOfAnOutput) {
  SuffixDrafter drafter({.max_cached_output_tokens = 3});
  drafter.finished(1, Tokens{1, 2, 3, 4, 5}, 0);
  EXPECT_EQ(drafter.propose(2, Tokens{1, 2}, 3), (Tokens{3}));
  EXPECT_TRUE(drafter.propose(3, Tokens{3, 4}, 3).empty());
}

TEST(SuffixDrafter, RebuildsTheSequenceIndexWhenACallDoesNotExtendIt) {
  SuffixDrafter drafter;
  EXPECT_EQ(drafter.propose(1, Tokens{1, 2, 3, 9, 1, 2, 3}, 1), (Tokens{9}));
  // The same length, other tokens: appending nothing would keep guessing 9.
  EXPECT_EQ(drafter.propose(1, Tokens{5, 6, 7, 8, 5, 6, 7}, 1), (Tokens{8}));
  // Shorter (restarted after preemption), then growing again like a fresh sequence.
  const Tokens restarted = {5, 6, 7, 3, 5, 6, 7, 3, 5};
  EXPECT_TRUE(drafter.propose(1, std::span(restarted).first(3), 2).empty());
  SuffixDrafter fresh;
  for (size_t size = 4; size <= restarted.size(); ++size) {
    const Tokens prefix(restarted.begin(), restarted.begin() + static_cast<ptrdiff_t>(size));
    EXPECT_EQ(drafter.propose(1, prefix, 3), fresh.propose(1, prefix, 3)) << "size " << size;
  }
  EXPECT_EQ(drafter.indexed_sequences(), 1u);
}

// Small vocabularies repeat a lot, which exercises the automaton's clones and the capped context.
TEST(SuffixDrafter, GrowingSequenceAgreesWithBruteForce) {
  std::mt19937 rng(7);
  for (const SuffixDrafterConfig config : {SuffixDrafterConfig{.max_match = 3, .min_share = 0.0f},
                                           SuffixDrafterConfig{.max_match = 5, .min_share = 0.3f},
                                           SuffixDrafterConfig{}}) {
    SuffixDrafter drafter(config);
    const Tokens tokens = random_tokens(rng, 200, 3);
    for (size_t size = 1; size <= tokens.size(); ++size) {
      const Tokens prefix(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(size));
      ASSERT_EQ(drafter.propose(0, prefix, 6), reference_propose(prefix, {}, config, 6))
          << "max_match " << config.max_match << ", size " << size;
    }
  }
}

TEST(SuffixDrafter, CachedOutputsAndOwnSequenceAgreeWithBruteForce) {
  std::mt19937 rng(11);
  const SuffixDrafterConfig config{.max_match = 4, .min_share = 0.2f};
  SuffixDrafter drafter(config);
  std::vector<Tokens> outputs;
  for (int64_t seq = 0; seq < 8; ++seq) {
    const Tokens prompt = random_tokens(rng, 5, 4), output = random_tokens(rng, 30, 4);
    drafter.finished(seq, concat(prompt, output), static_cast<int64_t>(prompt.size()));
    outputs.push_back(output);
  }
  const Tokens tokens = random_tokens(rng, 60, 4);
  for (size_t size = 1; size <= tokens.size(); ++size) {
    const Tokens prefix(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(size));
    ASSERT_EQ(drafter.propose(100, prefix, 5), reference_propose(prefix, outputs, config, 5)) << "size " << size;
  }
}

TEST(SuffixDrafter, ConfigValidationNamesTheField) {
  auto message = [](SuffixDrafterConfig config) -> std::string {
    try {
      config.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message({.max_match = 0}).rfind("max_match must be >= 1", 0), 0u);
  EXPECT_EQ(message({.max_cached_outputs = -1}).rfind("max_cached_outputs must be >= 0", 0), 0u);
  EXPECT_EQ(message({.max_cached_output_tokens = 0}).rfind("max_cached_output_tokens must be >= 1", 0), 0u);
  EXPECT_EQ(message({.min_share = 1.5f}).rfind("min_share must be in [0, 1]", 0), 0u);
  EXPECT_EQ(message({}), "");
  EXPECT_THROW(SuffixDrafter({.max_match = 0}), Error);
}

}  // namespace
}  // namespace tessera
