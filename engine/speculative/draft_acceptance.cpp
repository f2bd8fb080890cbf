// engine/speculative/draft_acceptance.cpp: DraftAcceptance (see draft_acceptance.h).
#include "engine/speculative/draft_acceptance.h"

namespace tessera {

namespace {

// A verify's cost in decode steps: 1 + kFirstDraftCost + kNextDraftCost * (L - 1). Measured on the
// H100 at batch 1 (bench/results/2026-11-27-h100-verify-rows): SmolLM2-135M 1.13x a decode step at
// 2 drafts, 1.22x at 4, 1.36x at 7; the 7B shape 1.13x at 4 and 1.26x at 7.
constexpr float kFirstDraftCost = 0.09f;
constexpr float kNextDraftCost = 0.045f;
// How much a verify's outcome counts against the one before it: recent behaviour rules.
constexpr float kDecay = 0.8f;

}  // namespace

void DraftAcceptance::record(int32_t kept, int32_t drafted) {
  kept_ = kept_ * kDecay + static_cast<float>(kept);
  rejected_ = rejected_ * kDecay + (kept < drafted ? 1.0f : 0.0f);
}

int32_t DraftAcceptance::best_length(int32_t max_drafts) const {
  const float a = rate();
  float expected_tokens = 1.0f;  // the token after the last kept draft comes in any case
  float draft_term = 1.0f;
  float best_yield = 0.0f;
  int32_t best = 1;
  for (int32_t length = 1; length <= max_drafts; ++length) {
    draft_term *= a;
    expected_tokens += draft_term;
    const float cost = 1.0f + kFirstDraftCost + kNextDraftCost * static_cast<float>(length - 1);
    if (expected_tokens / cost > best_yield) {
      best_yield = expected_tokens / cost;
      best = length;
    }
  }
  return best;
}

}  // namespace tessera
