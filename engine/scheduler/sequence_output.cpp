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
      decoder_(tokenizer, /*skip_special=*/true),
      stop_(params, eos_ids(config)) {
  if (params.min_tokens > 0) sampler_.mask_until(stop_.stopping_ids(), params.min_tokens);
}

StreamTokenLogprob SequenceOutput::score(std::span<const float> logits, int32_t token, int32_t top_n) {
  float m = -std::numeric_limits<float>::infinity();
  for (float x : logits) m = std::max(m, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - m);
  StreamTokenLogprob out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - (double(m) + std::log(sum)));
  for (const TokenLogprob& alt : Sampler::top_logprobs(logits, top_n)) out.top.emplace_back(alt.token, alt.logprob);
  return out;
}

SequenceOutput::Advance SequenceOutput::advance(std::span<float> logits, bool context_full) {
  return emit(sampler_.sample(logits), context_full);
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
