// tuner/nsga2_module.cpp: libtessera_nsga2.so, pagmo2's NSGA-II over integer decision vectors.
#include "tuner/nsga2_module.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>

#include <pagmo/algorithms/nsga2.hpp>
#include <pagmo/population.hpp>
#include <pagmo/problem.hpp>
#include <pagmo/types.hpp>

namespace {

using tessera::tuner::Nsga2Request;

// pagmo copies problems; the request outlives the search, so a pointer to it is all they hold.
struct IntegerProblem {
  const Nsga2Request* request = nullptr;

  pagmo::vector_double fitness(const pagmo::vector_double& x) const {
    std::vector<int64_t> choice(x.size());
    for (size_t i = 0; i < x.size(); ++i) choice[i] = std::clamp<int64_t>(std::llround(x[i]), 0, request->upper[i]);
    const std::array<double, 3> f = (*request->fitness)(choice);
    return {f[0], f[1], f[2]};
  }
  std::pair<pagmo::vector_double, pagmo::vector_double> get_bounds() const {
    pagmo::vector_double lb(request->upper.size(), 0.0), ub;
    for (int64_t u : request->upper) ub.push_back(static_cast<double>(u));
    return {lb, ub};
  }
  pagmo::vector_double::size_type get_nobj() const { return 3; }
  pagmo::vector_double::size_type get_nix() const { return request->upper.size(); }
  std::string get_name() const { return "tessera tune space"; }
};

}  // namespace

extern "C" int tessera_nsga2_run(const Nsga2Request* request, char* error, size_t error_size) {
  try {
    pagmo::problem problem{IntegerProblem{request}};
    // Mutation at about one axis per child: the axes are few and each choice matters.
    const double mutation = 1.0 / static_cast<double>(request->upper.size());
    pagmo::algorithm algorithm{pagmo::nsga2(request->generations, 0.95, 10.0, mutation, 50.0, request->seed)};
    pagmo::population population{problem, request->population, request->seed};
    population = algorithm.evolve(population);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
  } catch (...) {
    std::snprintf(error, error_size, "unknown exception");
  }
  return 1;
}
