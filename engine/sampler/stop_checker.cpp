// engine/sampler/stop_checker.cpp: StopChecker (see stop_checker.h).
#include "engine/sampler/stop_checker.h"

#include <algorithm>

#include "common/error.h"

namespace tessera {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kNone:
      break;
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, std::vector<int32_t> eos_token_ids)
    : params_(params), eos_token_ids_(std::move(eos_token_ids)) {
  params_.validate();
  eos_token_ids_.insert(eos_token_ids_.end(), params_.eos_token_ids.begin(), params_.eos_token_ids.end());
  if (params_.ignore_eos) eos_token_ids_.clear();
  for (const std::string& s : params_.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
}

bool StopChecker::scan(std::string_view text, StopStep& step, bool hold_partial) {
  held_.append(text);
  // Earliest match wins; among matches at the same place, the first stop string listed.
  size_t best_pos = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : params_.stop) {
    const size_t pos = held_.find(s);
    if (pos < best_pos) {
      best_pos = pos;
      best = &s;
    }
  }
  if (best != nullptr) {
    step.text.append(held_, 0, best_pos);
    if (params_.include_stop_str_in_output) step.text.append(*best);
    step.finish = FinishReason::kStop;
    step.stop_string = *best;
    held_.clear();
    return true;
  }
  // Everything before the longest suffix that begins some stop string can be released: a later
  // match must start inside that suffix, since no earlier position still begins a stop string.
  size_t keep = 0;
  if (hold_partial) {
    for (size_t len = std::min(held_.size(), max_stop_len_); len > 0 && keep == 0; --len) {
      const std::string_view suffix = std::string_view(held_).substr(held_.size() - len);
      for (const std::string& s : params_.stop) {
        if (s.size() > len && std::string_view(s).substr(0, len) == suffix) {
          keep = len;
          break;
        }
      }
    }
  }
  step.text.append(held_, 0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return false;
}

std::vector<int32_t> StopChecker::stopping_ids() const {
  std::vector<int32_t> ids = eos_token_ids_;
  ids.insert(ids.end(), params_.stop_token_ids.begin(), params_.stop_token_ids.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

StopStep StopChecker::append(int32_t token, std::string_view text) {
  TESSERA_CHECK(!finished() && !closed_, "StopChecker: token " << token << " appended after the sequence finished");
  ++num_generated_;
  StopStep step;
  if (num_generated_ <= params_.min_tokens) {
    // Too early to stop: the text (with whatever was held back) goes out unscanned, so a stop
    // string can only match in text generated after min_tokens.
    step.text = std::move(held_);
    held_.clear();
    step.text.append(text);
    if (num_generated_ >= params_.max_tokens) step.finish = FinishReason::kLength;
    finish_reason_ = step.finish;
    return step;
  }
  const bool stop_token = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
                          params_.stop_token_ids.end();
  const bool eos = std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
  if (stop_token || eos) {
    // Held text could not complete a stop string by itself, so it is released; the stop token's own
    // text is output only for stop_token_ids with include_stop_str_in_output (never for EOS).
    step.text = std::move(held_);
    held_.clear();
    if (stop_token && !eos && params_.include_stop_str_in_output) step.text.append(text);
    step.finish = FinishReason::kStop;
    step.stop_token = token;
  } else if (!scan(text, step, /*hold_partial=*/num_generated_ < params_.max_tokens) &&
             num_generated_ >= params_.max_tokens) {
    step.finish = FinishReason::kLength;
  }
  finish_reason_ = step.finish;
  return step;
}

StopStep StopChecker::finish(std::string_view trailing_text) {
  TESSERA_CHECK(!closed_, "StopChecker: finish() called twice");
  closed_ = true;
  StopStep step;
  if (finish_reason_ == FinishReason::kStop) return step;
  if (scan(trailing_text, step, /*hold_partial=*/false)) finish_reason_ = FinishReason::kStop;
  return step;
}

}  // namespace tessera
