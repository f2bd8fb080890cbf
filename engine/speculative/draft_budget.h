// engine/speculative/draft_budget.h: how many of its drafts each sequence of a step verifies.
//
// A step's cost grows slowly with its rows while the GPU reads the weights once for all of them,
// so a draft costs a fraction of a step and pays when it is likely kept. How likely comes from the
// sequence's recent verifies (DraftAcceptance). What rows cost comes from the decode steps warm-up
// timed on this GPU, kept up to date by the served steps' times, or on a backend that times none
// (the CPU) from how a CPU's step grows with its rows (StepCosts). The step's drafts are taken
// likeliest first for as long as the step's expected tokens per unit of its cost go up. Alone, a
// sequence verifies all the drafts it may while they keep landing and fewer as they miss, down to
// one. In a batch, a draft competes with the step's other rows: at 8 decodes on the H100, where one
// draft row moves SmolLM2's step from the 8-row GEMV to a 16-row GEMM (18% dearer), drafts that
// rarely land are not verified; on a CPU, where every row costs about a third of a one-row step,
// few drafts pay beside other sequences.
//
// Thread safety: none; the scheduler owns these.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// How often a sequence's drafts were kept lately.
class DraftAcceptance {
 public:
  // A verify of `drafted` drafts kept the first `kept` of them.
  void record(int32_t kept, int32_t drafted);
  // A step verified none of the drafts the sequence had, its rate being too low for their price:
  // the verifies behind that rate fade a little, so that it drifts back toward the prior and the
  // sequence tries again now and then. Where rows cost more than the prior's floor pays for (a
  // CPU's), a rate that fell would otherwise never be tested again, though the text may start to
  // copy its prompt.
  void skip();
  // The chance a draft is kept once the ones before it were: recent verifies count most, and a
  // prior of 0.6 worth one verify keeps it off 0 (at most 5 verifies' worth of misses outweigh
  // it: the rate stays above 0.1, where a lone sequence's one draft still pays on the H100).
  float rate() const { return (kept_ + kPriorKept) / (kept_ + rejected_ + kPriorWeight); }

 private:
  static constexpr float kPriorKept = 0.6f;
  static constexpr float kPriorWeight = 1.0f;
  float kept_ = 0.0f;      // decayed count of kept drafts
  float rejected_ = 0.0f;  // decayed count of verifies that ended at a rejected draft
};

// A decode step's time by its rows, relative to a one-row step.
class StepCosts {
 public:
  // Untimed (a backend that times no decode steps at warm-up: the CPU): a fixed part that reads the
  // weights, and `row_share` of it for each row. The default is how SmolLM2-135M's decode grew on
  // two CPU cores: 14.9 ms at one row, 4.3 ms a row more, 2.15x at five rows.
  explicit StepCosts(double row_share = kUntimedRowShare);
  // Timed: `seconds[i]` for a step of `rows[i]` rows (ascending, from 1); a step is padded up to
  // the next timed size, and one past the largest costs what the last two sizes' slope gives.
  StepCosts(std::vector<int32_t> rows, std::vector<double> seconds);

  static constexpr double kUntimedRowShare = 0.4;

  double relative(int32_t rows) const;
  bool timed() const { return !rows_.empty(); }
  // A served decode step of `rows` rows took `seconds`, host work included: a timed size's time
  // moves toward it (the first replaces warm-up's, then recent steps weigh most), so that what
  // warm-up's bare steps left out (the host's share, attention over real contexts, another process
  // on the GPU) enters the drafts' price. Ignored untimed and past the largest size.
  void observe(int32_t rows, double seconds);

 private:
  double row_share_ = kUntimedRowShare;  // untimed only
  std::vector<int32_t> rows_;
  std::vector<double> seconds_;
  std::vector<int32_t> observed_;  // served steps seen per size
};

// One speculating sequence's offer: the drafts its drafter gave, and its acceptance rate.
struct DraftOffer {
  int32_t drafts = 0;
  float rate = 0.0f;
};

// How many of each offer's drafts (a prefix) the step verifies, in offer order, for a step of
// `rows` rows before drafts (its decodes).
std::vector<int32_t> draft_counts(std::span<const DraftOffer> offers, int32_t rows, const StepCosts& costs);

}  // namespace tessera
