// engine/speculative/draft_acceptance.h: DraftAcceptance, how often a sequence's drafts were kept
// lately, and the draft length that pays best at that rate.
//
// A verify of L drafts costs more than a decode step, but far less than L + 1 of them: at batch 1
// the step reads the weights once whatever its rows. Its expected yield at a per-draft acceptance
// rate a (each draft kept, given the one before was) is 1 + a + ... + a^L tokens. The best L is
// the one with the most tokens per unit of cost, so a sequence whose drafts keep landing verifies
// the most it may, and one whose drafts miss shrinks to one (never to none: a sequence must keep
// verifying to see its rate recover).
//
// Thread safety: none; the scheduler owns one per sequence.
#pragma once

#include <cstdint>

namespace tessera {

class DraftAcceptance {
 public:
  // A verify of `drafted` drafts kept the first `kept` of them.
  void record(int32_t kept, int32_t drafted);
  // The share of drafts kept given the one before them was, over recent verifies (older ones
  // count less); a new sequence starts at 0.6.
  float rate() const { return kept_ / (kept_ + rejected_); }
  // The draft length in [1, max_drafts] with the most expected tokens per unit of step cost.
  int32_t best_length(int32_t max_drafts) const;

 private:
  // Decayed counts of kept drafts and of verifies that ended at a rejected one, starting from a
  // prior that drafts land more often than not.
  float kept_ = 1.5f;
  float rejected_ = 1.0f;
};

}  // namespace tessera
