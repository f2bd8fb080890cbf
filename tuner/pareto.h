// tuner/pareto.h: the Pareto front of measured candidates (latency x quality loss x memory, all
// minimised), the space's policy picking one point, and the NSGA-II search (pagmo2) for spaces too
// large to measure whole. Plain functions of their inputs, so they are tested without measuring.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tuner/measure.h"
#include "tuner/space.h"

namespace tessera::tuner {

// a dominates b: no worse in every objective and better in one. Failed measurements dominate nothing
// and are dominated by every measured point.
bool dominates(const Measurement& a, const Measurement& b);

// Indices of the non-dominated measured candidates, in input order.
std::vector<size_t> pareto_front(const std::vector<Measurement>& measurements);

struct PolicyChoice {
  size_t index = 0;    // into the measurements
  std::string reason;  // "fastest decode (3.10 ms) of 4 within 1% of the reference perplexity 17.20"
};

// Picks the point the policy asks for; `reference` is the most precise candidate's measurement.
// Ties go to the smaller memory, then the lower quality loss. Throws naming the policy when no
// candidate qualifies or the policy does not fit the model (perplexity for an encoder).
PolicyChoice choose(const std::vector<Measurement>& measurements, const Policy& policy, const Measurement& reference);

// NSGA-II over the space's axes (integer decision variables): calls `evaluate` for the candidates it
// visits (callers memoise; a repeated candidate must cost nothing) and returns when done.
void nsga2_search(const TuneSpace& space, const std::function<Measurement(const Candidate&)>& evaluate);

// How many evaluations nsga2_search asks for at most (for the progress bar).
int64_t nsga2_budget(const TuneSpace& space);

}  // namespace tessera::tuner
