// engine/generation.cpp: Generator (see generation.h).
#include "engine/generation.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "engine/sampler/sampler.h"
#include "models/config/model_mask_policy.h"

namespace tessera {

namespace {

int32_t default_num_blocks(const CausalLm& model, const GeneratorConfig& config) {
  if (config.num_blocks > 0) return config.num_blocks;
  const int64_t context = model.config().max_position_embeddings;
  TESSERA_CHECK(context >= 1, "generator: num_blocks is 0 and the model gives no max_position_embeddings");
  return static_cast<int32_t>((context + config.block_size - 1) / config.block_size);
}

KvCacheManagerConfig kv_config(const CausalLm& model, const GeneratorConfig& config) {
  config.validate();
  KvCacheManagerConfig c;
  c.block_size = config.block_size;
  c.num_blocks = default_num_blocks(model, config);
  c.prefix_caching = config.prefix_caching;
  return c;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void GeneratorConfig::validate() const {
  TESSERA_CHECK(block_size >= 1 && block_size <= 1024, "generator: block_size must be in [1, 1024], got " << block_size);
  TESSERA_CHECK(num_blocks >= 0, "generator: num_blocks must be >= 0 (0: sized from the model), got " << num_blocks);
  TESSERA_CHECK(prefill_chunk >= 0, "generator: prefill_chunk must be >= 0 (0: whole prompt), got " << prefill_chunk);
}

Generator::Generator(CausalLm& model, Backend& backend, GeneratorConfig config, std::span<const RankShard> followers)
    : model_(model),
      config_(config),
      kv_(kv_config(model, config)),
      executor_(model, backend, kv_.pool().config().num_blocks, kv_.block_size(), followers) {}

StepPlan Generator::plan(std::span<const SequenceInput> batch) {
  TESSERA_CHECK(!batch.empty(), "generator step: empty batch");
  const int64_t context = model_.config().max_position_embeddings;
  StepPlan plan;
  for (const SequenceInput& in : batch) {
    TESSERA_CHECK(!in.tokens.empty(), "generator step: sequence " << in.id << " has no tokens this step");
    auto it = sequences_.find(in.id);
    if (it == sequences_.end()) {
      TESSERA_CHECK(in.policy != nullptr, "generator step: new sequence " << in.id << " needs a mask policy");
      it = sequences_.emplace(in.id, SequenceKv{}).first;
      it->second.id = in.id;
      it->second.policy = *in.policy;
    }
    SequenceKv& seq = it->second;
    const int64_t after = seq.num_computed + static_cast<int64_t>(in.tokens.size());
    TESSERA_CHECK(context <= 0 || after <= context, "generator step: sequence " << in.id << " would hold " << after
                                                        << " tokens, over the model's context of " << context);
    StepRow row;
    row.seq = in.id;
    row.start = seq.num_computed;
    row.tokens.assign(in.tokens.begin(), in.tokens.end());
    seq.tokens.insert(seq.tokens.end(), in.tokens.begin(), in.tokens.end());
    kv_.allocate(seq, static_cast<int64_t>(in.tokens.size()));
    const std::span<const int32_t> table = kv_.block_table(seq);
    row.block_table.assign(table.begin(), table.end());
    row.policy = &seq.policy;
    row.all_logits = in.all_logits;
    row.num_draft = in.num_draft;
    plan.rows.push_back(std::move(row));
  }
  return plan;
}

std::vector<std::vector<float>> Generator::step(std::span<const SequenceInput> batch, Tensor* earlier) {
  const Tensor logits = forward(batch, earlier);
  const std::vector<float> flat = executor_.backend().download(logits);
  const size_t vocab = static_cast<size_t>(logits.dim(1));
  std::vector<std::vector<float>> out(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) out[i].assign(flat.begin() + i * vocab, flat.begin() + (i + 1) * vocab);
  return out;
}

Tensor Generator::forward(std::span<const SequenceInput> batch, Tensor* earlier) {
  const StepPlan step = plan(batch);
  const Tensor logits = executor_.forward(step, earlier);
  // Only now, with the forward issued, do the new full blocks hold their K/V; a forward that threw
  // cached nothing.
  for (const StepRow& row : step.rows) kv_.commit(sequences_.at(row.seq));
  return logits;
}

void Generator::release(SeqId id) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  kv_.release(it->second);
  sequences_.erase(it);
}

void Generator::truncate(SeqId id, int64_t tokens) {
  SequenceKv& seq = sequences_.at(id);
  TESSERA_CHECK(tokens >= 0 && tokens <= seq.num_computed,
                "generator: sequence " << id << " holds " << seq.num_computed << " tokens, cannot keep " << tokens);
  kv_.truncate(seq, tokens);
  seq.tokens.resize(static_cast<size_t>(tokens));
}

GenerationResult Generator::generate(const GenerationRequest& request, const std::function<bool(int32_t)>& on_token) {
  TESSERA_CHECK(!request.prompt.empty(), "generate: the prompt has no tokens");
  request.sampling.validate();
  const ModelConfig& mc = model_.config();
  const int64_t context = mc.max_position_embeddings;
  TESSERA_CHECK(context <= 0 || static_cast<int64_t>(request.prompt.size()) < context,
                "generate: the prompt has " << request.prompt.size() << " tokens; the model's context is "
                                            << context);
  const MaskPolicy policy = resolve_mask_policy(request.attention, mc, static_cast<int64_t>(request.prompt.size()));
  Sampler sampler(request.sampling, request.prompt, static_cast<int32_t>(mc.vocab_size));

  const SeqId id = next_request_id_++;
  struct Release {  // frees the sequence's blocks however generate() ends
    Generator* self;
    SeqId id;
    ~Release() { self->release(id); }
  } release_guard{this, id};

  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  const size_t chunk = config_.prefill_chunk > 0 ? static_cast<size_t>(config_.prefill_chunk) : request.prompt.size();
  for (size_t pos = 0; pos < request.prompt.size(); pos += chunk) {
    const size_t n = std::min(chunk, request.prompt.size() - pos);
    const SequenceInput in{id, std::span<const int32_t>(request.prompt).subspan(pos, n), &policy};
    logits = std::move(step(std::span<const SequenceInput>(&in, 1))[0]);
  }
  std::chrono::steady_clock::time_point first_token_time;
  int64_t num_tokens = static_cast<int64_t>(request.prompt.size());
  while (true) {
    const int32_t token = sampler.sample(logits).token;
    result.tokens.push_back(token);
    if (result.tokens.size() == 1) {
      first_token_time = std::chrono::steady_clock::now();
      result.ttft_ms = ms_since(t0);
    }
    if (!on_token(token)) {
      result.stopped_by_callback = true;
      break;
    }
    if (static_cast<int32_t>(result.tokens.size()) >= request.sampling.max_tokens) {
      result.hit_max_tokens = true;
      break;
    }
    if (context > 0 && num_tokens + 1 > context) {
      result.hit_context_limit = true;
      break;
    }
    const SequenceInput in{id, std::span<const int32_t>(&result.tokens.back(), 1), &policy};
    logits = std::move(step(std::span<const SequenceInput>(&in, 1))[0]);
    ++num_tokens;
  }
  result.total_ms = ms_since(t0);
  const double decode_ms = ms_since(first_token_time);
  if (result.tokens.size() > 1 && decode_ms > 0.0) {
    result.decode_tokens_per_s = static_cast<double>(result.tokens.size() - 1) / (decode_ms / 1000.0);
  }
  return result;
}

}  // namespace tessera
