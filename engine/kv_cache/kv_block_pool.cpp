// engine/kv_cache/kv_block_pool.cpp: KvBlockPool (see kv_block_pool.h).
#include "engine/kv_cache/kv_block_pool.h"

#include <algorithm>

#include "common/error.h"

namespace tessera {

void KvCacheConfig::validate() const {
  TESSERA_CHECK(num_blocks >= 1, "kv_cache.num_blocks must be >= 1, got " << num_blocks);
  TESSERA_CHECK(block_size >= 1 && block_size <= 1024,
                "kv_cache.block_size must be in [1, 1024], got " << block_size);
}

int64_t KvCacheConfig::bytes_per_block(int32_t block_size, int64_t num_layers, int64_t num_kv_heads,
                                       int64_t head_dim, int64_t bytes_per_element) {
  return 2 * num_layers * int64_t(block_size) * num_kv_heads * head_dim * bytes_per_element;  // K and V
}

size_t BlockKeyHash::operator()(const BlockKey& key) const {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int64_t w : key.words) {  // splitmix64 finalizer over a running combination
    uint64_t z = h ^ (static_cast<uint64_t>(w) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    h = z ^ (z >> 31);
  }
  return static_cast<size_t>(h);
}

KvBlockPool::KvBlockPool(const KvCacheConfig& config) : config_(config) {
  config_.validate();
  ref_counts_.assign(size_t(config_.num_blocks), 0);
  cache_state_.assign(size_t(config_.num_blocks), BlockCacheState{});
  free_blocks_.reserve(size_t(config_.num_blocks));
  // Highest id at the bottom of the LIFO stack, so a fresh pool hands out 0, 1, 2, ...
  for (int32_t id = config_.num_blocks - 1; id >= 0; --id) free_blocks_.push_back(id);
}

void KvBlockPool::add_sequence(SeqId seq, const kernels::MaskParams& mask) {
  TESSERA_CHECK(!has_sequence(seq), "KV cache: sequence " << seq << " is already registered");
  Sequence s;
  s.mask_kind = mask.kind;
  if (mask.kind == kernels::MaskKind::kSlidingWindow) {
    TESSERA_CHECK(mask.window >= 1, "sliding_window.window must be >= 1, got " << mask.window);
    TESSERA_CHECK(mask.sinks >= 0, "sliding_window.sinks must be >= 0, got " << mask.sinks);
    s.window = mask.window;
    s.sinks = mask.sinks;
  }
  seqs_.emplace(seq, std::move(s));
}

int64_t KvBlockPool::blocks_for_tokens(int64_t n_tokens) const {
  return (n_tokens + config_.block_size - 1) / config_.block_size;
}

KvBlockPool::Sequence& KvBlockPool::sequence(SeqId seq) {
  auto it = seqs_.find(seq);
  TESSERA_CHECK(it != seqs_.end(), "KV cache: unknown sequence " << seq);
  return it->second;
}

const KvBlockPool::Sequence& KvBlockPool::sequence(SeqId seq) const {
  auto it = seqs_.find(seq);
  TESSERA_CHECK(it != seqs_.end(), "KV cache: unknown sequence " << seq);
  return it->second;
}

void KvBlockPool::evictable_range(const Sequence& s, int64_t first_query, int64_t& first,
                                  int64_t& last) const {
  first = last = 0;
  if (s.mask_kind != kernels::MaskKind::kSlidingWindow) return;
  // The same rule as MaskParams::visible: a query q >= first_query sees k when k > q - window or
  // k < sinks. lowest_key() only grows with q, so keys below lowest_key(first_query) are dead for
  // good unless they are sinks. A block is released only when all its positions are dead.
  const int64_t lowest = std::max<int64_t>(0, first_query - s.window + 1);
  const int64_t bs = config_.block_size;
  first = std::max<int64_t>((s.sinks + bs - 1) / bs, s.evicted_upto);  // first block with no sink
  last = std::min<int64_t>(lowest / bs, int64_t(s.table.size()));
  if (last < first) last = first;
}

bool KvBlockPool::can_allocate(SeqId seq, int64_t n_tokens) const {
  TESSERA_CHECK(n_tokens >= 0, "KV cache: n_tokens must be >= 0, got " << n_tokens);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return blocks_for_tokens(n_tokens) <= blocks_free();
  const Sequence& s = it->second;
  const int64_t needed = blocks_for_tokens(s.num_tokens + n_tokens) - int64_t(s.table.size());
  int64_t reclaimable = 0;
  int64_t first = 0, last = 0;
  evictable_range(s, s.num_tokens, first, last);
  for (int64_t b = first; b < last; ++b) {
    const int32_t id = s.table[size_t(b)];
    if (id != kEvictedBlock && ref_counts_[size_t(id)] == 1) ++reclaimable;
  }
  return needed <= blocks_free() + reclaimable;
}

bool KvBlockPool::try_allocate(SeqId seq, int64_t n_tokens) {
  if (!can_allocate(seq, n_tokens)) return false;
  if (!has_sequence(seq)) add_sequence(seq);
  Sequence& s = sequence(seq);
  evict_outside_window(seq, s.num_tokens);
  const int64_t target = blocks_for_tokens(s.num_tokens + n_tokens);
  while (int64_t(s.table.size()) < target) s.table.push_back(take_block());
  s.num_tokens += n_tokens;
  return true;
}

void KvBlockPool::allocate(SeqId seq, int64_t n_tokens) {
  if (try_allocate(seq, n_tokens)) return;
  const auto it = seqs_.find(seq);
  const int64_t have = it == seqs_.end() ? 0 : int64_t(it->second.table.size());
  const int64_t tokens = it == seqs_.end() ? 0 : it->second.num_tokens;
  TESSERA_FAIL("KV cache exhausted: sequence " << seq << " needs "
               << blocks_for_tokens(tokens + n_tokens) - have << " more block(s) of "
               << config_.block_size << " tokens for " << n_tokens << " token(s), "
               << blocks_free() << " of " << config_.num_blocks << " free");
}

int32_t KvBlockPool::evict_outside_window(SeqId seq, int64_t first_query) {
  Sequence& s = sequence(seq);
  int64_t first = 0, last = 0;
  evictable_range(s, first_query, first, last);
  int32_t evicted = 0;
  for (int64_t b = first; b < last; ++b) {
    int32_t& id = s.table[size_t(b)];
    if (id == kEvictedBlock) continue;
    release_block(id);
    id = kEvictedBlock;
    ++evicted;
  }
  s.evicted_upto = std::max(s.evicted_upto, last);
  return evicted;
}

void KvBlockPool::truncate(SeqId seq, int64_t n_tokens) {
  Sequence& s = sequence(seq);
  TESSERA_CHECK(n_tokens >= 0 && n_tokens <= s.num_tokens,
                "KV cache: sequence " << seq << " of " << s.num_tokens << " positions cannot keep " << n_tokens);
  const auto keep = static_cast<size_t>(blocks_for_tokens(n_tokens));
  while (s.table.size() > keep) {
    if (s.table.back() != kEvictedBlock) release_block(s.table.back());
    s.table.pop_back();
  }
  s.num_tokens = n_tokens;
}

void KvBlockPool::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last block first: of one sequence's cached blocks, the deepest are evicted first, so a prefix
  // stays findable as long as possible.
  for (auto id = it->second.table.rbegin(); id != it->second.table.rend(); ++id) {
    if (*id != kEvictedBlock) release_block(*id);
  }
  seqs_.erase(it);
}

