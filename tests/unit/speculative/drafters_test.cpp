// tests/unit/speculative/drafters_test.cpp: the draft-free drafters, NgramDrafter (prompt lookup) and
// SuffixDrafter (suffix decoding), on small hand-made token sequences.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/speculative/ngram_drafter.h"

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
  NgramDrafter min_two({.min_n = 2, .max_n = 4});
  EXPECT_TRUE(min_two.propose(0, tokens, 3).empty());
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
  NgramDrafter drafter({.min_n = 3, .max_n = 4});
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
  EXPECT_EQ(message({}), "");
  EXPECT_THROW(NgramDrafter({.min_n = 0}), Error);
}

}  // namespace
}  // namespace tessera
