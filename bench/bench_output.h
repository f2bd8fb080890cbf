// bench/bench_output.h: what the C++ benchmarks share: wall-clock seconds, order statistics of
// repeated runs, and one JSON line per measurement stamped with the commit and the date.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "common/error.h"

namespace tessera::bench {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Stats {
  double median, p90, min, max;
};

// Nearest-rank percentiles, as bench/serve_load.py computes them.
inline Stats stats_of(std::vector<double> v) {
  TESSERA_CHECK(!v.empty(), "no measurements");
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) {
    const size_t r = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()) / 100.0));
    return v[std::clamp<size_t>(r, 1, v.size()) - 1];
  };
  return {rank(50), rank(90), v.front(), v.back()};
}

// Prints `line` with "commit" ($TESSERA_COMMIT, else "unknown") and a UTC "date", and flushes, so a
// run cut short keeps every line it finished.
inline void print_json_line(nlohmann::json line) {
  const char* commit = std::getenv("TESSERA_COMMIT");
  line["commit"] = commit ? commit : "unknown";
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  line["date"] = date;
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

}  // namespace tessera::bench
