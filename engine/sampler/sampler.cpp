// engine/sampler/sampler.cpp: Sampler (see sampler.h).
#include "engine/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace tessera {

namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();

// Descending logit, then ascending id: a total order, so results never depend on the sort's
// implementation.
struct ByLogitDesc {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  }
};

float max_logit(std::span<const float> logits) {
  float m = kMasked;
  for (float x : logits) m = std::max(m, x);
  return m;
}

double log_sum_exp(std::span<const float> logits) {
  const float m = max_logit(logits);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - m);
  return double(m) + std::log(sum);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt_tokens, int32_t vocab_size)
    : params_(params), vocab_size_(vocab_size) {
  params_.validate();
  TESSERA_CHECK(vocab_size > 0, "vocab_size must be > 0, got " << vocab_size);
  for (size_t i = 0; i < params_.stop_token_ids.size(); ++i) {
    TESSERA_CHECK(params_.stop_token_ids[i] < vocab_size, "stop_token_ids[" << i << "] must be < vocab size "
                                                                             << vocab_size << ", got "
                                                                             << params_.stop_token_ids[i]);
  }
  if (params_.seed) {
    seed_ = *params_.seed;
  } else {
    std::random_device rd;
    seed_ = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  }
  rng_.seed(seed_);
  if (params_.repetition_penalty != 1.0f) {
    seen_.assign(size_t(vocab_size), 0);
    for (int32_t t : prompt_tokens) {
      TESSERA_CHECK(t >= 0 && t < vocab_size, "prompt token id must be in [0, " << vocab_size << "), got " << t);
      if (!seen_[size_t(t)]) {
        seen_[size_t(t)] = 1;
        seen_ids_.push_back(t);
      }
    }
  }
}

void Sampler::record_generated(int32_t token) {
  TESSERA_CHECK(token >= 0 && token < vocab_size_, "token id must be in [0, " << vocab_size_ << "), got " << token);
  ++num_generated_;
  if (!seen_.empty() && !seen_[size_t(token)]) {
    seen_[size_t(token)] = 1;
    seen_ids_.push_back(token);
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) ++generated_counts_[token];
}

void Sampler::apply_penalties(std::span<float> logits) const {
  if (params_.repetition_penalty != 1.0f) {
    const float r = params_.repetition_penalty;
    for (int32_t t : seen_ids_) {
      float& x = logits[size_t(t)];
      x = x > 0.0f ? x / r : x * r;
    }
  }
  for (const auto& [token, count] : generated_counts_) {
    logits[size_t(token)] -= params_.frequency_penalty * float(count) + params_.presence_penalty;
  }
}

void Sampler::apply_temperature(std::span<float> logits, float temperature) {
  if (temperature == 1.0f || temperature <= 0.0f) return;
  const float inv = 1.0f / temperature;
  for (float& x : logits) x *= inv;
}

void Sampler::apply_top_k(std::span<float> logits, int32_t top_k) {
  if (top_k <= 0 || size_t(top_k) >= logits.size()) return;
  std::vector<float> values(logits.begin(), logits.end());
  std::nth_element(values.begin(), values.begin() + (top_k - 1), values.end(), std::greater<float>());
  const float kth = values[size_t(top_k - 1)];
  // Ties with the k-th value are kept, as vLLM and HF do.
  for (float& x : logits) {
    if (x < kth) x = kMasked;
  }
}

