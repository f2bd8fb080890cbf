// engine/scheduler/sequence_output.cpp: SequenceOutput (see sequence_output.h).
#include "engine/scheduler/sequence_output.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace tessera {

namespace {

std::vector<int32_t> eos_ids(const ModelConfig& config) {
  std::vector<int32_t> ids;
  for (int64_t id : config.eos_token_ids) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

}  // namespace

SequenceOutput::SequenceOutput(const SamplingParams& params, std::span<const int32_t> prompt,
                               const ModelConfig& config, const Tokenizer& tokenizer)
    : sampler_(params, prompt, static_cast<int32_t>(config.vocab_size)),
      decoder_(tokenizer, params.skip_special_tokens),
      stop_(params, eos_ids(config)) {
  if (params.min_tokens > 0) sampler_.mask_until(stop_.stopping_ids(), params.min_tokens);
}

SequenceOutput::Advance SequenceOutput::advance_sampled(const SampleOutcome& outcome, bool context_full) {
  return emit(sampler_.accept(outcome), context_full);
}

SequenceOutput::Advance SequenceOutput::emit(const SampledToken& sampled, bool context_full) {
  ++num_generated_;
  Advance out;
  out.token = sampled.token;
  out.delta.tokens.push_back(sampled.token);
  if (sampler_.params().logprobs.has_value()) {
    StreamTokenLogprob lp;
    lp.token = sampled.token;
    lp.logprob = sampled.logprob;
    for (const TokenLogprob& alt : sampled.top_logprobs) lp.top.emplace_back(alt.token, alt.logprob);
    out.delta.logprobs.push_back(std::move(lp));
  }
  const StopStep step = stop_.append(sampled.token, decoder_.push(sampled.token));
  out.delta.text = step.text;
  if (step.finish == FinishReason::kStop) {
    out.finish = RequestFinishReason::kStop;
  } else if (step.finish == FinishReason::kLength || context_full) {
    // The decoder may hold a partial character and the checker a possible stop-string prefix: both
    // are released now, and a stop string completed by them still wins ("stop").
    const StopStep last = stop_.finish(decoder_.finish());
    out.delta.text += last.text;
    out.finish = last.finish == FinishReason::kStop ? RequestFinishReason::kStop : RequestFinishReason::kLength;
  }
  return out;
}

}  // namespace tessera