std::optional<CachedBlock> KvBlockPool::find_cached(const BlockKey& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

uint64_t KvBlockPool::cache_block(SeqId seq, int64_t index, BlockKey key) {
  const Sequence& s = sequence(seq);
  TESSERA_CHECK(index >= 0 && index < int64_t(s.table.size()) && (index + 1) * config_.block_size <= s.num_tokens,
                "KV cache: block " << index << " of sequence " << seq << " is not a full block");
  const int32_t id = s.table[size_t(index)];
  TESSERA_CHECK(id != kEvictedBlock, "KV cache: block " << index << " of sequence " << seq << " was evicted");
  BlockCacheState& state = cache_state_[size_t(id)];
  if (state.key != nullptr) return state.entry;  // a cache hit being registered again
  const auto [it, inserted] = entries_.try_emplace(std::move(key), CachedBlock{id, next_entry_});
  if (!inserted) return it->second.entry;  // the same content is cached in another block
  state.key = &it->first;
  state.entry = next_entry_++;
  entry_blocks_.emplace(state.entry, id);
  return state.entry;
}

void KvBlockPool::add_sequence_with_cached(SeqId seq, std::span<const int32_t> blocks,
                                           const kernels::MaskParams& mask) {
  for (int32_t id : blocks) {
    TESSERA_CHECK(id >= 0 && id < config_.num_blocks && cache_state_[size_t(id)].key != nullptr,
                  "KV cache: block " << id << " is not in the prefix cache");
  }
  add_sequence(seq, mask);
  Sequence& s = sequence(seq);
  for (int32_t id : blocks) hold_block(id);
  s.table.assign(blocks.begin(), blocks.end());
  s.num_tokens = int64_t(blocks.size()) * config_.block_size;
}

std::optional<int32_t> KvBlockPool::cached_block_of(uint64_t entry) const {
  const auto it = entry_blocks_.find(entry);
  if (it == entry_blocks_.end()) return std::nullopt;
  return it->second;
}

void KvBlockPool::hold_cached(std::span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    TESSERA_CHECK(id >= 0 && id < config_.num_blocks && cache_state_[size_t(id)].key != nullptr,
                  "KV cache: block " << id << " is not in the prefix cache");
    hold_block(id);
  }
}

