// engine/scheduler/sequence_output.h: SequenceOutput, what one generate request does with each
// next-token distribution: sample it (the request's Sampler, seeded), detokenize incrementally, check
// stops (StopChecker: stop ids, EOS, stop strings, max_tokens; plus the context limit) and turn the
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
  // Samples from logits[vocab] (used as scratch). context_full: the sequence now fills the model's
  // context, so it ends with "length" if nothing else stopped it.
  Advance advance(std::span<float> logits, bool context_full);
  // The same with the token sampled where the logits are: spec() for Backend::sample, then
  // advance_sampled() with its outcome.
  SampleSpec spec() { return sampler_.spec(); }
  Advance advance_sampled(const SampleOutcome& outcome, bool context_full);

  int32_t num_generated() const { return num_generated_; }

  // Prompt logprobs: log p(token) under logits[vocab] (log_softmax) and the top_n most likely
  // tokens, most likely first.
  static StreamTokenLogprob score(std::span<const float> logits, int32_t token, int32_t top_n);

 private:
  Advance emit(const SampledToken& sampled, bool context_full);

  Sampler sampler_;
  IncrementalDecoder decoder_;
  StopChecker stop_;
  int32_t num_generated_ = 0;
};

}  // namespace tessera
