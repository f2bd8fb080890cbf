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
  drafts_.clear();
  first_mask_.clear();
  row_job_.assign(plan.rows.size(), -1);
  size_t masks = 0;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& row = plan.rows[i];
    if (row.grammar == nullptr || !row.sample) continue;
    row_job_[i] = static_cast<int32_t>(matchers_.size());
    matchers_.push_back(row.grammar);
    drafts_.push_back(std::span<const int32_t>(row.tokens).subspan(1, static_cast<size_t>(row.num_draft)));
    first_mask_.push_back(masks);
    masks += 1 + static_cast<size_t>(row.num_draft);
  }
  if (matchers_.empty()) return false;
  words_ = words;
  bits_.resize(masks * static_cast<size_t>(words));
  restricts_.assign(masks, 1);
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
  return mask(row, static_cast<int32_t>(drafts_[static_cast<size_t>(row_job_[row])].size()));
}

std::span<const int32_t> GrammarMasks::mask(size_t row, int32_t position) const {
  if (row >= row_job_.size() || row_job_[row] < 0) return {};
  const size_t m = first_mask_[static_cast<size_t>(row_job_[row])] + static_cast<size_t>(position);
  if (!restricts_[m]) return {};
  return std::span<const int32_t>(bits_).subspan(m * static_cast<size_t>(words_), static_cast<size_t>(words_));
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
  const std::span<const int32_t> drafts = drafts_[job];
  try {
    GrammarMatcher& matcher = *matchers_[job];
    int32_t walked = 0;
    for (size_t j = 0; j <= drafts.size(); ++j) {
      fill_mask(matcher, first_mask_[job] + j);
      if (j == drafts.size()) break;
      // The scheduler checked that the grammar accepts the drafts.
      if (!matcher.accept_token(drafts[j])) throw Error("a draft the grammar refuses");
      ++walked;
    }
    matcher.rollback(walked);
  } catch (const std::exception&) {
    // A matcher that throws leaves its row allowing nothing: the sampler then fails that row alone,
    // never emitting what the grammar forbids.
    const auto words = static_cast<size_t>(words_);
    const auto first = bits_.begin() + static_cast<std::ptrdiff_t>(first_mask_[job] * words);
    std::fill(first, first + static_cast<std::ptrdiff_t>((drafts.size() + 1) * words), 0);
    std::fill_n(restricts_.begin() + static_cast<std::ptrdiff_t>(first_mask_[job]), drafts.size() + 1, 1);
  }
}

// Bit t of the mask is set when token t may come next.
void GrammarMasks::fill_mask(GrammarMatcher& matcher, size_t mask) {
  const std::span<int32_t> row = std::span<int32_t>(bits_).subspan(mask * static_cast<size_t>(words_),
                                                                   static_cast<size_t>(words_));
  restricts_[mask] = matcher.fill_next_token_bitmask(row) ? 1 : 0;
}

}  // namespace tessera
