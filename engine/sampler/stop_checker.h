// engine/sampler/stop_checker.h: StopChecker, which decides when a sequence finishes (stop token
// ids, EOS, stop strings, max_tokens) and which of its detokenized text may be streamed yet.
//
// Thread safety: none. One StopChecker per sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler/sampling_params.h"

namespace tessera {

enum class FinishReason { kNone, kStop, kLength };
// "stop" / "length" as OpenAI reports them; "" for kNone.
const char* finish_reason_name(FinishReason reason);

struct StopStep {
  std::string text;  // safe to stream now (may be empty)
  FinishReason finish = FinishReason::kNone;
  // What stopped the sequence when finish == kStop: a stop string, or a stop token / EOS id.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
};

// Stop strings are matched on the text, so a match may span tokens ("\n" then "\n" for "\n\n"). Text
// that could be the start of a stop string is held back until it either completes the match (and
// is cut: the output ends before the stop string, as in OpenAI and vLLM) or cannot match any more.
// Precedence on one token: stop token id / EOS, then stop string, then max_tokens. Until
// params.min_tokens tokens are generated nothing but max_tokens stops the sequence.
class StopChecker {
 public:
  // eos_token_ids: the model's EOS ids (ModelConfig::eos_token_ids), to which params.eos_token_ids
  // are added; all of them are ignored when params.ignore_eos.
  StopChecker(const SamplingParams& params, std::vector<int32_t> eos_token_ids);

  // The ids that end the sequence when generated: the EOS ids (unless ignore_eos) and
  // stop_token_ids. What min_tokens masks.
  std::vector<int32_t> stopping_ids() const;

  // One generated token and the text it completed (IncrementalDecoder::push). After a step with
  // finish != kNone the sequence is over; further calls throw tessera::Error.
  StopStep append(int32_t token, std::string_view text);

  // Ends the sequence's text: held-back text plus trailing_text (IncrementalDecoder::finish()),
  // checked for stop strings (a match cuts it and sets finish = kStop). Call it once at the end:
  // after a kLength step (the decoder may hold a partial character) or when the sequence ends for a
  // reason the checker did not see (cancel, deadline; finish stays kNone). After a kStop step it
  // returns nothing: text after a stop is dropped.
  StopStep finish(std::string_view trailing_text = {});

  bool finished() const { return finish_reason_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_reason_; }
  int32_t num_generated() const { return num_generated_; }
  const std::string& held_text() const { return held_; }

 private:
  // Appends text to held_ and cuts at the earliest stop-string match (returns true); else moves
  // into step.text all of held_ except, when hold_partial, its longest suffix that begins a stop
  // string.
  bool scan(std::string_view text, StopStep& step, bool hold_partial);
  size_t max_stop_len_ = 0;

  SamplingParams params_;
  std::vector<int32_t> eos_token_ids_;
  std::string held_;
  int32_t num_generated_ = 0;
  FinishReason finish_reason_ = FinishReason::kNone;
  bool closed_ = false;  // finish() was called
};

}  // namespace tessera
