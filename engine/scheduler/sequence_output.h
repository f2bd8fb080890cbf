// engine/scheduler/sequence_output.h: SequenceOutput, what one generate request does around each
// token: the step's sampling settings (the request's Sampler, seeded), then with the token sampled,
// incremental detokenizing, stop checks (StopChecker: stop ids, EOS, stop strings, max_tokens; plus the context limit) and turn the
// result into a StreamEvent delta. It lives as long as the request, across preemptions, so recompute
// never re-emits text and the RNG and penalties carry on where they were.
//
// Thread safety: none. The engine thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/sampler/sampler.h"
#include "engine/sampler/stop_checker.h"
#include "engine/scheduler/request.h"
#include "models/config/model_config.h"
#include "models/tokenizer/tokenizer.h"

namespace tessera {

class SequenceOutput {
 public:
  // tokenizer must outlive this object.
  SequenceOutput(const SamplingParams& params, std::span<const int32_t> prompt, const ModelConfig& config,
                 const Tokenizer& tokenizer);

  struct Advance {
    int32_t token = -1;
    StreamEvent delta;  // the token, its text so far and logprob; never final
    std::optional<RequestFinishReason> finish;  // kStop or kLength when the sequence is over
  };
  // A step samples with spec() (on the device, or on the host with sample_on_host), then
  // advance_sampled() takes the outcome. context_full: the sequence now fills the model's context,
  // so it ends with "length" if nothing else stopped it.
  SampleSpec spec() { return sampler_.spec(); }
  double draft_uniform() { return sampler_.draw_uniform(); }  // a speculative draft position's draw
  Advance advance_sampled(const SampleOutcome& outcome, bool context_full);

  int32_t num_generated() const { return num_generated_; }

 private:
  Advance emit(const SampledToken& sampled, bool context_full);

  Sampler sampler_;
  IncrementalDecoder decoder_;
  StopChecker stop_;
  int32_t num_generated_ = 0;
};

}  // namespace tessera
