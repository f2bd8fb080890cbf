// tuner/pareto.cpp: dominance, the front, policies, and the pagmo2 NSGA-II problem.
#include "tuner/pareto.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>

#include <pagmo/algorithms/nsga2.hpp>
#include <pagmo/population.hpp>
#include <pagmo/problem.hpp>
#include <pagmo/types.hpp>

#include "common/error.h"

namespace tessera::tuner {

namespace {
std::vector<double> objectives(const Measurement& m) { return {m.latency_ms(), m.quality_loss(), m.memory_mb()}; }
}  // namespace

bool dominates(const Measurement& a, const Measurement& b) {
  if (!a.ok()) return false;
  if (!b.ok()) return true;
  const std::vector<double> oa = objectives(a), ob = objectives(b);
  bool better = false;
  for (size_t i = 0; i < oa.size(); ++i) {
    if (oa[i] > ob[i]) return false;
    better = better || oa[i] < ob[i];
  }
  return better;
}

std::vector<size_t> pareto_front(const std::vector<Measurement>& ms) {
  std::vector<size_t> front;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (!ms[i].ok()) continue;
    bool dominated = false;
    for (size_t j = 0; j < ms.size() && !dominated; ++j) dominated = j != i && dominates(ms[j], ms[i]);
    if (!dominated) front.push_back(i);
  }
  return front;
}

PolicyChoice choose(const std::vector<Measurement>& ms, const Policy& policy, const Measurement& reference) {
  TESSERA_CHECK(reference.ok(), "policy: the reference candidate " << reference.candidate.key() << " failed: "
                                                                   << reference.error);
  const bool encoder = reference.decode.empty();
  std::vector<size_t> eligible;
  std::ostringstream why;
  why.precision(4);
  switch (policy.kind) {
    case Policy::Kind::kFastestDecodeWithinPplPct: {
      TESSERA_CHECK(!encoder, "policy: " << policy.describe() << " needs a decoder's perplexity; for an encoder use "
                                                                "fastest_within_cosine");
      const double limit = reference.perplexity * (1.0 + policy.value / 100.0);
      for (size_t i = 0; i < ms.size(); ++i) {
        if (ms[i].ok() && ms[i].perplexity <= limit) eligible.push_back(i);
      }
      why << "fastest decode of " << eligible.size() << " candidates within " << policy.value
          << "% of the reference perplexity " << reference.perplexity;
      break;
    }
    case Policy::Kind::kFastestWithinCosine: {
      TESSERA_CHECK(encoder, "policy: " << policy.describe() << " is for encoders; for a decoder use "
                                                              "fastest_decode_within_ppl_pct");
      for (size_t i = 0; i < ms.size(); ++i) {
        if (ms[i].ok() && ms[i].cosine >= policy.value) eligible.push_back(i);
      }
      why << "fastest encode of " << eligible.size() << " candidates with cosine >= " << policy.value
          << " to the reference";
      break;
    }
    case Policy::Kind::kBestQualityWithinMemoryMb: {
      for (size_t i = 0; i < ms.size(); ++i) {
        if (ms[i].ok() && ms[i].memory_mb() <= policy.value) eligible.push_back(i);
      }
      why << "best quality of " << eligible.size() << " candidates within " << policy.value << " MiB";
      break;
    }
  }
  TESSERA_CHECK(!eligible.empty(), "policy: no measured candidate meets " << policy.describe());
  const bool by_quality = policy.kind == Policy::Kind::kBestQualityWithinMemoryMb;
  const auto better = [&](size_t a, size_t b) {
    const Measurement &x = ms[a], &y = ms[b];
    const double primary_x = by_quality ? x.quality_loss() : x.latency_ms();
    const double primary_y = by_quality ? y.quality_loss() : y.latency_ms();
    if (primary_x != primary_y) return primary_x < primary_y;
    if (x.memory_mb() != y.memory_mb()) return x.memory_mb() < y.memory_mb();
    return by_quality ? x.latency_ms() < y.latency_ms() : x.quality_loss() < y.quality_loss();
  };
  const size_t best = *std::min_element(eligible.begin(), eligible.end(), better);
  return PolicyChoice{best, why.str()};
}

// ---------------------------------------------------------------- NSGA-II

namespace {

// pagmo copies problems, so the state they share lives behind a pointer.
struct SearchState {
  const TuneSpace* space = nullptr;
  const std::function<Measurement(const Candidate&)>* evaluate = nullptr;
  std::vector<size_t> axes;  // the axes with a choice (pagmo refuses a variable whose bounds are equal)
};

struct TuneProblem {
  std::shared_ptr<SearchState> state;

  pagmo::vector_double fitness(const pagmo::vector_double& x) const {
    const std::vector<int64_t> sizes = state->space->axis_sizes();
    std::vector<int64_t> choice(sizes.size(), 0);
    for (size_t i = 0; i < state->axes.size(); ++i) {
      const size_t axis = state->axes[i];
      choice[axis] = std::clamp<int64_t>(std::llround(x[i]), 0, sizes[axis] - 1);
    }
    const Measurement m = (*state->evaluate)(state->space->at(choice));
    if (!m.ok()) {
      const double worst = std::numeric_limits<double>::max() / 4;
      return {worst, worst, worst};
    }
    return {m.latency_ms(), m.quality_loss(), m.memory_mb()};
  }
  std::pair<pagmo::vector_double, pagmo::vector_double> get_bounds() const {
    const std::vector<int64_t> sizes = state->space->axis_sizes();
    pagmo::vector_double lb(state->axes.size(), 0.0), ub;
    for (size_t axis : state->axes) ub.push_back(static_cast<double>(sizes[axis] - 1));
    return {lb, ub};
  }
  pagmo::vector_double::size_type get_nobj() const { return 3; }
  pagmo::vector_double::size_type get_nix() const { return state->axes.size(); }
  std::string get_name() const { return "tessera tune space"; }
};

}  // namespace

int64_t nsga2_budget(const TuneSpace& space) {
  return std::min<int64_t>(space.size(), static_cast<int64_t>(space.search.population) *
                                             (static_cast<int64_t>(space.search.generations) + 1));
}

void nsga2_search(const TuneSpace& space, const std::function<Measurement(const Candidate&)>& evaluate) {
  auto state = std::make_shared<SearchState>();
  state->space = &space;
  state->evaluate = &evaluate;
  const std::vector<int64_t> sizes = space.axis_sizes();
  for (size_t axis = 0; axis < sizes.size(); ++axis) {
    if (sizes[axis] > 1) state->axes.push_back(axis);
  }
  if (state->axes.empty()) {  // one candidate: nothing to search
    evaluate(space.at_index(0));
    return;
  }
  pagmo::problem problem{TuneProblem{state}};
  // Mutation at about one axis per child: the axes are few and each choice matters.
  const double mutation = 1.0 / static_cast<double>(state->axes.size());
  pagmo::algorithm algorithm{pagmo::nsga2(static_cast<unsigned>(space.search.generations), 0.95, 10.0, mutation, 50.0,
                                          space.search.seed)};
  pagmo::population population{problem, static_cast<pagmo::population::size_type>(space.search.population),
                               space.search.seed};
  population = algorithm.evolve(population);
}

}  // namespace tessera::tuner
