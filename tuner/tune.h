// tuner/tune.h: run_tune, the whole of `tessera tune`: measure the space (exhaustively or by NSGA-II),
// resuming from DIR/candidates.jsonl, find the front, apply the policy, and write DIR/profile.yaml,
// DIR/report.html and DIR/table.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::tuner {

struct TuneOptions {
  std::string model;
  std::string space_path;
  std::string out_dir;
  bool progress = true;  // the progress bar on stderr
  // --random-weights [--seed N]: `model` is a folder with only config.json; its weights are drawn
  // from the seed (latency and memory only: quality is not measurable).
  std::optional<uint64_t> random_weights_seed;
};

struct TuneSummary {
  int64_t candidates = 0;
  int64_t measured = 0;  // this run (the rest were resumed)
  std::string chosen_key;
  std::string profile_path;
  double wall_seconds = 0.0;
};

// Prints the table and the choice on stdout. Throws tessera::Error for a bad space or model.
TuneSummary run_tune(const TuneOptions& options);

}  // namespace tessera::tuner
