// engine/grammar_masks.h: GrammarMasks, the allowed-token bitmasks of a step's constrained rows,
// filled on worker threads while the step's forward runs. The forward takes longer than the masks,
// so constrained rows add nothing to the step's time, and unconstrained rows never wait on them.
//
// Thread safety: start() and wait() on one thread (the executor's). Between them the workers read
// the plan's grammar matchers, which nothing else may touch until wait() returns.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "engine/step_plan.h"

namespace tessera {

class GrammarMasks {
 public:
  explicit GrammarMasks(int32_t threads);  // >= 1
  ~GrammarMasks();
  GrammarMasks(const GrammarMasks&) = delete;
  GrammarMasks& operator=(const GrammarMasks&) = delete;

  // Begins filling the bitmasks of each row of `plan` with a grammar; `words` each. A speculative
  // verify row gets one per position: the grammar walks its drafts (which the scheduler checked it
  // accepts) between them and rolls back after. False (and nothing started) when no row has one.
  bool start(const StepPlan& plan, int32_t words);
  // Waits for what start() began. Afterwards mask(row) is the bitmask of the row's last position
  // (what its sample draws from) and mask(row, j) that of position j; empty when the row has no
  // grammar or its grammar allows every token there.
  void wait();
  std::span<const int32_t> mask(size_t row) const;
  std::span<const int32_t> mask(size_t row, int32_t position) const;
  double last_fill_seconds() const { return last_fill_seconds_; }  // start() to the last mask done

 private:
  void work();
  void fill(size_t job);
  void fill_mask(GrammarMatcher& matcher, size_t mask);

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  bool stopping_ = false;
  size_t next_job_ = 0, jobs_done_ = 0;  // jobs of the step in flight taken and finished
  bool running_ = false;

  std::vector<GrammarMatcher*> matchers_;  // per job
  std::vector<std::span<const int32_t>> drafts_;  // per job: its row's drafts (empty: one position)
  std::vector<size_t> first_mask_;         // per job: its first mask; masks of a job are consecutive
  std::vector<int32_t> bits_;              // [masks, words_]
  std::vector<uint8_t> restricts_;         // per mask: false when every token is allowed
  std::vector<int32_t> row_job_;           // per plan row: its job, or -1
  int32_t words_ = 0;
  std::chrono::steady_clock::time_point started_;
  double last_fill_seconds_ = 0.0;
};

}  // namespace tessera
