// engine/generation.h: Generator, prefill then incremental decode through the paged KV cache.
// step() runs one forward for a batch of sequences (each a varlen "document" with its own mask
// policy), which is the unit a continuous-batching scheduler drives; generate() is the simple
// single-request loop the CLI uses on top of it.
//
// Thread safety: none. One thread owns a Generator.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache/kv_block_pool.h"
#include "engine/sampler/sampler.h"
#include "engine/sampler/sampling_params.h"
#include "kernels/backend/backend.h"
#include "kernels/backend/mask_policy.h"
#include "models/model.h"

namespace tessera {

struct GeneratorConfig {
  int32_t block_size = 16;       // tokens per KV block
  int32_t num_blocks = 0;        // KV blocks in the pool; 0: enough for one max_position_embeddings sequence
  int32_t prefill_chunk = 0;     // > 0: prefill prompts in chunks of this many tokens (chunked prefill)
  bool prefix_caching = true;    // keep full blocks after their sequence ends and reuse them (prefix_cache_key.h)

  void validate() const;  // throws naming the field
};

// What the largest step of a serving engine can be (Generator::warm_up).
struct WarmUpConfig {
  int32_t max_batch_tokens = 2048;  // tokens in one step
  int32_t max_batch_seqs = 128;     // sequences in one step
  int64_t max_context = 0;          // tokens of the longest sequence; 0: the model's max_position_embeddings

  void validate() const;  // throws naming the field
};

struct WarmUpReport {
  double seconds = 0.0;
  int32_t decode_shapes = 0;  // (batch size, block-table width) pairs run twice: eager, then captured
  std::vector<int32_t> decode_batches;  // the ladder decode steps are padded to (empty: no padding)
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

// Cached blocks that can start a new sequence: the leading full blocks of its tokens found in the
// prefix cache (Generator::find_prefix).
struct PrefixHit {
  std::vector<int32_t> blocks;
  std::vector<uint64_t> entries;
  int64_t tokens = 0;      // blocks.size() * block_size
  int32_t unheld = 0;      // of blocks, those no sequence holds: attaching takes them from the free count
};

// A document (segment) of a prompt whose K/V the segment index holds from an earlier prompt
// (Generator::find_segment): copied, and K re-rotated, instead of computed.
struct SegmentHit {
  int64_t position = 0;              // where the segment starts in the new sequence
  int64_t length = 0;
  std::vector<int32_t> src_slots;    // [length] slots holding its K/V now
  std::vector<int32_t> src_blocks;   // the distinct cached blocks behind src_slots
  int32_t rotate_by = 0;             // RoPE positions from where it was computed to where it goes
  int32_t unheld = 0;                // of src_blocks, those no sequence holds
};

class Generator {
 public:
  Generator(CausalLm& model, Backend& backend, GeneratorConfig config);

  // One sequence's work in a step: `tokens` are appended after what it already has.
  struct SequenceInput {
    SeqId id = 0;
    std::span<const int32_t> tokens;  // >= 1
    const MaskPolicy* policy = nullptr;  // used when the sequence is new; required then
    // Also compute the logits of every row before its last (prompt logprobs): see `earlier`.
    bool all_logits = false;
  };
  // One forward for the whole batch; returns the next-token logits of each sequence's last token,
  // f32[batch.size()][vocab]. New sequences are registered with their policy. When an input has
  // all_logits and more than one token, `earlier` (required then) receives, on the backend and
  // valid until the next step, the logits of those inputs' rows before their last, in batch order
  // and row order: [sum of (tokens - 1) over them, vocab]. A step of single-token rows has none,
  // so such a step is still a plain decode step (a captured graph on a GPU).
  std::vector<std::vector<float>> step(std::span<const SequenceInput> batch, Tensor* earlier = nullptr);
  // The same forward, with the logits left on the backend: [batch.size(), vocab], valid until the
  // next step (for Backend::sample).
  Tensor forward(std::span<const SequenceInput> batch, Tensor* earlier = nullptr);
  // Frees a sequence's KV blocks.
  void release(SeqId id);

  // The longest run of leading full blocks of `tokens`, under `policy`, that the prefix cache
  // holds, leaving at least the last token to compute (its logits are needed). Changes nothing;
  // empty when prefix caching is off or the policy's blocks are not cacheable.
  PrefixHit find_prefix(std::span<const int32_t> tokens, const MaskPolicy& policy) const;
  // Registers a new sequence that starts with hit's blocks, holding tokens[0, hit.tokens); its
  // next step appends tokens[hit.tokens, ...). `tokens` must be the ones find_prefix was given.
  void start_with_prefix(SeqId id, std::span<const int32_t> tokens, const MaskPolicy& policy, const PrefixHit& hit);

