// tuner/report.h: the tune's outputs for people: report.html (self-contained: inline SVG of latency
// against quality, memory as marker size, the front and the chosen point marked, and a table of every
// candidate; no scripts, no network) and table.md.
#pragma once

#include <string>
#include <vector>

#include "tuner/measure.h"

namespace tessera::tuner {

struct ReportInput {
  std::string model;
  std::string model_sha256;
  std::string device;
  std::string commit;
  std::string space;
  std::string policy;
  std::string reason;
  bool encoder = false;
  std::vector<Measurement> measurements;
  std::vector<size_t> front;  // indices into measurements
  size_t chosen = 0;
  size_t reference = 0;
  double wall_seconds = 0.0;
  // "0.12 / 3.40": the 1-minute load average when the tune started and ended. Wall-clock timings on
  // a machine that other work shares are only as good as it was idle.
  std::string load;
};

std::string report_html(const ReportInput& input);
std::string report_markdown(const ReportInput& input);

}  // namespace tessera::tuner