void KvBlockPool::release_held(std::span<const int32_t> blocks) {
  for (int32_t id : blocks) release_block(id);
}

int32_t KvBlockPool::count_unheld(std::span<const int32_t> blocks) const {
  int32_t n = 0;
  for (int32_t id : blocks) n += ref_counts_[size_t(id)] == 0 ? 1 : 0;
  return n;
}

void KvBlockPool::share_prefix(SeqId src, SeqId dst, int64_t n_tokens,
                               const kernels::MaskParams& dst_mask) {
  const Sequence& s = sequence(src);
  TESSERA_CHECK(n_tokens >= 0 && n_tokens % config_.block_size == 0,
                "KV cache: a shared prefix must be a whole number of blocks of " << config_.block_size
                                                                                 << " tokens, got " << n_tokens);
  TESSERA_CHECK(n_tokens <= s.num_tokens, "KV cache: sequence " << src << " holds " << s.num_tokens
                                                                << " tokens, cannot share " << n_tokens);
  const size_t n_blocks = size_t(n_tokens / config_.block_size);
  for (size_t b = 0; b < n_blocks; ++b) {
    TESSERA_CHECK(s.table[b] != kEvictedBlock, "KV cache: block " << b << " of sequence " << src
                                                                  << " was evicted and cannot be shared");
  }
  std::vector<int32_t> shared(s.table.begin(), s.table.begin() + std::ptrdiff_t(n_blocks));
  add_sequence(dst, dst_mask);
  Sequence& d = seqs_.at(dst);
  for (int32_t id : shared) hold_block(id);
  d.table = std::move(shared);
  d.num_tokens = n_tokens;
}

std::span<const int32_t> KvBlockPool::block_table(SeqId seq) const { return sequence(seq).table; }

int64_t KvBlockPool::num_tokens(SeqId seq) const { return sequence(seq).num_tokens; }

int64_t KvBlockPool::slot(SeqId seq, int64_t pos) const {
  const Sequence& s = sequence(seq);
  TESSERA_CHECK(pos >= 0 && pos < s.num_tokens,
                "KV cache: position " << pos << " outside sequence " << seq << " of " << s.num_tokens << " tokens");
  const int32_t id = s.table[size_t(pos / config_.block_size)];
  return id == kEvictedBlock ? -1 : int64_t(id) * config_.block_size + pos % config_.block_size;
}

void KvBlockPool::slot_mapping(SeqId seq, int64_t first_pos, int64_t n, int64_t* out) const {
  for (int64_t i = 0; i < n; ++i) out[i] = slot(seq, first_pos + i);
}

KvCacheStats KvBlockPool::stats() const {
  KvCacheStats st;
  st.blocks_total = config_.num_blocks;
  st.blocks_free = blocks_free();
  st.blocks_used = blocks_used();
  st.blocks_cached = blocks_cached();
  st.cache_evictions = cache_evictions_;
  st.num_sequences = int32_t(seqs_.size());
  return st;
}

int32_t KvBlockPool::ref_count(int32_t block_id) const {
  TESSERA_CHECK(block_id >= 0 && block_id < config_.num_blocks,
                "KV cache: block id must be in [0, " << config_.num_blocks << "), got " << block_id);
  return ref_counts_[size_t(block_id)];
}

int32_t KvBlockPool::take_block() {
  // Callers checked can_allocate first; running dry here is a bookkeeping bug, not bad input.
  TESSERA_CHECK(!free_blocks_.empty() || !evictable_.empty(), "KV cache: free list empty during allocation");
  int32_t id = 0;
  if (!free_blocks_.empty()) {  // never-cached blocks first: a cached one may still be asked for
    id = free_blocks_.back();
    free_blocks_.pop_back();
  } else {
    id = evictable_.front();  // the least recently released cached block
    uncache(id);
    ++cache_evictions_;
  }
  ref_counts_[size_t(id)] = 1;
  return id;
}

void KvBlockPool::hold_block(int32_t block_id) {
  if (ref_counts_[size_t(block_id)]++ == 0) {
    BlockCacheState& state = cache_state_[size_t(block_id)];
    TESSERA_CHECK(state.key != nullptr, "KV cache: block " << block_id << " is free and not cached");
    evictable_.erase(state.lru);
  }
}

void KvBlockPool::release_block(int32_t block_id) {
  if (--ref_counts_[size_t(block_id)] != 0) return;
  BlockCacheState& state = cache_state_[size_t(block_id)];
  if (state.key != nullptr) {
    state.lru = evictable_.insert(evictable_.end(), block_id);
  } else {
    free_blocks_.push_back(block_id);
  }
}

void KvBlockPool::uncache(int32_t block_id) {
  BlockCacheState& state = cache_state_[size_t(block_id)];
  evictable_.erase(state.lru);
  entries_.erase(entries_.find(*state.key));  // by iterator: the key lives in the erased node
  entry_blocks_.erase(state.entry);
  state = BlockCacheState{};
}

}  // namespace tessera
