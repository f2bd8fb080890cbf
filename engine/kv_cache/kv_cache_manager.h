// engine/kv_cache/kv_cache_manager.h: the KV bookkeeping of one served model: the block pool, the
// prefix cache's entries and the segment index (where earlier prompts' documents lie). It decides
// which blocks a sequence's positions go to and what may be reused; it never touches the device:
// a reused document comes back as a KvCopy for the step's executor to run.
//
// Each sequence's KV state is a SequenceKv inside that sequence's one record (the scheduler's
// Sequence, or the Generator's); the manager reads and updates it in place.
//
// Thread safety: none. The thread that plans steps owns the manager.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache/kv_block_pool.h"
#include "engine/step_plan.h"
#include "kernels/backend/mask_policy.h"

namespace tessera {

// What the KV cache knows of one sequence.
struct SequenceKv {
  SeqId id = 0;
  MaskPolicy policy = MaskPolicy::causal();
  std::vector<int32_t> tokens;   // every token the sequence has: the prompt, then each generated one
  // Leading tokens whose K/V has slots and is written (or copied) by the steps issued or being
  // planned: allocate() and reuse_segment() advance it.
  int64_t num_computed = 0;
  bool registered = false;       // holds a block table in the pool
  // Prefix caching: the cache entry holding each full block's content (fewer than the full blocks
  // only while a block's forward has not been issued yet).
  std::vector<uint64_t> entries;
  bool cacheable = false;
  size_t segments_indexed = 0;   // leading segments already put in the segment index
};

// Cached blocks that can start a new sequence: the leading full blocks of its tokens found in the
// prefix cache.
struct PrefixHit {
  std::vector<int32_t> blocks;
  std::vector<uint64_t> entries;
  int64_t tokens = 0;      // blocks.size() * block_size
  int32_t unheld = 0;      // of blocks, those no sequence holds: attaching takes them from the free count
};

// A document (segment) of a prompt whose K/V the segment index holds from an earlier prompt: copied,
// and K re-rotated, instead of computed.
struct SegmentHit {
  int64_t position = 0;              // where the segment starts in the new sequence
  int64_t length = 0;
  std::vector<int32_t> src_slots;    // [length] slots holding its K/V now
  std::vector<int32_t> src_blocks;   // the distinct cached blocks behind src_slots
  int32_t rotate_by = 0;             // RoPE positions from where it was computed to where it goes
  int32_t unheld = 0;                // of src_blocks, those no sequence holds
};

struct KvCacheManagerConfig {
  int32_t block_size = 16;
  int32_t num_blocks = 1;
  bool prefix_caching = true;  // keep full blocks after their sequence ends and reuse them (prefix_cache_key.h)
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheManagerConfig& config);

  // The longest run of leading full blocks of `tokens`, under `policy`, that the prefix cache
  // holds, leaving at least the last token to compute (its logits are needed). Changes nothing;
  // empty when prefix caching is off or the policy's blocks are not cacheable.
  PrefixHit find_prefix(std::span<const int32_t> tokens, const MaskPolicy& policy) const;
  // Registers seq (seq.policy, seq.tokens set) starting with hit's blocks: seq.num_computed becomes
  // hit.tokens. An empty hit registers it with no blocks.
  void start(SequenceKv& seq, const PrefixHit& hit);
  // Gives seq's blocks back (finish, cancel, preemption); seq.num_computed returns to 0.
  void release(SequenceKv& seq);

  // Positions [seq.num_computed, seq.num_computed + n) get slots (registering seq when it is new)
  // and seq.num_computed advances by n. Throws when the pool is short.
  void allocate(SequenceKv& seq, int64_t n);
  // seq keeps its first num_computed positions: those a verify step wrote for rejected draft tokens
  // go (with the blocks past them). Comes before commit(), so no rejected token enters the cache.
  void truncate(SequenceKv& seq, int64_t num_computed);
  // Once the step that writes seq's positions is issued (a later step reads after it in stream
  // order): its newly full blocks enter the prefix cache, and its finished documents the index.
  void commit(SequenceKv& seq);

  // Per-document reuse under a segments policy whose segments' K/V depend only on the shared prefix
  // and their own tokens: no shared prefix, or parallel positions.
  //   find_segment: the segment that starts at seq.num_computed, found in the index, ending before
  //     seq's last token (whose logits are needed).
  //   next_reusable_segment: the start of the first segment after seq.num_computed that the index
  //     holds (or seq.tokens.size()), where a computed chunk should stop.
  //   reuse_segment: the hit's positions get slots and the copy that fills them; the sources stay
  //     held until release_copy_sources, after the copy ran. seq.num_computed moves past them.
  std::optional<SegmentHit> find_segment(const SequenceKv& seq);
  int64_t next_reusable_segment(const SequenceKv& seq) const;
  KvCopy reuse_segment(SequenceKv& seq, const SegmentHit& hit);
  void release_copy_sources(const KvCopy& copy);

  std::span<const int32_t> block_table(const SequenceKv& seq) const { return pool_.block_table(seq.id); }
  const KvBlockPool& pool() const { return pool_; }
  int32_t block_size() const { return pool_.block_size(); }

 private:
  struct IndexedSegment {
    std::vector<uint64_t> entries;  // cache entries of the blocks covering it, in order
    int32_t first_offset = 0;       // its first token's offset in the first block
    int32_t rope_start = 0;         // the RoPE position its first token was computed at
  };
  bool reusable_segments(const MaskPolicy& policy) const;
  std::optional<BlockKey> segment_key(const MaskPolicy& policy, std::span<const int32_t> tokens, size_t index) const;
  void index_segments(SequenceKv& seq);
  void cache_full_blocks(SequenceKv& seq);
  SegmentHit hit_from(const SequenceKv& seq, const IndexedSegment& segment, int64_t start, int64_t end) const;

  KvCacheManagerConfig config_;
  KvBlockPool pool_;
  std::unordered_map<BlockKey, IndexedSegment, BlockKeyHash> segment_index_;
  std::deque<BlockKey> segment_order_;  // insertion order, for dropping the oldest past the cap
};

}  // namespace tessera