void Sampler::apply_top_p(std::span<float> logits, float top_p) {
  if (top_p >= 1.0f) return;
  // Bucket the tokens by distance below the largest logit, walk the buckets from the top until
  // their mass reaches top_p, and sort only the bucket where it does. Same result as a full sort
  // (buckets are ordered by logit), at O(vocab) instead of O(vocab log vocab): a full sort of a
  // 50k-150k vocabulary per token would cost more than the rest of the sampler.
  constexpr int kBuckets = 1024;
  constexpr double kBucketsPerUnit = 32.0;  // buckets cover logits within 32 of the max (e^-32 ~ 1e-14)
  const float m = max_logit(logits);
  if (m == kMasked) return;
  std::vector<double> mass(kBuckets, 0.0);
  std::vector<uint16_t> bucket_of(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == kMasked) continue;
    const double below = double(m) - double(logits[i]);
    const int b = int(std::min<double>(kBuckets - 1, below * kBucketsPerUnit));
    bucket_of[i] = uint16_t(b);
    const double w = std::exp(-below);
    mass[size_t(b)] += w;
    total += w;
  }
  const double target = double(top_p) * total;
  double cum = 0.0;
  int boundary = 0;
  while (boundary < kBuckets - 1 && cum + mass[size_t(boundary)] < target) cum += mass[size_t(boundary++)];
  std::vector<int32_t> ids;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != kMasked && bucket_of[i] == boundary) ids.push_back(int32_t(i));
  }
  std::sort(ids.begin(), ids.end(), ByLogitDesc{logits.data()});
  size_t keep = ids.size();
  for (size_t j = 0; j < ids.size(); ++j) {
    cum += std::exp(double(logits[size_t(ids[j])]) - m);
    if (cum >= target) {  // the token that reaches top_p is kept
      keep = j + 1;
      break;
    }
  }
  for (size_t j = keep; j < ids.size(); ++j) logits[size_t(ids[j])] = kMasked;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != kMasked && bucket_of[i] > boundary) logits[i] = kMasked;
  }
}

void Sampler::apply_min_p(std::span<float> logits, float min_p) {
  if (min_p <= 0.0f) return;
  const float m = max_logit(logits);
  // p_i < min_p * p_max  <=>  exp(l_i - l_max) < min_p
  for (float& x : logits) {
    if (x != kMasked && std::exp(double(x) - m) < double(min_p)) x = kMasked;
  }
}

std::vector<TokenLogprob> Sampler::top_logprobs(std::span<const float> logits, int32_t n) {
  std::vector<TokenLogprob> out;
  if (n <= 0) return out;
  const double lse = log_sum_exp(logits);
  const size_t count = std::min(size_t(n), logits.size());
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(count), ids.end(), ByLogitDesc{logits.data()});
  out.reserve(count);
  for (size_t j = 0; j < count; ++j) out.push_back({ids[j], float(double(logits[size_t(ids[j])]) - lse)});
  return out;
}

int32_t Sampler::argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  }
  return best;
}

void Sampler::mask_until(std::vector<int32_t> tokens, int32_t until_generated) {
  for (int32_t t : tokens) {
    TESSERA_CHECK(t >= 0 && t < vocab_size_, "sampler: masked token id must be in [0, " << vocab_size_ << "), got " << t);
  }
  masked_ = std::move(tokens);
  masked_until_ = until_generated;
}

SampledToken Sampler::sample(std::span<float> logits) {
  TESSERA_CHECK(logits.size() == size_t(vocab_size_),
                "sampler: expected " << vocab_size_ << " logits, got " << logits.size());
  return accept(sample_on_host(logits, spec()));
}

StreamTokenLogprob score_token(std::span<const float> logits, int32_t token, int32_t top_n) {
  StreamTokenLogprob out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - log_sum_exp(logits));
  for (const TokenLogprob& alt : Sampler::top_logprobs(logits, top_n)) out.top.emplace_back(alt.token, alt.logprob);
  return out;
}

namespace {

// Repetition, then frequency and presence penalties (vLLM's order). A token with count 0 is in the
// prompt only: the repetition penalty touches it, the others do not.
void apply_spec_penalties(std::span<float> logits, const SampleSpec& spec) {
  for (size_t i = 0; i < spec.penalty_tokens.size(); ++i) {
    float& x = logits[size_t(spec.penalty_tokens[i])];
    if (spec.repetition_penalty != 1.0f) x = x > 0.0f ? x / spec.repetition_penalty : x * spec.repetition_penalty;
    const int32_t count = spec.penalty_counts[i];
    if (count > 0) x -= spec.frequency_penalty * float(count) + spec.presence_penalty;
  }
}

// One draw with uniform u from the distribution left after the transforms: walks the kept tokens in
// id order with weights exp(logit - max).
int32_t draw(std::span<const float> logits, double u) {
  const float m = max_logit(logits);
  std::vector<float> weights(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::exp(logits[i] - m);  // exp(-inf) = 0 for masked tokens
    total += weights[i];
  }
  const double target = u * total;
  double cum = 0.0;
  int32_t last_kept = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (weights[i] == 0.0f) continue;
    last_kept = int32_t(i);
    cum += weights[i];
    if (cum > target) return int32_t(i);
  }
  // Rounding can leave target just unreached: the last token with weight takes it.
  return last_kept >= 0 ? last_kept : Sampler::argmax(logits);
}

}  // namespace

