// tests/unit/speculative/draft_acceptance_test.cpp: DraftAcceptance, the draft length a sequence's
// recent acceptance pays for.
#include <gtest/gtest.h>

#include "engine/speculative/draft_acceptance.h"

namespace tessera {
namespace {

TEST(DraftAcceptance, ANewSequenceVerifiesTheMostItMay) {
  const DraftAcceptance fresh;
  EXPECT_EQ(fresh.best_length(4), 4);
  EXPECT_EQ(fresh.best_length(1), 1);
}

TEST(DraftAcceptance, MissesShrinkTheLengthToOneAndNeverToNone) {
  DraftAcceptance acceptance;
  int32_t previous = acceptance.best_length(7);
  for (int verify = 0; verify < 20; ++verify) {
    acceptance.record(0, previous);
    const int32_t length = acceptance.best_length(7);
    EXPECT_LE(length, previous) << "verify " << verify;
    previous = length;
  }
  EXPECT_EQ(previous, 1);
  EXPECT_LT(acceptance.rate(), 0.05f);
}

TEST(DraftAcceptance, DraftsThatLandBringTheLengthBack) {
  DraftAcceptance acceptance;
  for (int verify = 0; verify < 20; ++verify) acceptance.record(0, 1);
  for (int verify = 0; verify < 3; ++verify) acceptance.record(4, 4);
  EXPECT_EQ(acceptance.best_length(4), 4);
  EXPECT_GT(acceptance.rate(), 0.6f);
}

TEST(DraftAcceptance, ALowRateStopsShortOfTheMaximum) {
  // One draft kept in three verifies, each ending at a miss: a rate near 0.25, where a third draft
  // and later ones add less than they cost.
  DraftAcceptance acceptance;
  for (int verify = 0; verify < 30; ++verify) acceptance.record(verify % 3 == 0 ? 1 : 0, 2);
  EXPECT_NEAR(acceptance.rate(), 0.25f, 0.1f);
  const int32_t length = acceptance.best_length(8);
  EXPECT_GE(length, 1);
  EXPECT_LE(length, 2);
}

}  // namespace
}  // namespace tessera
