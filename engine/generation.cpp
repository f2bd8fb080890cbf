// engine/generation.cpp: Generator (see generation.h).
#include "engine/generation.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "engine/kv_cache/prefix_cache_key.h"
#include "models/config/model_mask_policy.h"

namespace tessera {

namespace {

// RoPE positions of [first, first + n) when the policy numbers tokens other than by index.
std::vector<int32_t> rope_positions_of(const MaskPolicy& policy, int64_t first, int64_t n) {
  std::vector<int32_t> positions;
  if (!policy.parallel_positions) return positions;
  for (int64_t p = first; p < first + n; ++p) positions.push_back(policy.rope_position(static_cast<int32_t>(p)));
  return positions;
}

// Segment index entries kept at most; past it the oldest go.
constexpr size_t kMaxIndexedSegments = 4096;

// Whether a segments policy's segments have K/V that depends only on the shared prefix and their own
// tokens: with no shared prefix a segment sees only itself (and RoPE is relative); with one, only
// when every segment is numbered from its end.
bool segments_reusable(const MaskPolicy& policy) {
  return policy.kind == MaskPolicy::Kind::kSegments && (policy.shared_prefix == 0 || policy.parallel_positions);
}

// [start, end) of segment i.
std::pair<int64_t, int64_t> segment_range(const MaskPolicy& policy, size_t i) {
  int64_t start = policy.shared_prefix;
  for (size_t j = 0; j < i; ++j) start += policy.segment_lengths[j];
  return {start, start + policy.segment_lengths[i]};
}

int32_t default_num_blocks(const CausalLm& model, const GeneratorConfig& config) {
  if (config.num_blocks > 0) return config.num_blocks;
  const int64_t context = model.config().max_position_embeddings;
  TESSERA_CHECK(context >= 1, "generator: num_blocks is 0 and the model gives no max_position_embeddings");
  return static_cast<int32_t>((context + config.block_size - 1) / config.block_size);
}

KvCacheConfig pool_config(const CausalLm& model, const GeneratorConfig& config) {
  config.validate();
  KvCacheConfig c;
  c.block_size = config.block_size;
  c.num_blocks = default_num_blocks(model, config);
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

void WarmUpConfig::validate() const {
  TESSERA_CHECK(max_batch_tokens >= 1, "warm-up: max_batch_tokens must be >= 1, got " << max_batch_tokens);
  TESSERA_CHECK(max_batch_seqs >= 1, "warm-up: max_batch_seqs must be >= 1, got " << max_batch_seqs);
  TESSERA_CHECK(max_context >= 0, "warm-up: max_context must be >= 0 (0: the model's), got " << max_context);
}

Generator::Generator(CausalLm& model, Backend& backend, GeneratorConfig config)
    : model_(model), backend_(backend), config_(config), pool_(pool_config(model, config)) {
  const ModelConfig& mc = model_.config();
  padding_block_ = pool_.config().num_blocks;
  cache_ = backend_.create_kv_cache(mc.num_layers, padding_block_ + 1, pool_.block_size(),
                                    static_cast<int32_t>(mc.num_kv_heads), static_cast<int32_t>(mc.head_dim));
}

Tensor Generator::run(std::span<const AttentionPlan::Sequence> seqs, std::span<const int32_t> packed,
                      std::span<const int32_t> extra_rows) {
  AttentionPlan plan = AttentionPlan::build(seqs, pool_.block_size());
  std::vector<int32_t> rows = plan.last_rows();
  rows.insert(rows.end(), extra_rows.begin(), extra_rows.end());
  ForwardBatch fb;
  fb.token_ids = packed;
  fb.device_token_ids = backend_.prepare_step(plan, packed);
  fb.plan = &plan;
  return backend_.run_step([&] { return model_.forward(fb, &cache_, rows); });
}

AttentionPlan::Sequence Generator::padding_sequence(int32_t q_len, int32_t kv_len) const {
  const size_t blocks = static_cast<size_t>((kv_len + pool_.block_size() - 1) / pool_.block_size());
  TESSERA_CHECK(blocks <= padding_table_.size(), "generator: a padding sequence of " << kv_len
                                                     << " tokens is longer than the warm-up context");
  AttentionPlan::Sequence s;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.policy = &padding_policy_;
  s.block_table = std::span<const int32_t>(padding_table_).first(blocks);
  return s;
}

WarmUpReport Generator::warm_up(const WarmUpConfig& config) {
  config.validate();
  WarmUpReport report;
  if (!backend_.sizes_workspace_at_start()) return report;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t model_context = model_.config().max_position_embeddings;
  const int32_t context = static_cast<int32_t>(config.max_context > 0 ? config.max_context : model_context);
  TESSERA_CHECK(context >= 1, "warm-up: max_context is 0 and the model gives no max_position_embeddings");
  const int32_t max_seqs = std::min(config.max_batch_seqs, config.max_batch_tokens);
  padding_table_.assign(static_cast<size_t>((context + pool_.block_size() - 1) / pool_.block_size()),
                        padding_block_);

  Tensor last;
  // The largest step: one prompt chunk that sees the whole context beside the most decode rows.
  {
    std::vector<AttentionPlan::Sequence> seqs;
    const int32_t chunk = std::min(config.max_batch_tokens - (max_seqs - 1), context);
    seqs.push_back(padding_sequence(chunk, context));
    for (int32_t i = 1; i < max_seqs; ++i) seqs.push_back(padding_sequence(1, 1));
    const std::vector<int32_t> tokens(static_cast<size_t>(chunk + max_seqs - 1), 0);
    last = run(seqs, tokens);
  }

  // Decode shapes, largest first, so that the first one sizes the buffers every graph points into.
  decode_ladder_ = backend_.decode_batch_ladder(max_seqs);
  const int32_t max_blocks = static_cast<int32_t>(padding_table_.size());
  std::vector<int32_t> widths;
  for (int32_t w = 1;; w *= 2) {
    widths.push_back(std::min(w, max_blocks));
    if (w >= max_blocks) break;
  }
  for (auto batch = decode_ladder_.rbegin(); batch != decode_ladder_.rend(); ++batch) {
    for (auto width = widths.rbegin(); width != widths.rend(); ++width) {
      std::vector<AttentionPlan::Sequence> seqs;
      seqs.push_back(padding_sequence(1, (*width - 1) * pool_.block_size() + 1));
      for (int32_t i = 1; i < *batch; ++i) seqs.push_back(padding_sequence(1, 1));
      const std::vector<int32_t> tokens(static_cast<size_t>(*batch), 0);
      for (int pass = 0; pass < 2; ++pass) last = run(seqs, tokens);
      ++report.decode_shapes;
    }
  }
  backend_.download(last.first_rows(1));  // waits for the last step to finish
  report.decode_batches = decode_ladder_;
  report.seconds = ms_since(t0) / 1000.0;
  return report;
}

std::vector<std::vector<float>> Generator::step(std::span<const SequenceInput> batch, Tensor* earlier) {
  const Tensor logits = forward(batch, earlier);
  const std::vector<float> flat = backend_.download(logits);
  const size_t vocab = static_cast<size_t>(logits.dim(1));
  std::vector<std::vector<float>> out(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) out[i].assign(flat.begin() + i * vocab, flat.begin() + (i + 1) * vocab);
  return out;
}

Tensor Generator::forward(std::span<const SequenceInput> batch, Tensor* earlier) {
  TESSERA_CHECK(!batch.empty(), "generator step: empty batch");
  const int64_t context = model_.config().max_position_embeddings;
  std::vector<int32_t> packed;
  for (const SequenceInput& in : batch) {
    TESSERA_CHECK(!in.tokens.empty(), "generator step: sequence " << in.id << " has no tokens this step");
    auto it = sequences_.find(in.id);
    if (it == sequences_.end()) {
      TESSERA_CHECK(in.policy != nullptr, "generator step: new sequence " << in.id << " needs a mask policy");
      register_sequence(in.id, *in.policy, {});
      it = sequences_.find(in.id);
    }
    SequenceState& state = it->second;
    const int64_t after = state.num_tokens + static_cast<int64_t>(in.tokens.size());
    TESSERA_CHECK(context <= 0 || after <= context, "generator step: sequence " << in.id << " would hold " << after
                                                        << " tokens, over the model's context of " << context);
    pool_.allocate(in.id, static_cast<int64_t>(in.tokens.size()));
    state.num_tokens = after;
    if (state.cacheable) state.tokens.insert(state.tokens.end(), in.tokens.begin(), in.tokens.end());
    packed.insert(packed.end(), in.tokens.begin(), in.tokens.end());
  }
  std::vector<AttentionPlan::Sequence> plan_seqs;
  bool decode_only = true;
  for (const SequenceInput& in : batch) {
    const SequenceState& state = sequences_.at(in.id);
    AttentionPlan::Sequence s;
    s.q_len = static_cast<int32_t>(in.tokens.size());
    s.kv_len = static_cast<int32_t>(state.num_tokens);
    s.policy = &state.policy;
    s.block_table = pool_.block_table(in.id);
    plan_seqs.push_back(s);
    decode_only = decode_only && s.q_len == 1;
  }
  // A decode step is padded to the ladder's next batch size, whose graph warm_up captured.
  const auto n = static_cast<int32_t>(batch.size());
  if (decode_only && !decode_ladder_.empty() && n <= decode_ladder_.back()) {
    const int32_t padded = *std::lower_bound(decode_ladder_.begin(), decode_ladder_.end(), n);
    for (int32_t i = n; i < padded; ++i) {
      plan_seqs.push_back(padding_sequence(1, 1));
      packed.push_back(0);
    }
  }
  // Rows before the last of the all_logits inputs; their sequences come first in the packed rows,
  // in batch order, before any padding sequence.
  std::vector<int32_t> extra_rows;
  int32_t row = 0;
  for (const SequenceInput& in : batch) {
    const auto q = static_cast<int32_t>(in.tokens.size());
    if (in.all_logits) {
      for (int32_t r = 0; r + 1 < q; ++r) extra_rows.push_back(row + r);
    }
    row += q;
  }
  TESSERA_CHECK(extra_rows.empty() || earlier != nullptr, "generator step: all_logits needs somewhere to put them");
  const Tensor all = run(plan_seqs, packed, extra_rows);
  Tensor logits = all.first_rows(n);
  if (earlier != nullptr) *earlier = all.rows(n, static_cast<int64_t>(extra_rows.size()));
  // Only now, with the forward issued (a later step reads after it in stream order), do the new
  // full blocks hold their K/V; a forward that threw cached nothing.
  for (const SequenceInput& in : batch) cache_full_blocks(in.id, sequences_.at(in.id));
  return logits;
}

void Generator::release(SeqId id) {
  pool_.free(id);
  sequences_.erase(id);
}

Generator::SequenceState& Generator::register_sequence(SeqId id, const MaskPolicy& policy,
                                                       std::span<const int32_t> cached_blocks) {
  std::vector<int32_t> segment_ends;
  const kernels::MaskParams mask = policy.lower(segment_ends);
  pool_.add_sequence_with_cached(id, cached_blocks, mask);
  SequenceState& state = sequences_.emplace(id, SequenceState{}).first->second;
  state.policy = policy;
  state.cacheable = config_.prefix_caching && prefix_cacheable(mask);
  return state;
}

void Generator::cache_full_blocks(SeqId id, SequenceState& state) {
  const int64_t bs = pool_.block_size();
  if (!state.cacheable || (static_cast<int64_t>(state.entries.size()) + 1) * bs > state.num_tokens) return;
  std::vector<int32_t> segment_ends;
  const kernels::MaskParams mask = state.policy.lower(segment_ends);
  const std::span<const int32_t> table = pool_.block_table(id);
  for (auto b = static_cast<int64_t>(state.entries.size()); (b + 1) * bs <= state.num_tokens; ++b) {
    if (table[static_cast<size_t>(b)] == kEvictedBlock) {
      state.cacheable = false;  // the chain cannot go on past a block that is gone
      return;
    }
    const uint64_t parent = b == 0 ? 0 : state.entries.back();
    const auto tokens = std::span<const int32_t>(state.tokens).subspan(static_cast<size_t>(b * bs), static_cast<size_t>(bs));
    state.entries.push_back(pool_.cache_block(
        id, b, prefix_block_key(parent, tokens, b * bs, mask, rope_positions_of(state.policy, b * bs, bs))));
  }
  index_segments(state);
}

std::optional<BlockKey> Generator::segment_key(const MaskPolicy& policy, std::span<const int32_t> tokens,
                                               size_t index) const {
  if (!config_.prefix_caching || !segments_reusable(policy) || index >= policy.segment_lengths.size()) return {};
  const auto [start, end] = segment_range(policy, index);
  if (end > static_cast<int64_t>(tokens.size())) return {};
  // [prefix length, prefix tokens..., segment tokens...]: with no prefix the same document matches
  // under either numbering, because reuse re-rotates K to where it goes.
  BlockKey key;
  key.words.reserve(static_cast<size_t>(1 + policy.shared_prefix + (end - start)));
  key.words.push_back(policy.shared_prefix);
  for (int64_t p = 0; p < policy.shared_prefix; ++p) key.words.push_back(tokens[static_cast<size_t>(p)]);
  for (int64_t p = start; p < end; ++p) key.words.push_back(tokens[static_cast<size_t>(p)]);
  return key;
}

void Generator::index_segments(SequenceState& state) {
  const MaskPolicy& policy = state.policy;
  if (!state.cacheable || !segments_reusable(policy)) return;
  const int64_t bs = pool_.block_size();
  for (; state.segments_indexed < policy.segment_lengths.size(); ++state.segments_indexed) {
    const auto [start, end] = segment_range(policy, state.segments_indexed);
    const int64_t last_block = (end - 1) / bs;
    if (last_block >= static_cast<int64_t>(state.entries.size())) return;  // its last block is not full yet
    IndexedSegment segment;
    segment.entries.assign(state.entries.begin() + start / bs, state.entries.begin() + last_block + 1);
    segment.first_offset = static_cast<int32_t>(start % bs);
    segment.rope_start = policy.rope_position(static_cast<int32_t>(start));
    BlockKey key = *segment_key(policy, state.tokens, state.segments_indexed);
    if (segment_index_.insert_or_assign(key, std::move(segment)).second) {
      segment_order_.push_back(std::move(key));
      if (segment_order_.size() > kMaxIndexedSegments) {
        segment_index_.erase(segment_order_.front());
        segment_order_.pop_front();
      }
    }
  }
}

std::optional<SegmentHit> Generator::find_segment(SeqId id, std::span<const int32_t> tokens, int64_t position) {
  const MaskPolicy& policy = sequences_.at(id).policy;
  if (!config_.prefix_caching || !segments_reusable(policy)) return {};
  for (size_t i = 0; i < policy.segment_lengths.size(); ++i) {
    const auto [start, end] = segment_range(policy, i);
    if (start < position) continue;
    if (start > position || end >= static_cast<int64_t>(tokens.size())) return {};
    const std::optional<BlockKey> key = segment_key(policy, tokens, i);
    if (!key) return {};
    const auto it = segment_index_.find(*key);
    if (it == segment_index_.end()) return {};
    const IndexedSegment& segment = it->second;
    const int64_t bs = pool_.block_size();
    SegmentHit hit;
    hit.position = start;
    hit.length = end - start;
    for (const uint64_t entry : segment.entries) {
      const std::optional<int32_t> block = pool_.cached_block_of(entry);
      if (!block) {  // evicted since: the index entry is stale
        segment_index_.erase(it);
        return {};
      }
      hit.src_blocks.push_back(*block);
    }
    for (int64_t j = 0; j < hit.length; ++j) {
      const int64_t offset = segment.first_offset + j;
      hit.src_slots.push_back(static_cast<int32_t>(hit.src_blocks[static_cast<size_t>(offset / bs)] * bs + offset % bs));
    }
    std::sort(hit.src_blocks.begin(), hit.src_blocks.end());
    hit.src_blocks.erase(std::unique(hit.src_blocks.begin(), hit.src_blocks.end()), hit.src_blocks.end());
    hit.rotate_by = policy.rope_position(static_cast<int32_t>(start)) - segment.rope_start;
    hit.unheld = pool_.count_unheld(hit.src_blocks);
    return hit;
  }
  return {};
}

int64_t Generator::next_reusable_segment(SeqId id, std::span<const int32_t> tokens, int64_t from) {
  const MaskPolicy& policy = sequences_.at(id).policy;
  const auto total = static_cast<int64_t>(tokens.size());
  if (!config_.prefix_caching || !segments_reusable(policy)) return total;
  for (size_t i = 0; i < policy.segment_lengths.size(); ++i) {
    const auto [start, end] = segment_range(policy, i);
    if (start <= from) continue;
    if (end >= total) break;
    if (const std::optional<BlockKey> key = segment_key(policy, tokens, i); key && segment_index_.count(*key) != 0) {
      return start;
    }
  }
  return total;
}

void Generator::reuse_segment(SeqId id, std::span<const int32_t> tokens, const SegmentHit& hit) {
  SequenceState& state = sequences_.at(id);
  TESSERA_CHECK(state.num_tokens == hit.position, "generator: sequence " << id << " holds " << state.num_tokens
                                                      << " tokens; a segment at " << hit.position << " cannot follow");
  // The sources stay held while the destination blocks are taken, so that none of them is evicted
  // for the copy's own destination.
  pool_.hold_cached(hit.src_blocks);
  struct Unhold {
    KvBlockPool& pool;
    const std::vector<int32_t>& blocks;
    ~Unhold() { pool.release_held(blocks); }
  } unhold{pool_, hit.src_blocks};
  pool_.allocate(id, hit.length);
  std::vector<int64_t> slots(static_cast<size_t>(hit.length));
  pool_.slot_mapping(id, hit.position, hit.length, slots.data());
  const std::vector<int32_t> dst(slots.begin(), slots.end());
  const std::vector<int32_t> rotate_by(dst.size(), hit.rotate_by);
  model_.copy_kv(cache_, hit.src_slots, dst, rotate_by);
  state.num_tokens += hit.length;
  if (state.cacheable) {
    state.tokens.insert(state.tokens.end(), tokens.begin() + hit.position, tokens.begin() + hit.position + hit.length);
  }
  cache_full_blocks(id, state);
}

PrefixHit Generator::find_prefix(std::span<const int32_t> tokens, const MaskPolicy& policy) const {
  PrefixHit hit;
  std::vector<int32_t> segment_ends;
  const kernels::MaskParams mask = policy.lower(segment_ends);
  if (!config_.prefix_caching || !prefix_cacheable(mask) || tokens.empty()) return hit;
  const int64_t bs = pool_.block_size();
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;  // the last token is computed
  uint64_t parent = 0;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(b * bs), static_cast<size_t>(bs));
    const std::optional<CachedBlock> cached =
        pool_.find_cached(prefix_block_key(parent, block_tokens, b * bs, mask, rope_positions_of(policy, b * bs, bs)));
    if (!cached) break;
    hit.blocks.push_back(cached->block);
    hit.entries.push_back(cached->entry);
    parent = cached->entry;
  }
  hit.tokens = static_cast<int64_t>(hit.blocks.size()) * bs;
  hit.unheld = pool_.count_unheld(hit.blocks);
  return hit;
}

void Generator::start_with_prefix(SeqId id, std::span<const int32_t> tokens, const MaskPolicy& policy,
                                  const PrefixHit& hit) {
  TESSERA_CHECK(sequences_.count(id) == 0, "generator: sequence " << id << " is already registered");
  TESSERA_CHECK(hit.tokens <= static_cast<int64_t>(tokens.size()),
                "generator: a prefix hit of " << hit.tokens << " tokens for " << tokens.size() << " tokens");
  SequenceState& state = register_sequence(id, policy, hit.blocks);
  state.num_tokens = hit.tokens;
  state.entries = hit.entries;
  if (state.cacheable) state.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(hit.tokens));
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
