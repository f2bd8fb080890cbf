// tests/unit/speculative/draft_budget_test.cpp: DraftAcceptance, StepCosts and draft_counts, how
// many drafts a step verifies.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "engine/speculative/draft_budget.h"

namespace tessera {
namespace {

using Counts = std::vector<int32_t>;

// What the H100 timed at warm-up for SmolLM2's decode steps of 1-8 rows, in ms.
StepCosts h100_costs() {
  return StepCosts({1, 2, 3, 4, 5, 6, 7, 8}, {0.578, 0.597, 0.638, 0.670, 0.691, 0.713, 0.736, 0.764});
}

Counts alone(const DraftAcceptance& acceptance, int32_t drafts) {
  const DraftOffer offer{drafts, acceptance.rate()};
  return draft_counts({&offer, 1}, 1, h100_costs());
}

TEST(DraftBudget, ANewSequenceAloneVerifiesEveryDraftItHas) {
  const DraftAcceptance fresh;
  EXPECT_EQ(alone(fresh, 4), (Counts{4}));
  EXPECT_EQ(alone(fresh, 1), (Counts{1}));
  EXPECT_EQ(alone(fresh, 0), (Counts{0}));
}

TEST(DraftBudget, MissesShrinkALoneSequencesDraftsToOneAndNeverToNone) {
  DraftAcceptance acceptance;
  int32_t previous = alone(acceptance, 7)[0];
  for (int verify = 0; verify < 30; ++verify) {
    acceptance.record(0, previous);
    const int32_t drafts = alone(acceptance, 7)[0];
    EXPECT_LE(drafts, previous) << "verify " << verify;
    previous = drafts;
  }
  EXPECT_EQ(previous, 1);
  EXPECT_GE(acceptance.rate(), 0.1f);
  EXPECT_LT(acceptance.rate(), 0.11f);
}

TEST(DraftBudget, StepsThatSkipASequencesDraftsLetItsRateDriftBackToThePrior) {
  DraftAcceptance acceptance;
  acceptance.record(0, 1);
  acceptance.record(0, 1);
  const float after_misses = acceptance.rate();
  EXPECT_NEAR(after_misses, 0.6f / 2.8f, 1e-6f);
  for (int step = 0; step < 11; ++step) acceptance.skip();
  EXPECT_GT(acceptance.rate(), 0.29f);
  for (int step = 0; step < 200; ++step) acceptance.skip();
  EXPECT_NEAR(acceptance.rate(), 0.6f, 1e-3f);
}

TEST(DraftBudget, DraftsThatLandBringTheLengthBack) {
  DraftAcceptance acceptance;
  for (int verify = 0; verify < 20; ++verify) acceptance.record(0, 1);
  for (int verify = 0; verify < 3; ++verify) acceptance.record(4, 4);
  EXPECT_GT(acceptance.rate(), 0.6f);
  EXPECT_EQ(alone(acceptance, 4), (Counts{4}));
}

TEST(DraftBudget, StepCostsPadToTheNextMeasuredSizeAndExtendTheLastSlope) {
  const StepCosts costs({1, 2, 4, 8}, {1.0, 1.1, 1.2, 1.6});
  EXPECT_DOUBLE_EQ(costs.relative(1), 1.0);
  EXPECT_DOUBLE_EQ(costs.relative(3), 1.2);
  EXPECT_DOUBLE_EQ(costs.relative(5), 1.6);
  EXPECT_DOUBLE_EQ(costs.relative(12), 1.6 + 0.1 * 4);
  EXPECT_DOUBLE_EQ(StepCosts().relative(2), 1.8 / 1.4);  // untimed: a fixed part and 0.4 of it a row
  EXPECT_DOUBLE_EQ(StepCosts().relative(5), 3.0 / 1.4);
  EXPECT_THROW(StepCosts({2, 4}, {1.0, 1.1}), Error);
  EXPECT_THROW(StepCosts({1, 2}, {1.0}), Error);
}

TEST(DraftBudget, ServedStepsMoveTheirSizesTimeTowardWhatTheyTook) {
  StepCosts costs({1, 2, 4}, {1.0, 1.1, 1.2});
  costs.observe(3, 1.8);  // 3 rows run as the 4-row step: the first served one replaces warm-up's
  EXPECT_DOUBLE_EQ(costs.relative(4), 1.8);
  costs.observe(4, 1.6);  // then the served ones average
  EXPECT_DOUBLE_EQ(costs.relative(4), 1.7);
  for (int step = 0; step < 200; ++step) costs.observe(4, 1.8);  // and recent ones rule
  EXPECT_NEAR(costs.relative(4), 1.8, 1e-3);
  EXPECT_DOUBLE_EQ(costs.relative(2), 1.1);
  costs.observe(5, 9.0);  // past the largest size: no size to move
  EXPECT_NEAR(costs.relative(4), 1.8, 1e-3);
  StepCosts untimed;
  untimed.observe(2, 5.0);
  EXPECT_DOUBLE_EQ(untimed.relative(2), 1.8 / 1.4);
}

TEST(DraftBudget, OnACpuFewDraftsPayBesideOtherSequences) {
  const StepCosts cpu;  // untimed
  // Alone, a draft kept half the time pays (2 rows: 1.29x the time for 1.5x the tokens), a second
  // does not (3 rows: 1.57x for 1.75x).
  EXPECT_EQ(draft_counts(std::vector<DraftOffer>{{4, 0.5f}}, 1, cpu), Counts{1});
  // Beside three other sequences the step makes 2.15 tokens in a one-row step's time, and a draft
  // row adds 0.29 of that time for half a token.
  const std::vector<DraftOffer> offers(4, DraftOffer{4, 0.5f});
  EXPECT_EQ(draft_counts(offers, 4, cpu), Counts(4, 0));
}

TEST(DraftBudget, DraftsThatWouldMoveTheStepToACostlierShapeWaitForLikelierOnes) {
  // Eight decodes fill an 8-row step; any draft moves the step to 16 rows, 18% dearer, and a ninth
  // to 32.
  const StepCosts costs({1, 2, 4, 8, 16, 32}, {1.0, 1.09, 1.2, 1.4, 1.65, 2.3});
  const std::vector<DraftOffer> unlikely(8, DraftOffer{2, 0.15f});
  EXPECT_EQ(draft_counts(unlikely, 8, costs), Counts(8, 0));
  const std::vector<DraftOffer> likely(8, DraftOffer{2, 0.6f});
  EXPECT_EQ(draft_counts(likely, 8, costs), Counts(8, 1));  // 16 rows: the second drafts would need 32
}

TEST(DraftBudget, TheLikeliestDraftsGoFirstAndEachSequenceKeepsAPrefix) {
  // One row more costs 0.1 a row: a draft pays while its chance beats what the step makes a row.
  const StepCosts costs({1, 2, 3, 4, 5, 6, 7}, {1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6});
  const std::vector<DraftOffer> offers = {{3, 0.9f}, {3, 0.1f}};
  EXPECT_EQ(draft_counts(offers, 2, costs), (Counts{3, 0}));
}

}  // namespace
}  // namespace tessera
