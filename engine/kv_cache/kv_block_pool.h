// engine/kv_cache/kv_block_pool.h: the paged KV cache's bookkeeping: a pool of fixed-size blocks,
// a free list, one block table per sequence, sliding-window eviction, and the prefix cache (full
// blocks kept after their sequences end, found again by an exact key). No tensor storage: the
// backend owns K/V per layer as [num_blocks, block_size, num_kv_heads, head_dim] and indexes it
// with the block ids kept here, so the CPU and CUDA backends share this class unchanged.
//
// Thread safety: none. One engine thread (the scheduler's) owns a pool and makes every call.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/attention_mask.h"

namespace tessera {

using SeqId = int64_t;

// A block table entry for a logical block that sliding-window eviction gave back to the pool. Its
// positions stay addressable (position p lives in logical block p / block_size) but no query of the
// sequence may see them any more, so kernels never read through this entry.
inline constexpr int32_t kEvictedBlock = -1;

struct KvCacheConfig {
  int32_t num_blocks = 0;   // blocks in the pool, >= 1
  int32_t block_size = 16;  // tokens per block, in [1, 1024]

  // Throws tessera::Error naming the field and the allowed range.
  void validate() const;

  // Bytes one block takes in the backend for K and V over all layers.
  static int64_t bytes_per_block(int32_t block_size, int64_t num_layers, int64_t num_kv_heads,
                                 int64_t head_dim, int64_t bytes_per_element);
};

// What a full block's K/V depends on, exactly: the cache entry of the block before it (0 for the
// first block), then the block's token ids, then for each of its positions the attention context
// it was computed under (engine/kv_cache/prefix_cache_key.h builds them). Two blocks with equal keys
// hold equal K/V, so a hit never needs checking against anything else.
struct BlockKey {
  std::vector<int64_t> words;
  bool operator==(const BlockKey&) const = default;
};
struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const;
};

// A cached block: its id in the pool and the id of its cache entry, which the next block's key names.
struct CachedBlock {
  int32_t block = 0;
  uint64_t entry = 0;
};

struct KvCacheStats {
  int32_t blocks_total = 0;
  int32_t blocks_used = 0;    // held by at least one sequence
  int32_t blocks_free = 0;    // allocatable now, cached ones included
  int32_t blocks_cached = 0;  // in the prefix cache, held or not
  int64_t cache_evictions = 0;  // cached blocks taken for new K/V since the pool was made
  int32_t num_sequences = 0;
  double usage() const { return blocks_total > 0 ? double(blocks_used) / blocks_total : 0.0; }  // [0, 1]
};

class KvBlockPool {
 public:
  explicit KvBlockPool(const KvCacheConfig& config);  // validates config

  const KvCacheConfig& config() const { return config_; }
  int32_t block_size() const { return config_.block_size; }

  // Registers a sequence with its mask. Only MaskKind::kSlidingWindow releases blocks (window and
  // sinks are copied; segment_ends is not kept). allocate() registers an unknown sequence as causal.
  // Throws if seq is already registered or the window is < 1 / sinks < 0.
  void add_sequence(SeqId seq, const kernels::MaskParams& mask = {});
  bool has_sequence(SeqId seq) const { return seqs_.count(seq) != 0; }

  // Number of blocks that holding positions [0, n_tokens) needs (ceil division).
  int64_t blocks_for_tokens(int64_t n_tokens) const;

  // Whether appending n_tokens positions to seq (unknown seq: a new causal sequence) fits in the
  // free blocks, counting the blocks allocate() would first release from a sliding window.
  bool can_allocate(SeqId seq, int64_t n_tokens) const;

  // Appends n_tokens positions [L, L + n_tokens) to seq, where L = num_tokens(seq), growing its block
  // table. Calling it says every query below position L has run (in stream order), so first it
  // releases the blocks no query at position >= L can see (evict_outside_window(seq, L)).
  // try_allocate returns false and changes nothing when the pool is short; allocate throws
  // tessera::Error saying how many blocks were needed and how many were free.
  [[nodiscard]] bool try_allocate(SeqId seq, int64_t n_tokens);
  void allocate(SeqId seq, int64_t n_tokens);

  // Releases every block of seq that no query at position >= first_query can see: for a sliding
  // window, blocks wholly before kernels::MaskParams::lowest_key(first_query) and holding no sink
  // position. Their table entries become kEvictedBlock. Returns how many entries were evicted.
  // A no-op for other masks.
  int32_t evict_outside_window(SeqId seq, int64_t first_query);

  // Drops seq's positions from n_tokens on (a rejected speculative draft): the blocks past the first
  // n_tokens positions go back to the pool. n_tokens <= num_tokens(seq); the dropped positions
  // were never cached (only positions below the committed length are).
  void truncate(SeqId seq, int64_t n_tokens);
  // Gives all of seq's blocks back (finish, cancel, preemption) and forgets seq. Unknown seq: no-op.
  // Blocks in the prefix cache stay cached, evictable, the last block of seq first.
  void free(SeqId seq);

