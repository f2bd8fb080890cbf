// tuner/progress.h: ProgressBar, one line on stderr for a long tune: done / total, the candidate being
// measured, and an ETA from the mean time of the candidates measured so far. On a terminal it
// redraws in place; otherwise (CI logs) it prints a line per candidate.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tessera::tuner {

class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled);
  void set_total(int64_t total);
  void begin(const std::string& label);  // a candidate starts
  void measured();                       // ... and was measured (counts toward the ETA)
  void resumed();                        // a candidate taken from an earlier run
  void finish();

  // "1:05", "12s": for ETAs.
  static std::string duration_text(double seconds);

 private:
  void draw(const std::string& label);

  using Clock = std::chrono::steady_clock;
  int64_t total_ = 0;
  int64_t done_ = 0;
  int64_t measured_ = 0;
  double measured_seconds_ = 0.0;
  bool enabled_ = true;
  bool tty_ = false;
  Clock::time_point started_;
  std::string label_;
};

}  // namespace tessera::tuner
