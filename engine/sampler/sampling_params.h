// engine/sampler/sampling_params.h: SamplingParams, one request's decoding settings, validated where
// it is built (the HTTP/gRPC front ends map the error to 400 / INVALID_ARGUMENT).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct SamplingParams {
  // Logits are divided by temperature; 0 means greedy (argmax after penalties). [0, 100].
  float temperature = 1.0f;
  // Keep the k most likely tokens; 0 or -1 disables. >= -1.
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability reaches top_p. (0, 1].
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p times the most likely token's. [0, 1].
  float min_p = 0.0f;
  // HF/vLLM: over prompt and generated tokens, positive logits are divided by it and negative ones
  // multiplied. 1 disables. (0, 10].
  float repetition_penalty = 1.0f;
  // OpenAI: over generated tokens, logit -= presence_penalty * (count > 0) +
  // frequency_penalty * count. 0 disables. [-2, 2] each.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Seeds the request's RNG (std::mt19937_64): the same seed and prompt give the same tokens on the
  // same build and backend. Unset: drawn from std::random_device when the Sampler is built.
  std::optional<uint64_t> seed;
  // Most tokens to generate. >= 1, or 0 for a request that only scores its prompt (prompt_logprobs
  // set): the prompt is run and nothing is generated.
  int32_t max_tokens = 16;
  // Fewest tokens to generate: until then every token that would stop the sequence (the EOS ids
  // below and the model's, stop_token_ids) is masked out of the distribution (so logprobs are of
  // the masked one) and stop strings are not looked for. [0, max_tokens].
  int32_t min_tokens = 0;
  // Generation stops when the text contains one of these; the output ends before the match
  // (unless include_stop_str_in_output). Each non-empty; at most 16.
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  // Generation stops after one of these tokens; its text is not output. Each >= 0.
  std::vector<int32_t> stop_token_ids;
  // End generation like the model's EOS ids (ModelConfig::eos_token_ids): a chat template's
  // end-of-turn token when it is not the model's EOS. Their text is never output. Each >= 0.
  std::vector<int32_t> eos_token_ids;
  // Keep generating after the model's EOS ids and eos_token_ids (stop_token_ids still stop).
  bool ignore_eos = false;
  // The output text leaves out special (control) tokens, as HF's decode(skip_special_tokens=True).
  // False keeps them: a tool format whose marker is a control token (Mistral's [TOOL_CALLS]).
  bool skip_special_tokens = true;
  // Return each sampled token's logprob and this many most likely alternatives; unset: none.
  // [0, 20]. Logprobs are of the raw model distribution (log_softmax of the logits before
  // penalties, temperature and truncation), as vLLM reports by default.
  std::optional<int32_t> logprobs;
  // Return the logprob of every prompt token after the first (under the distribution its prefix
  // gives) and this many most likely alternatives; unset: none. [0, 20]. Such a request computes
  // every prompt position's logits and does not reuse cached prompt blocks.
  std::optional<int32_t> prompt_logprobs;

  static constexpr int32_t kMaxLogprobs = 20;
  static constexpr size_t kMaxStopStrings = 16;

  // Throws tessera::Error naming the first invalid field and its allowed range, e.g.
  // "top_p must be in (0, 1], got 1.5".
  void validate() const;
  bool greedy() const { return temperature == 0.0f; }
};

}  // namespace tessera