  // Per-document reuse under a segments policy whose segments' K/V depend only on the shared prefix
  // and their own tokens: no shared prefix, or parallel positions. The index keeps, per (prefix,
  // segment tokens, numbering), where a finished segment's K/V lies in cached blocks.
  //   find_segment: the segment of registered sequence `id` that starts at `position` (its next
  //     token), found in the index, ending before the last of `tokens` (whose logits are needed).
  //   next_reusable_segment: the start of the first later segment the index holds (or
  //     tokens.size()), where a computed chunk should stop.
  //   reuse_segment: appends the hit's positions to the sequence by copying (and re-rotating) K/V.
  std::optional<SegmentHit> find_segment(SeqId id, std::span<const int32_t> tokens, int64_t position);
  int64_t next_reusable_segment(SeqId id, std::span<const int32_t> tokens, int64_t from);
  void reuse_segment(SeqId id, std::span<const int32_t> tokens, const SegmentHit& hit);

  // Before serving, on a backend that asks for it: runs the largest step once, so that the step
  // workspace is sized now and not under load, then each decode batch size of the backend's ladder
  // at each block-table width twice, so that their CUDA graphs are captured before the first
  // request. Later decode-only steps are padded up to the ladder's next size. The warm-up steps use
  // only the padding block, never the pool's blocks. A no-op on other backends.
  WarmUpReport warm_up(const WarmUpConfig& config);

  // Prefill + decode of one request. on_token(token) is called for every sampled token and returns
  // false to stop (the token it was given is kept). The sequence's blocks are freed at the end.
  GenerationResult generate(const GenerationRequest& request, const std::function<bool(int32_t)>& on_token);

  const KvBlockPool& block_pool() const { return pool_; }

 private:
  struct SequenceState {
    MaskPolicy policy;
    int64_t num_tokens = 0;
    // Prefix caching: every token so far, and the cache entry holding each full block's content
    // (fewer than the full blocks only while a block's forward has not run yet).
    std::vector<int32_t> tokens;
    std::vector<uint64_t> entries;
    bool cacheable = false;
    size_t segments_indexed = 0;  // leading segments already put in the segment index
  };
  struct IndexedSegment {
    std::vector<uint64_t> entries;  // cache entries of the blocks covering it, in order
    int32_t first_offset = 0;       // its first token's offset in the first block
    int32_t rope_start = 0;         // the RoPE position its first token was computed at
  };
  // The segment index key of segment `index` of a sequence (empty when the policy's segments are
  // not reusable).
  std::optional<BlockKey> segment_key(const MaskPolicy& policy, std::span<const int32_t> tokens, size_t index) const;
  void index_segments(SequenceState& state);
  SequenceState& register_sequence(SeqId id, const MaskPolicy& policy, std::span<const int32_t> cached_blocks);
  // After a forward: puts the sequence's newly full blocks in the prefix cache.
  void cache_full_blocks(SeqId id, SequenceState& state);

  // Plans and runs one forward over `seqs`, whose tokens are `packed`.
  // Logits come back for each sequence's last row, then for `extra_rows` (packed row indices).
  Tensor run(std::span<const AttentionPlan::Sequence> seqs, std::span<const int32_t> packed,
             std::span<const int32_t> extra_rows = {});
  // A sequence outside the pool that reads and writes only the padding block.
  AttentionPlan::Sequence padding_sequence(int32_t q_len, int32_t kv_len) const;

  CausalLm& model_;
  Backend& backend_;
  GeneratorConfig config_;
  KvBlockPool pool_;
  // The cache has one block more than the pool: the padding block, which warm-up and padding
  // sequences write to and read from, so that they never touch a request's KV.
  KvCacheStorage cache_;
  int32_t padding_block_ = 0;
  MaskPolicy padding_policy_ = MaskPolicy::causal();
  std::vector<int32_t> padding_table_;  // padding_block_, repeated for the longest context
  std::vector<int32_t> decode_ladder_;  // set by warm_up
  std::unordered_map<SeqId, SequenceState> sequences_;
  std::unordered_map<BlockKey, IndexedSegment, BlockKeyHash> segment_index_;
  std::deque<BlockKey> segment_order_;  // insertion order, for dropping the oldest past the cap
  SeqId next_request_id_ = 1;
};

}  // namespace tessera
