// tuner/nsga2_module.h: the entry point of libtessera_nsga2.so, the one piece of the tuner that uses
// pagmo2. pagmo's static initialisers allocate ~15 MB and touch ~20 MB of its library at process
// start, so `tessera serve` does not link it: nsga2_search (tuner/pareto.cpp) opens this module with
// dlopen only when a space is too large to measure whole. Only standard types cross the boundary.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

namespace tessera::tuner {

// Objectives of one decision vector (all minimised).
using Nsga2Fitness = std::function<std::array<double, 3>(const std::vector<int64_t>& choice)>;

struct Nsga2Request {
  std::vector<int64_t> upper;  // choice i runs over 0..upper[i] (every upper >= 1)
  unsigned generations = 0;
  unsigned population = 0;     // a multiple of 4, >= 8 (pagmo's NSGA-II)
  unsigned seed = 0;
  const Nsga2Fitness* fitness = nullptr;
};

inline constexpr const char* kNsga2ModuleName = "libtessera_nsga2.so";
inline constexpr const char* kNsga2EntryPoint = "tessera_nsga2_run";

}  // namespace tessera::tuner

// Runs the search; returns 0, or 1 with what failed written to `error` (NUL-terminated). Exceptions
// never cross the module boundary.
extern "C" int tessera_nsga2_run(const tessera::tuner::Nsga2Request* request, char* error, size_t error_size);
