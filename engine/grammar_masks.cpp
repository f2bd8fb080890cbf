// engine/grammar_masks.cpp: GrammarMasks (see grammar_masks.h).
#include "engine/grammar_masks.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "engine/grammar/grammar.h"

namespace tessera {

GrammarMasks::GrammarMasks(int32_t threads) {
  TESSERA_CHECK(threads >= 1, "grammar masks: threads must be >= 1, got " << threads);
  for (int32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

GrammarMasks::~GrammarMasks() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool GrammarMasks::start(const StepPlan& plan, int32_t words) {
  TESSERA_CHECK(!running_, "grammar masks: start() again before wait()");
  std::lock_guard<std::mutex> lock(mutex_);
  matchers_.clear();
  job_rows_.clear();
  row_job_.assign(plan.rows.size(), -1);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (plan.rows[i].grammar == nullptr || !plan.rows[i].sample) continue;
    row_job_[i] = static_cast<int32_t>(matchers_.size());
    matchers_.push_back(plan.rows[i].grammar);
    job_rows_.push_back(i);
  }
  if (matchers_.empty()) return false;
  words_ = words;
  bits_.resize(matchers_.size() * static_cast<size_t>(words));
  restricts_.assign(matchers_.size(), 1);
  next_job_ = 0;
  jobs_done_ = 0;
  running_ = true;
  started_ = std::chrono::steady_clock::now();
  wake_.notify_all();
  return true;
}

void GrammarMasks::wait() {
  if (!running_) return;
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return jobs_done_ == matchers_.size(); });
  running_ = false;
}

std::span<const int32_t> GrammarMasks::mask(size_t row) const {
  if (row >= row_job_.size() || row_job_[row] < 0) return {};
  const auto job = static_cast<size_t>(row_job_[row]);
  if (!restricts_[job]) return {};
  return std::span<const int32_t>(bits_).subspan(job * static_cast<size_t>(words_), static_cast<size_t>(words_));
}

void GrammarMasks::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || next_job_ < matchers_.size(); });
    if (stopping_) return;
    const size_t job = next_job_++;
    lock.unlock();
    fill(job);
    lock.lock();
    if (++jobs_done_ == matchers_.size()) {
      last_fill_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      done_.notify_all();
    }
  }
}

void GrammarMasks::fill(size_t job) {
  std::span<int32_t> row = std::span<int32_t>(bits_).subspan(job * static_cast<size_t>(words_),
                                                             static_cast<size_t>(words_));
  // A matcher that throws leaves its row allowing nothing: the sampler then fails that row alone.
  try {
    restricts_[job] = matchers_[job]->fill_next_token_bitmask(row) ? 1 : 0;
  } catch (const std::exception&) {
    std::fill(row.begin(), row.end(), 0);
    restricts_[job] = 1;
  }
}

}  // namespace tessera
