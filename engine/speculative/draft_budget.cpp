// engine/speculative/draft_budget.cpp: DraftAcceptance, StepCosts and draft_counts (see
// draft_budget.h).
#include "engine/speculative/draft_budget.h"

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace tessera {

namespace {

// How much a verify's outcome counts against the one before it: recent behaviour rules.
constexpr float kDecay = 0.8f;
// How much of its verifies' weight a step that skipped a sequence's drafts leaves. After two misses
// from the prior (a rate of 0.21), about 11 such steps bring the rate back to 0.29, where one draft
// pays alone on two CPU cores: a sequence whose drafts always miss verifies one every 12 steps or
// so, about 2% more time there.
constexpr float kSkipDecay = 0.95f;
// How much a served step's time moves its size's once the size has 20 served steps: the last 20 or
// so count. Before, each counts as much as the rest: the first replaces warm-up's time, which a
// GPU shared with another process (two servers warming up together) can make several times off.
constexpr double kObservedWeight = 0.05;

struct Candidate {
  float value;  // the chance the draft is kept: rate^j for a sequence's j-th
  size_t offer;
};

}  // namespace

// The step's drafts, likeliest first, for as long as its expected tokens per unit of cost go up.
std::vector<int32_t> draft_counts(std::span<const DraftOffer> offers, int32_t rows, const StepCosts& costs) {
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < offers.size(); ++i) {
    float value = 1.0f;
    for (int32_t j = 0; j < offers[i].drafts; ++j) candidates.push_back({value *= offers[i].rate, i});
  }
  // Most likely kept first; a sequence's later drafts are never likelier than its earlier ones, so
  // each sequence's taken drafts stay a prefix.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.value > b.value; });
  double expected_tokens = rows;
  double best_yield = rows / costs.relative(rows);
  size_t best = 0;
  for (size_t n = 1; n <= candidates.size(); ++n) {
    expected_tokens += candidates[n - 1].value;
    const double yield = expected_tokens / costs.relative(rows + static_cast<int32_t>(n));
    if (yield > best_yield) {
      best_yield = yield;
      best = n;
    }
  }
  std::vector<int32_t> counts(offers.size(), 0);
  for (size_t n = 0; n < best; ++n) ++counts[candidates[n].offer];
  return counts;
}

void DraftAcceptance::record(int32_t kept, int32_t drafted) {
  kept_ = kept_ * kDecay + static_cast<float>(kept);
  rejected_ = rejected_ * kDecay + (kept < drafted ? 1.0f : 0.0f);
}

void DraftAcceptance::skip() {
  kept_ *= kSkipDecay;
  rejected_ *= kSkipDecay;
}

StepCosts::StepCosts(double row_share) : row_share_(row_share) {
  TESSERA_CHECK(row_share >= 0.0, "step costs: a row's share of an untimed step must be >= 0, got " << row_share);
}

StepCosts::StepCosts(std::vector<int32_t> rows, std::vector<double> seconds)
    : rows_(std::move(rows)), seconds_(std::move(seconds)) {
  TESSERA_CHECK(rows_.size() == seconds_.size(), "step costs: " << rows_.size() << " sizes, " << seconds_.size()
                                                                 << " times");
  TESSERA_CHECK(!rows_.empty() && rows_.front() == 1 && std::is_sorted(rows_.begin(), rows_.end()),
                "step costs: the sizes must ascend from 1");
  TESSERA_CHECK(seconds_.front() > 0.0, "step costs: a one-row step took no time");
  observed_.assign(rows_.size(), 0);
}

double StepCosts::relative(int32_t rows) const {
  if (rows <= 1) return 1.0;
  if (rows_.empty()) return (1.0 + row_share_ * rows) / (1.0 + row_share_);
  const auto next = std::lower_bound(rows_.begin(), rows_.end(), rows);
  if (next != rows_.end()) return seconds_[static_cast<size_t>(next - rows_.begin())] / seconds_.front();
  const size_t last = rows_.size() - 1;
  if (last == 0) return 1.0;
  const double slope = (seconds_[last] - seconds_[last - 1]) / (rows_[last] - rows_[last - 1]);
  return (seconds_[last] + std::max(slope, 0.0) * (rows - rows_[last])) / seconds_.front();
}

void StepCosts::observe(int32_t rows, double seconds) {
  if (rows < 1 || seconds <= 0.0) return;
  const auto size = std::lower_bound(rows_.begin(), rows_.end(), rows);
  if (size == rows_.end()) return;
  const auto i = static_cast<size_t>(size - rows_.begin());
  ++observed_[i];
  seconds_[i] += std::max(kObservedWeight, 1.0 / observed_[i]) * (seconds - seconds_[i]);
}

}  // namespace tessera
