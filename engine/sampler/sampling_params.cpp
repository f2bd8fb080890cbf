// engine/sampler/sampling_params.cpp: SamplingParams::validate.
#include "engine/sampler/sampling_params.h"

#include <cmath>

#include "common/error.h"

namespace tessera {

namespace {
// Written as !(lo <= x && x <= hi) so NaN fails too.
bool in_closed(float x, float lo, float hi) { return lo <= x && x <= hi; }
}  // namespace

void SamplingParams::validate() const {
  TESSERA_CHECK(in_closed(temperature, 0.0f, 100.0f), "temperature must be in [0, 100], got " << temperature);
  TESSERA_CHECK(top_k >= -1, "top_k must be -1 or 0 (disabled) or >= 1, got " << top_k);
  TESSERA_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got " << top_p);
  TESSERA_CHECK(in_closed(min_p, 0.0f, 1.0f), "min_p must be in [0, 1], got " << min_p);
  TESSERA_CHECK(repetition_penalty > 0.0f && repetition_penalty <= 10.0f,
                "repetition_penalty must be in (0, 10], got " << repetition_penalty);
  TESSERA_CHECK(in_closed(presence_penalty, -2.0f, 2.0f),
                "presence_penalty must be in [-2, 2], got " << presence_penalty);
  TESSERA_CHECK(in_closed(frequency_penalty, -2.0f, 2.0f),
                "frequency_penalty must be in [-2, 2], got " << frequency_penalty);
  TESSERA_CHECK(max_tokens >= 1 || (max_tokens == 0 && prompt_logprobs.has_value()),
                "max_tokens must be >= 1, got " << max_tokens << " (0 only with prompt_logprobs: a prompt-only request)");
  TESSERA_CHECK(min_tokens >= 0 && min_tokens <= max_tokens,
                "min_tokens must be in [0, max_tokens = " << max_tokens << "], got " << min_tokens);
  TESSERA_CHECK(stop.size() <= kMaxStopStrings,
                "stop must hold at most " << kMaxStopStrings << " strings, got " << stop.size());
  for (size_t i = 0; i < stop.size(); ++i) {
    TESSERA_CHECK(!stop[i].empty(), "stop[" << i << "] must be a non-empty string");
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    TESSERA_CHECK(stop_token_ids[i] >= 0, "stop_token_ids[" << i << "] must be >= 0, got " << stop_token_ids[i]);
  }
  for (size_t i = 0; i < eos_token_ids.size(); ++i) {
    TESSERA_CHECK(eos_token_ids[i] >= 0, "eos_token_ids[" << i << "] must be >= 0, got " << eos_token_ids[i]);
  }
  if (prompt_logprobs) {
    TESSERA_CHECK(*prompt_logprobs >= 0 && *prompt_logprobs <= kMaxLogprobs,
                  "prompt_logprobs must be in [0, " << kMaxLogprobs << "], got " << *prompt_logprobs);
  }
  if (logprobs) {
    TESSERA_CHECK(*logprobs >= 0 && *logprobs <= kMaxLogprobs,
                  "logprobs must be in [0, " << kMaxLogprobs << "], got " << *logprobs);
  }
}

}  // namespace tessera