  // ---- the prefix cache ----
  // The cached block with this key, if any. Changes nothing.
  std::optional<CachedBlock> find_cached(const BlockKey& key) const;
  // Puts full logical block `index` of seq in the cache under key and returns the entry that now
  // holds this content: an existing entry when the key was cached already (seq's block then stays
  // private), or the block's own entry when it has one.
  uint64_t cache_block(SeqId seq, int64_t index, BlockKey key);
  // Registers seq (new) holding `blocks`, cached blocks found by find_cached in order, as its first
  // blocks.size() * block_size positions. Each gains a reference; one that no sequence held stops
  // being evictable.
  void add_sequence_with_cached(SeqId seq, std::span<const int32_t> blocks, const kernels::MaskParams& mask = {});
  // Of `blocks`, how many no sequence holds: attaching them takes that many out of blocks_free().
  int32_t count_unheld(std::span<const int32_t> blocks) const;
  // The block holding a cache entry's content, if it is still cached.
  std::optional<int32_t> cached_block_of(uint64_t entry) const;
  // A reference on cached blocks outside any sequence (while they are read from), and its release.
  void hold_cached(std::span<const int32_t> blocks);
  void release_held(std::span<const int32_t> blocks);
  int32_t blocks_cached() const { return int32_t(entries_.size()); }
  int64_t cache_evictions() const { return cache_evictions_; }

  // Prefix sharing (prefix caching, parallel sampling): dst, a new sequence, starts with src's first
  // n_tokens positions by referencing src's blocks (ref-counted) instead of copying them.
  // n_tokens must be a multiple of block_size (only full blocks are shared: a shared partial block
  // would be written by both) and <= num_tokens(src); no shared block may have been evicted.
  void share_prefix(SeqId src, SeqId dst, int64_t n_tokens, const kernels::MaskParams& dst_mask = {});

  // seq's block table: entry i holds positions [i * block_size, (i + 1) * block_size), a block id
  // in [0, num_blocks) or kEvictedBlock. Valid until the next call that changes seq.
  std::span<const int32_t> block_table(SeqId seq) const;
  int64_t num_tokens(SeqId seq) const;  // positions allocated so far
  // Physical slot (block_id * block_size + offset) of position pos, or -1 if evicted.
  int64_t slot(SeqId seq, int64_t pos) const;
  // Slots of positions [first_pos, first_pos + n) into out[n] (vLLM's slot_mapping for K/V writes).
  void slot_mapping(SeqId seq, int64_t first_pos, int64_t n, int64_t* out) const;

  // Blocks an allocation can take: never used, or cached with no sequence holding them (the least
  // recently released of those is evicted first).
  int32_t blocks_free() const { return int32_t(free_blocks_.size() + evictable_.size()); }
  int32_t blocks_used() const { return config_.num_blocks - blocks_free(); }
  // Fraction of blocks in use, [0, 1]: the value of the kv_cache_usage_perc gauge (1 means 100%, as
  // vLLM exports it).
  double usage() const { return double(blocks_used()) / config_.num_blocks; }
  KvCacheStats stats() const;
  int32_t ref_count(int32_t block_id) const;  // 0 when free

 private:
  struct Sequence {
    std::vector<int32_t> table;  // [ceil(num_tokens / block_size)] block ids or kEvictedBlock
    int64_t num_tokens = 0;
    kernels::MaskKind mask_kind = kernels::MaskKind::kCausal;
    int32_t window = 0;
    int32_t sinks = 0;
    int64_t evicted_upto = 0;  // logical blocks in [first sink-free block, evicted_upto) are evicted
  };

  Sequence& sequence(SeqId seq);
  const Sequence& sequence(SeqId seq) const;
  // Logical blocks [first, last) of s that queries at >= first_query cannot see.
  void evictable_range(const Sequence& s, int64_t first_query, int64_t& first, int64_t& last) const;
  int32_t take_block();
  void release_block(int32_t block_id);
  void hold_block(int32_t block_id);  // one more reference; a cached unheld block leaves the LRU
  void uncache(int32_t block_id);

  struct BlockCacheState {
    const BlockKey* key = nullptr;  // into entries_, null when the block is not cached
    uint64_t entry = 0;
    std::list<int32_t>::iterator lru;  // valid while cached and unheld
  };

  KvCacheConfig config_;
  std::vector<int32_t> free_blocks_;  // never-cached free blocks, LIFO: a just-freed block is reused first
  std::vector<int32_t> ref_counts_;   // [num_blocks]
  std::unordered_map<SeqId, Sequence> seqs_;
  std::unordered_map<BlockKey, CachedBlock, BlockKeyHash> entries_;
  std::unordered_map<uint64_t, int32_t> entry_blocks_;  // entry id -> block, for every cached block
  std::vector<BlockCacheState> cache_state_;  // [num_blocks]
  std::list<int32_t> evictable_;  // cached blocks no sequence holds, least recently released first
  uint64_t next_entry_ = 1;
  int64_t cache_evictions_ = 0;
};

}  // namespace tessera
