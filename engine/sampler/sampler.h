// engine/sampler/sampler.h: Sampler, which turns one sequence's fp32 logits into its next token:
// penalties, temperature, top-k, top-p, min-p, a seeded draw, and raw-distribution logprobs.
//
// Thread safety: none. A Sampler belongs to one sequence; distinct Samplers may run on distinct
// threads.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/sampler/sampling_params.h"
#include "kernels/backend/backend.h"

namespace tessera {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// A token's log-probability under a distribution, and the most likely alternatives when asked for.
struct StreamTokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// log p(token) under logits[vocab] (log_softmax), and the top_n most likely tokens, most likely first.
StreamTokenLogprob score_token(std::span<const float> logits, int32_t token, int32_t top_n);

// One draw from logits[vocab] (overwritten: used as scratch) under a row's settings, exactly as
// Sampler::sample draws: where a backend cannot sample beside its logits, the host does it.
SampleOutcome sample_on_host(std::span<float> logits, const SampleSpec& spec);

struct SampledToken {
  int32_t token = -1;
  // When params.logprobs is set: log p(token) under the raw model distribution, and the
  // params.logprobs most likely tokens under it, most likely first. Otherwise NaN / empty.
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
};

// Order of the transforms, as in vLLM: (raw logprobs recorded) -> repetition penalty -> frequency and
// presence penalties -> greedy argmax if temperature == 0, else temperature -> top-k -> top-p ->
// min-p -> one draw from the renormalised distribution.
//
// Randomness: one std::mt19937_64 per request seeded with params.seed; each draw consumes exactly one
// 64-bit output (u = (x >> 11) * 2^-53 in [0, 1)) and walks the kept tokens in id order with
// weights exp(logit - max) (fp32, summed in fp64), so a sequence's tokens depend only on the seed
// and the logits.
class Sampler {
 public:
  // params must be valid (validate() is called again here); vocab_size > 0; prompt token ids feed the
  // repetition penalty.
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt_tokens, int32_t vocab_size);

  // Picks the next token from logits[vocab_size] (overwritten: used as scratch) and records it as
  // generated, for the penalties.
  SampledToken sample(std::span<float> logits);

  // min_tokens: while fewer than `until_generated` tokens are generated, `tokens` (the ids that
  // would stop the sequence) get probability 0, before anything else, logprobs included.
  void mask_until(std::vector<int32_t> tokens, int32_t until_generated);

  // Records a token produced elsewhere (e.g. a forced or speculative token) for the penalties.
  void record_generated(int32_t token);

  // Sampling where the logits are (Backend::sample): spec() gives this step's settings, drawing the
  // uniform from the request's RNG exactly as sample() would; the spans point into this Sampler and
  // stay valid until accept(). accept() records the token the backend picked.
  SampleSpec spec();
  // The next draw of the request's RNG, in [0, 1) (0 for a greedy request): what spec() puts in
  // SampleSpec::uniform, for rows sampled beside the spec's own (a speculative verify's drafts).
  double draw_uniform();
  SampledToken accept(const SampleOutcome& outcome);

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }
  int32_t num_generated() const { return num_generated_; }

  // The transforms one at a time, in place on logits[vocab]; exposed for tests and for a batched
  // backend that applies them itself. Masked-out tokens become -infinity.
  void apply_penalties(std::span<float> logits) const;
  static void apply_temperature(std::span<float> logits, float temperature);
  static void apply_top_k(std::span<float> logits, int32_t top_k);
  static void apply_top_p(std::span<float> logits, float top_p);
  static void apply_min_p(std::span<float> logits, float min_p);
  // log_softmax of logits, then the n most likely (most likely first, ties: lower id first).
  static std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t n);
  // Index of the largest logit (lowest id on ties).
  static int32_t argmax(std::span<const float> logits);

 private:
  SamplingParams params_;
  int32_t vocab_size_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  int32_t num_generated_ = 0;
  std::vector<uint8_t> seen_;                            // [vocab] in prompt or generated (repetition)
  std::vector<int32_t> seen_ids_;                        // the ids with seen_ set
  std::unordered_map<int32_t, int32_t> generated_counts_;  // token -> times generated
  std::vector<int32_t> spec_tokens_;                     // spec(): penalty tokens and their counts
  std::vector<int32_t> spec_counts_;
  std::vector<int32_t> masked_;            // mask_until's tokens
  int32_t masked_until_ = 0;
};

}  // namespace tessera
