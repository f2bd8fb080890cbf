// kernels/cuda/sampling/sampling.h: token sampling on the GPU for the decode loop, so that only the
// sampled ids (and requested logprobs) come back to the host each step. Host code includes this; the
// kernel lives in sampling.cuh, instantiated in sampling.cu. Every call is thread-safe (no state);
// errors come back as cudaError_t.
//
// Semantics are engine/sampler/sampler.h's (vLLM's order): raw logprobs recorded -> repetition penalty
// (over prompt and generated tokens: positive logits divided, negative multiplied) -> presence and
// frequency penalties (over generated tokens) -> greedy argmax (lowest id on ties) if temperature is 0,
// else temperature -> top-k (ties with the k-th value kept) -> top-p (the shortest run, most likely
// first and lower id first on ties, whose mass reaches top_p) -> min-p -> one draw: the kept tokens
// in id order with weights exp(logit - max), the first whose cumulative weight exceeds
// uniform * total. Logprobs are of the raw distribution (log_softmax of the logits as given).
//
// Results equal the CPU Sampler's except where a top-p boundary or a draw's target falls within about
// 1e-6 of the total mass of a cumulative sum (weights here are fp32 exps summed exactly in 2^-40 fixed
// point; the CPU sums in fp64), and for NaN logits. Deterministic: a given input gives the same output.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::kernels::cuda {

// One row's settings, as SamplingParams validates them (temperature >= 0, top_p in (0, 1], min_p in
// [0, 1], repetition_penalty > 0).
struct SamplingRowParams {
  float temperature = 1.f;         // 0: greedy
  int32_t top_k = 0;               // <= 0 (or >= vocab): off
  float top_p = 1.f;               // >= 1: off
  float min_p = 0.f;               // <= 0: off
  float repetition_penalty = 1.f;  // 1: off
  float presence_penalty = 0.f, frequency_penalty = 0.f;
  // In [0, 1), drawn by the host from the request's seeded RNG (the CPU Sampler's u, rounded to
  // float); greedy rows ignore it. Values >= 1 act as just below 1.
  float uniform = 0.f;
  // -1: no logprobs (SampledRow::logprob is NaN); 0..20: the chosen token's logprob plus this many
  // most likely alternatives.
  int32_t num_top_logprobs = -1;
  // This row's range in penalty_tokens / penalty_counts.
  int32_t penalty_begin = 0, penalty_end = 0;
};

inline constexpr int kMaxTopLogprobs = 20;
// The largest vocabulary sample_rows takes (2^18: Gemma's 256k fits; the fixed-point masses cannot
// overflow and one block scan covers the row's chunks).
inline constexpr int kMaxSamplingVocab = 1 << 18;

struct SampledRow {
  int32_t token;
  float logprob;  // log p(token) under the raw distribution; NaN without logprobs
  // The num_top_logprobs most likely tokens, most likely first (ties: lower id first); the rest
  // -1 / NaN.
  int32_t top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

enum class LogitsType : int32_t { kF32 = 0, kBF16 = 1, kFP16 = 2 };

// Device scratch sample_rows needs: an fp32 copy of each row that has penalties.
size_t sampling_workspace_bytes(int rows, int vocab);

// Samples one token per row of logits [rows, row_stride] (the first vocab entries of each row). The
// penalty tokens of row r are penalty_tokens[params[r].penalty_begin .. penalty_end), each listed at
// most once, with penalty_counts the times it was generated (0: seen in the prompt only). Repetition
// applies to every listed token, presence and frequency where the count is > 0. penalty_counts may be
// null (all 0). One CTA per row; a row that is greedy with no logprobs and no penalties is a single
// argmax pass, the common case kept cheap.
cudaError_t sample_rows(LogitsType type, const void* logits, int64_t row_stride, int rows, int vocab,
                        const SamplingRowParams* params,  // device [rows]
                        const int32_t* penalty_tokens,    // device
                        const int32_t* penalty_counts,    // device, or null
                        void* workspace, size_t workspace_bytes,
                        SampledRow* out,  // device [rows]
                        cudaStream_t stream);

// Tests and debugging: sample_rows, and also each row's final logits into filtered [rows, vocab]:
// after penalties, temperature, top-k, top-p and min-p, masked tokens -infinity (greedy rows: after
// penalties), i.e. what the CPU Sampler's transforms leave.
cudaError_t sample_rows_with_filtered(LogitsType type, const void* logits, int64_t row_stride, int rows, int vocab,
                                      const SamplingRowParams* params, const int32_t* penalty_tokens,
                                      const int32_t* penalty_counts, void* workspace, size_t workspace_bytes,
                                      SampledRow* out, float* filtered, cudaStream_t stream);

// Constrained decoding: for each i < num_rows, logits row rows[i] keeps only the tokens whose bit is
// set in bitmask row i (ceil(vocab / 32) int32 words, bit t % 32 of word t / 32); the others become
// a very negative finite logit (probability 0 after exp), in place. Device pointers.
cudaError_t mask_disallowed_tokens(LogitsType type, void* logits, int64_t row_stride, int vocab, const int32_t* rows,
                                   int num_rows, const int32_t* bitmask, cudaStream_t stream);

// Names the first unsupported value ("vocab must be in [1, 262144], got 0"), or "" when the call is
// valid.
std::string sampling_unsupported(int rows, int vocab, int64_t row_stride, size_t workspace_bytes);

}  // namespace tessera::kernels::cuda
