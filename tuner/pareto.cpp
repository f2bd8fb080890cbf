// tuner/pareto.cpp: dominance, the front, policies, and the NSGA-II search (run by libtessera_nsga2.so).
#include "tuner/pareto.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "common/module.h"
#include "tuner/nsga2_module.h"

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
  if (!reference.quality_measured) {
    // Random weights: no perplexity to stay within; a memory budget still holds.
    const bool budget = policy.kind == Policy::Kind::kBestQualityWithinMemoryMb;
    for (size_t i = 0; i < ms.size(); ++i) {
      if (ms[i].ok() && (!budget || ms[i].memory_mb() <= policy.value)) eligible.push_back(i);
    }
    TESSERA_CHECK(!eligible.empty(), "policy: no measured candidate meets " << policy.describe());
    const auto faster = [&](size_t a, size_t b) {
      if (ms[a].latency_ms() != ms[b].latency_ms()) return ms[a].latency_ms() < ms[b].latency_ms();
      return ms[a].memory_mb() < ms[b].memory_mb();
    };
    const size_t best = *std::min_element(eligible.begin(), eligible.end(), faster);
    why << "quality not measurable (random weights): fastest " << (encoder ? "encode" : "decode") << " of "
        << eligible.size() << " candidates";
    if (budget) why << " within " << policy.value << " MiB";
    return PolicyChoice{best, why.str()};
  }
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

using Nsga2Run = int (*)(const Nsga2Request*, char*, size_t);

// Opened once (common/module.h): pagmo's singletons live as long as the process.
Nsga2Run load_nsga2_module() {
  static Nsga2Run run = [] {
    std::string errors;
    void* entry = open_module(kNsga2ModuleName, kNsga2EntryPoint, &errors);
    TESSERA_CHECK(entry != nullptr,
                  "search: spaces larger than search.exhaustive_max are searched with NSGA-II, which needs "
                      << kNsga2ModuleName << " (built with the tuner, linked to Debian's libpagmo8) beside the "
                      << "tessera binary; lower the space's size or raise search.exhaustive_max to measure it "
                      << "whole. dlopen:" << errors);
    return reinterpret_cast<Nsga2Run>(entry);
  }();
  return run;
}

}  // namespace

int64_t nsga2_budget(const TuneSpace& space) {
  return std::min<int64_t>(space.size(), static_cast<int64_t>(space.search.population) *
                                             (static_cast<int64_t>(space.search.generations) + 1));
}

void nsga2_search(const TuneSpace& space, const std::function<Measurement(const Candidate&)>& evaluate) {
  const std::vector<int64_t> sizes = space.axis_sizes();
  std::vector<size_t> axes;  // the axes with a choice (pagmo refuses a variable whose bounds are equal)
  for (size_t axis = 0; axis < sizes.size(); ++axis) {
    if (sizes[axis] > 1) axes.push_back(axis);
  }
  if (axes.empty()) {  // one candidate: nothing to search
    evaluate(space.at_index(0));
    return;
  }
  const Nsga2Fitness fitness = [&](const std::vector<int64_t>& x) -> std::array<double, 3> {
    std::vector<int64_t> choice(sizes.size(), 0);
    for (size_t i = 0; i < axes.size(); ++i) choice[axes[i]] = x[i];
    const Measurement m = evaluate(space.at(choice));
    if (!m.ok()) {
      const double worst = std::numeric_limits<double>::max() / 4;
      return {worst, worst, worst};
    }
    return {m.latency_ms(), m.quality_loss(), m.memory_mb()};
  };
  Nsga2Request request;
  for (size_t axis : axes) request.upper.push_back(sizes[axis] - 1);
  request.generations = static_cast<unsigned>(space.search.generations);
  request.population = static_cast<unsigned>(space.search.population);
  request.seed = space.search.seed;
  request.fitness = &fitness;
  char error[512] = {};
  TESSERA_CHECK(load_nsga2_module()(&request, error, sizeof error) == 0, "search: NSGA-II failed: " << error);
}

}  // namespace tessera::tuner
