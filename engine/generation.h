// engine/generation.h: Generator, steps chosen by the caller: which tokens each sequence appends in
// each step. It is the engine's KV bookkeeping (KvCacheManager) and an Executor without a
// scheduler: for the CLI's single request (generate()), benchmarks, the tuner and tests that compare
// backends step by step. The serving engine plans its steps with the Scheduler instead.
//
// Thread safety: none. One thread owns a Generator.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/executor.h"
#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/sampler/sampling_params.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/mask_policy.h"
#include "models/model.h"

namespace tessera {

struct GeneratorConfig {
  int32_t block_size = 16;       // tokens per KV block
  int32_t num_blocks = 0;        // KV blocks in the pool; 0: enough for one max_position_embeddings sequence
  int32_t prefill_chunk = 0;     // > 0: generate() prefills prompts in chunks of this many tokens
  bool prefix_caching = true;    // keep full blocks after their sequence ends and reuse them (prefix_cache_key.h)

  void validate() const;  // throws naming the field
};

struct GenerationRequest {
  std::vector<int32_t> prompt;             // token ids, non-empty
  SamplingParams sampling;
  std::optional<MaskPolicy> attention;     // none: the model's default policy
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, the stopping token included
  int64_t prompt_tokens = 0;
  double ttft_ms = 0.0;         // request start to first token sampled (prefill + first sample)
  double total_ms = 0.0;
  double decode_tokens_per_s = 0.0;  // tokens after the first, over the time after the first
  bool stopped_by_callback = false;  // on_token asked to stop (EOS, stop string, ...)
  bool hit_max_tokens = false;
  bool hit_context_limit = false;
};

class Generator {
 public:
  // `followers`: a tensor-parallel model's other ranks (Executor).
  Generator(CausalLm& model, Backend& backend, GeneratorConfig config, std::span<const RankShard> followers = {});

  // One sequence's work in a step: `tokens` are appended after what it already has.
  struct SequenceInput {
    SeqId id = 0;
    std::span<const int32_t> tokens;  // >= 1
    const MaskPolicy* policy = nullptr;  // used when the sequence is new; required then
    // Also compute the logits of every row before its last (prompt logprobs): see `earlier`.
    bool all_logits = false;
    // The last num_draft tokens are a speculative verify's drafts (all_logits must be set): the
    // forward runs the row as the engine runs a verify.
    int32_t num_draft = 0;
  };
  // One forward for the whole batch; returns the next-token logits of each sequence's last token,
  // f32[batch.size()][vocab]. New sequences are registered with their policy. When an input has
  // all_logits and more than one token, `earlier` (required then) receives, on the backend and
  // valid until the next step, the logits of those inputs' rows before their last, in batch order
  // and row order. A step of single-token rows has none, so such a step is still a plain decode
  // step (a captured graph on a GPU).
  std::vector<std::vector<float>> step(std::span<const SequenceInput> batch, Tensor* earlier = nullptr);
  // The same forward, with the logits left on the backend: [batch.size(), vocab], valid until the
  // next step (for Backend::sample).
  Tensor forward(std::span<const SequenceInput> batch, Tensor* earlier = nullptr);
  // Frees a sequence's KV blocks.
  void release(SeqId id);
  // The sequence keeps its first `tokens` positions (a generator without prefix caching: cached
  // blocks cannot be taken back).
  void truncate(SeqId id, int64_t tokens);

  // See Executor::warm_up.
  WarmUpReport warm_up(const WarmUpConfig& config) { return executor_.warm_up(config); }

  // Prefill + decode of one request. on_token(token) is called for every sampled token and returns
  // false to stop (the token it was given is kept). The sequence's blocks are freed at the end.
  GenerationResult generate(const GenerationRequest& request, const std::function<bool(int32_t)>& on_token);

  const KvBlockPool& block_pool() const { return kv_.pool(); }

 private:
  // The plan of one step: each input's tokens appended to its sequence.
  StepPlan plan(std::span<const SequenceInput> batch);

  CausalLm& model_;
  GeneratorConfig config_;
  KvCacheManager kv_;
  Executor executor_;
  std::unordered_map<SeqId, SequenceKv> sequences_;
  SeqId next_request_id_ = 1;
};

}  // namespace tessera