SampleOutcome sample_on_host(std::span<float> logits, const SampleSpec& spec) {
  for (int32_t t : spec.masked_tokens) logits[size_t(t)] = kMasked;
  if (!spec.allowed_tokens.empty()) {
    TESSERA_CHECK(spec.allowed_tokens.size() * 32 >= logits.size(),
                  "sample: an allowed-token mask of " << spec.allowed_tokens.size() << " words for " << logits.size()
                                                      << " logits");
    for (size_t t = 0; t < logits.size(); ++t) {
      if (((static_cast<uint32_t>(spec.allowed_tokens[t / 32]) >> (t % 32)) & 1u) == 0) logits[t] = kMasked;
    }
  }
  SampleOutcome out;
  std::vector<float> raw;
  if (spec.num_top_logprobs >= 0) {
    raw.assign(logits.begin(), logits.end());
    for (const TokenLogprob& alt : Sampler::top_logprobs(raw, spec.num_top_logprobs)) {
      out.top.emplace_back(alt.token, alt.logprob);
    }
  }
  apply_spec_penalties(logits, spec);
  if (spec.temperature <= 0.0f) {
    out.token = Sampler::argmax(logits);
  } else {
    Sampler::apply_temperature(logits, spec.temperature);
    Sampler::apply_top_k(logits, spec.top_k);
    Sampler::apply_top_p(logits, spec.top_p);
    Sampler::apply_min_p(logits, spec.min_p);
    out.token = draw(logits, spec.uniform);
  }
  out.logprob = spec.num_top_logprobs >= 0 ? float(double(raw[size_t(out.token)]) - log_sum_exp(raw))
                                           : std::numeric_limits<float>::quiet_NaN();
  return out;
}

double Sampler::draw_uniform() { return params_.greedy() ? 0.0 : double(rng_() >> 11) * 0x1.0p-53; }

SampleSpec Sampler::spec() {
  SampleSpec spec;
  spec.temperature = params_.greedy() ? 0.0f : params_.temperature;
  spec.top_k = params_.top_k;
  spec.top_p = params_.top_p;
  spec.min_p = params_.min_p;
  spec.repetition_penalty = params_.repetition_penalty;
  spec.presence_penalty = params_.presence_penalty;
  spec.frequency_penalty = params_.frequency_penalty;
  spec.num_top_logprobs = params_.logprobs ? *params_.logprobs : -1;
  spec.uniform = draw_uniform();  // sample()'s one draw
  // Every token a penalty touches, once: the seen set (repetition) and the generated counts.
  spec_tokens_.assign(seen_ids_.begin(), seen_ids_.end());
  spec_counts_.assign(spec_tokens_.size(), 0);
  for (size_t i = 0; i < spec_tokens_.size(); ++i) {
    auto it = generated_counts_.find(spec_tokens_[i]);
    if (it != generated_counts_.end()) spec_counts_[i] = it->second;
  }
  if (seen_.empty()) {  // no repetition penalty: the generated tokens alone
    for (const auto& [token, count] : generated_counts_) {
      spec_tokens_.push_back(token);
      spec_counts_.push_back(count);
    }
  }
  spec.penalty_tokens = spec_tokens_;
  spec.penalty_counts = spec_counts_;
  if (num_generated_ < masked_until_) spec.masked_tokens = masked_;
  return spec;
}

SampledToken Sampler::accept(const SampleOutcome& outcome) {
  record_generated(outcome.token);
  SampledToken out;
  out.token = outcome.token;
  out.logprob = params_.logprobs ? outcome.logprob : std::numeric_limits<float>::quiet_NaN();
  for (const auto& [token, logprob] : outcome.top) out.top_logprobs.push_back({token, logprob});
  return out;
}

}  // namespace tessera
