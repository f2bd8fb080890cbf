// engine/kv_cache/kv_cache_manager.cpp: KvCacheManager (see kv_cache_manager.h).
#include "engine/kv_cache/kv_cache_manager.h"

#include <algorithm>

#include "common/error.h"
#include "engine/kv_cache/prefix_cache_key.h"

namespace tessera {

namespace {

// Segment index entries kept at most; past it the oldest go.
constexpr size_t kMaxIndexedSegments = 4096;

// RoPE positions of [first, first + n) when the policy numbers tokens other than by index.
std::vector<int32_t> rope_positions_of(const MaskPolicy& policy, int64_t first, int64_t n) {
  std::vector<int32_t> positions;
  if (!policy.parallel_positions) return positions;
  for (int64_t p = first; p < first + n; ++p) positions.push_back(policy.rope_position(static_cast<int32_t>(p)));
  return positions;
}

// [start, end) of segment i.
std::pair<int64_t, int64_t> segment_range(const MaskPolicy& policy, size_t i) {
  int64_t start = policy.shared_prefix;
  for (size_t j = 0; j < i; ++j) start += policy.segment_lengths[j];
  return {start, start + policy.segment_lengths[i]};
}

// A policy's kernel form, with the segment ends its MaskParams points into.
struct LoweredMask {
  explicit LoweredMask(const MaskPolicy& policy) : params(policy.lower(segment_ends)) {}
  LoweredMask(const LoweredMask&) = delete;
  LoweredMask& operator=(const LoweredMask&) = delete;
  std::vector<int32_t> segment_ends;  // declared first: params points into it
  kernels::MaskParams params;
};

KvCacheConfig pool_config(const KvCacheManagerConfig& config) {
  KvCacheConfig c;
  c.block_size = config.block_size;
  c.num_blocks = config.num_blocks;
  return c;
}

}  // namespace

KvCacheManager::KvCacheManager(const KvCacheManagerConfig& config) : config_(config), pool_(pool_config(config)) {}

// Whether a segments policy's segments have K/V that depends only on the shared prefix and their own
// tokens: with no shared prefix a segment sees only itself (and RoPE is relative); with one, only
// when every segment is numbered from its end.
bool KvCacheManager::reusable_segments(const MaskPolicy& policy) const {
  return config_.prefix_caching && policy.kind == MaskPolicy::Kind::kSegments &&
         (policy.shared_prefix == 0 || policy.parallel_positions);
}

PrefixHit KvCacheManager::find_prefix(std::span<const int32_t> tokens, const MaskPolicy& policy) const {
  PrefixHit hit;
  const LoweredMask lowered(policy);
  const kernels::MaskParams& mask = lowered.params;
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

void KvCacheManager::start(SequenceKv& seq, const PrefixHit& hit) {
  TESSERA_CHECK(!seq.registered, "kv cache: sequence " << seq.id << " is already registered");
  TESSERA_CHECK(hit.tokens <= static_cast<int64_t>(seq.tokens.size()),
                "kv cache: a prefix hit of " << hit.tokens << " tokens for " << seq.tokens.size() << " tokens");
  const LoweredMask lowered(seq.policy);
  const kernels::MaskParams& mask = lowered.params;
  pool_.add_sequence_with_cached(seq.id, hit.blocks, mask);
  seq.registered = true;
  seq.num_computed = hit.tokens;
  seq.entries = hit.entries;
  seq.cacheable = config_.prefix_caching && prefix_cacheable(mask);
  seq.segments_indexed = 0;
}

void KvCacheManager::release(SequenceKv& seq) {
  if (seq.registered) pool_.free(seq.id);
  seq.registered = false;
  seq.num_computed = 0;
  seq.entries.clear();
  seq.segments_indexed = 0;
}

void KvCacheManager::allocate(SequenceKv& seq, int64_t n) {
  if (!seq.registered) start(seq, PrefixHit{});
  pool_.allocate(seq.id, n);
  seq.num_computed += n;
}

void KvCacheManager::truncate(SequenceKv& seq, int64_t num_computed) {
  TESSERA_CHECK(static_cast<int64_t>(seq.entries.size()) * pool_.block_size() <= num_computed,
                "KV cache: sequence " << seq.id << " cannot drop positions already in the prefix cache");
  pool_.truncate(seq.id, num_computed);
  seq.num_computed = num_computed;
}

void KvCacheManager::commit(SequenceKv& seq) { cache_full_blocks(seq); }

void KvCacheManager::cache_full_blocks(SequenceKv& seq) {
  const int64_t bs = pool_.block_size();
  if (!seq.cacheable || (static_cast<int64_t>(seq.entries.size()) + 1) * bs > seq.num_computed) return;
  const LoweredMask lowered(seq.policy);
  const kernels::MaskParams& mask = lowered.params;
  const std::span<const int32_t> table = pool_.block_table(seq.id);
  for (auto b = static_cast<int64_t>(seq.entries.size()); (b + 1) * bs <= seq.num_computed; ++b) {
    if (table[static_cast<size_t>(b)] == kEvictedBlock) {
      seq.cacheable = false;  // the chain cannot go on past a block that is gone
      return;
    }
    const uint64_t parent = b == 0 ? 0 : seq.entries.back();
    const auto tokens = std::span<const int32_t>(seq.tokens).subspan(static_cast<size_t>(b * bs), static_cast<size_t>(bs));
    seq.entries.push_back(pool_.cache_block(
        seq.id, b, prefix_block_key(parent, tokens, b * bs, mask, rope_positions_of(seq.policy, b * bs, bs))));
  }
  index_segments(seq);
}

std::optional<BlockKey> KvCacheManager::segment_key(const MaskPolicy& policy, std::span<const int32_t> tokens,
                                                    size_t index) const {
  if (!reusable_segments(policy) || index >= policy.segment_lengths.size()) return {};
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

void KvCacheManager::index_segments(SequenceKv& seq) {
  const MaskPolicy& policy = seq.policy;
  if (!seq.cacheable || !reusable_segments(policy)) return;
  const int64_t bs = pool_.block_size();
  for (; seq.segments_indexed < policy.segment_lengths.size(); ++seq.segments_indexed) {
    const auto [start, end] = segment_range(policy, seq.segments_indexed);
    const int64_t last_block = (end - 1) / bs;
    if (last_block >= static_cast<int64_t>(seq.entries.size())) return;  // its last block is not full yet
    IndexedSegment segment;
    segment.entries.assign(seq.entries.begin() + start / bs, seq.entries.begin() + last_block + 1);
    segment.first_offset = static_cast<int32_t>(start % bs);
    segment.rope_start = policy.rope_position(static_cast<int32_t>(start));
    BlockKey key = *segment_key(policy, seq.tokens, seq.segments_indexed);
    if (segment_index_.insert_or_assign(key, std::move(segment)).second) {
      segment_order_.push_back(std::move(key));
      if (segment_order_.size() > kMaxIndexedSegments) {
        segment_index_.erase(segment_order_.front());
        segment_order_.pop_front();
      }
    }
  }
}

std::optional<SegmentHit> KvCacheManager::find_segment(const SequenceKv& seq) {
  const MaskPolicy& policy = seq.policy;
  if (!seq.registered || !reusable_segments(policy)) return {};
  const int64_t position = seq.num_computed;
  for (size_t i = 0; i < policy.segment_lengths.size(); ++i) {
    const auto [start, end] = segment_range(policy, i);
    if (start < position) continue;
    if (start > position || end >= static_cast<int64_t>(seq.tokens.size())) return {};
    const std::optional<BlockKey> key = segment_key(policy, seq.tokens, i);
    if (!key) return {};
    const auto it = segment_index_.find(*key);
    if (it == segment_index_.end()) return {};
    for (const uint64_t entry : it->second.entries) {
      if (!pool_.cached_block_of(entry)) {  // evicted since: the index entry is stale
        segment_index_.erase(it);
        return {};
      }
    }
    return hit_from(seq, it->second, start, end);
  }
  return {};
}

SegmentHit KvCacheManager::hit_from(const SequenceKv& seq, const IndexedSegment& segment, int64_t start,
                                    int64_t end) const {
  const int64_t bs = pool_.block_size();
  SegmentHit hit;
  hit.position = start;
  hit.length = end - start;
  for (const uint64_t entry : segment.entries) hit.src_blocks.push_back(*pool_.cached_block_of(entry));
  for (int64_t j = 0; j < hit.length; ++j) {
    const int64_t offset = segment.first_offset + j;
    hit.src_slots.push_back(static_cast<int32_t>(hit.src_blocks[static_cast<size_t>(offset / bs)] * bs + offset % bs));
  }
  std::sort(hit.src_blocks.begin(), hit.src_blocks.end());
  hit.src_blocks.erase(std::unique(hit.src_blocks.begin(), hit.src_blocks.end()), hit.src_blocks.end());
  hit.rotate_by = seq.policy.rope_position(static_cast<int32_t>(start)) - segment.rope_start;
  hit.unheld = pool_.count_unheld(hit.src_blocks);
  return hit;
}

int64_t KvCacheManager::next_reusable_segment(const SequenceKv& seq) const {
  const MaskPolicy& policy = seq.policy;
  const auto total = static_cast<int64_t>(seq.tokens.size());
  if (!seq.registered || !reusable_segments(policy)) return total;
  for (size_t i = 0; i < policy.segment_lengths.size(); ++i) {
    const auto [start, end] = segment_range(policy, i);
    if (start <= seq.num_computed) continue;
    if (end >= total) break;
    if (const std::optional<BlockKey> key = segment_key(policy, seq.tokens, i); key && segment_index_.count(*key) != 0) {
      return start;
    }
  }
  return total;
}

KvCopy KvCacheManager::reuse_segment(SequenceKv& seq, const SegmentHit& hit) {
  TESSERA_CHECK(seq.num_computed == hit.position, "kv cache: sequence " << seq.id << " holds " << seq.num_computed
                                                      << " tokens; a segment at " << hit.position << " cannot follow");
  // The sources are held before the destination blocks are taken, so that none of them is evicted
  // for the copy's own destination, and stay held until the copy ran.
  pool_.hold_cached(hit.src_blocks);
  KvCopy copy;
  copy.seq = seq.id;
  copy.src_blocks = hit.src_blocks;
  try {
    pool_.allocate(seq.id, hit.length);
  } catch (...) {
    pool_.release_held(hit.src_blocks);
    throw;
  }
  std::vector<int64_t> slots(static_cast<size_t>(hit.length));
  pool_.slot_mapping(seq.id, hit.position, hit.length, slots.data());
  copy.src_slots = hit.src_slots;
  copy.dst_slots.assign(slots.begin(), slots.end());
  copy.rotate_by.assign(slots.size(), hit.rotate_by);
  seq.num_computed += hit.length;
  return copy;
}

void KvCacheManager::release_copy_sources(const KvCopy& copy) { pool_.release_held(copy.src_blocks); }

}  // namespace tessera
