// tests/unit/kv_cache/kv_block_pool_test.cpp: KvBlockPool allocation, exhaustion, free, stats,
// prefix sharing, sliding-window eviction checked against kernels::MaskParams::visible, and the
// prefix cache (exact keys, LRU eviction, free counts) with its block keys.
#include "engine/kv_cache/kv_block_pool.h"
#include "engine/kv_cache/prefix_cache_key.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/error_of.h"

namespace tessera {
namespace {

kernels::MaskParams sliding(int32_t window, int32_t sinks) {
  kernels::MaskParams m;
  m.kind = kernels::MaskKind::kSlidingWindow;
  m.window = window;
  m.sinks = sinks;
  return m;
}

TEST(KvCacheConfig, ValidationNamesFieldAndRange) {
  EXPECT_NE(error_of([] { KvCacheConfig{0, 16}.validate(); }).find("kv_cache.num_blocks must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { KvCacheConfig{8, 0}.validate(); }).find("kv_cache.block_size must be in [1, 1024], got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { KvBlockPool pool(KvCacheConfig{8, 2048}); }).find("block_size"), std::string::npos);
  EXPECT_EQ(error_of([] { KvCacheConfig{1, 1}.validate(); }), "");
}

TEST(KvCacheConfig, BytesPerBlock) {
  // SmolLM2-135M, fp32: 2 (K,V) * 30 layers * 16 tokens * 3 heads * 64 dims * 4 bytes.
  EXPECT_EQ(KvCacheConfig::bytes_per_block(16, 30, 3, 64, 4), 2 * 30 * 16 * 3 * 64 * 4);
}

TEST(KvBlockPool, TableGrowsAsTokensAreAppended) {
  KvBlockPool pool(KvCacheConfig{10, 4});
  EXPECT_EQ(pool.blocks_for_tokens(0), 0);
  EXPECT_EQ(pool.blocks_for_tokens(4), 1);
  EXPECT_EQ(pool.blocks_for_tokens(5), 2);

  pool.allocate(7, 5);  // registers seq 7 as causal
  EXPECT_TRUE(pool.has_sequence(7));
  EXPECT_EQ(pool.num_tokens(7), 5);
  ASSERT_EQ(pool.block_table(7).size(), 2u);
  EXPECT_EQ(pool.block_table(7)[0], 0);  // a fresh pool hands out 0, 1, 2, ...
  EXPECT_EQ(pool.block_table(7)[1], 1);
  pool.allocate(7, 3);  // fills block 1 exactly
  EXPECT_EQ(pool.block_table(7).size(), 2u);
  pool.allocate(7, 1);
  EXPECT_EQ(pool.block_table(7).size(), 3u);
  EXPECT_EQ(pool.num_tokens(7), 9);
  pool.allocate(7, 0);
  EXPECT_EQ(pool.num_tokens(7), 9);

  EXPECT_EQ(pool.slot(7, 0), 0);
  EXPECT_EQ(pool.slot(7, 5), 1 * 4 + 1);
  EXPECT_EQ(pool.slot(7, 8), 2 * 4 + 0);
  std::vector<int64_t> slots(3);
  pool.slot_mapping(7, 3, 3, slots.data());
  EXPECT_EQ(slots, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_THROW(pool.slot(7, 9), Error);
  EXPECT_THROW(pool.slot(7, -1), Error);
  EXPECT_THROW(pool.num_tokens(8), Error);
}

TEST(KvBlockPool, StatsAndUsage) {
  KvBlockPool pool(KvCacheConfig{8, 16});
  EXPECT_EQ(pool.blocks_free(), 8);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  pool.allocate(1, 33);  // 3 blocks
  pool.allocate(2, 16);  // 1 block
  KvCacheStats st = pool.stats();
  EXPECT_EQ(st.blocks_total, 8);
  EXPECT_EQ(st.blocks_used, 4);
  EXPECT_EQ(st.blocks_free, 4);
  EXPECT_EQ(st.num_sequences, 2);
  EXPECT_DOUBLE_EQ(st.usage(), 0.5);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.5);
  pool.free(1);
  EXPECT_EQ(pool.blocks_used(), 1);
  EXPECT_FALSE(pool.has_sequence(1));
  EXPECT_EQ(pool.stats().num_sequences, 1);
}

TEST(KvBlockPool, ExhaustionChangesNothingAndSaysWhy) {
  KvBlockPool pool(KvCacheConfig{4, 4});
  pool.allocate(1, 12);  // 3 blocks
  EXPECT_TRUE(pool.can_allocate(1, 4));
  EXPECT_FALSE(pool.can_allocate(1, 5));
  EXPECT_FALSE(pool.can_allocate(2, 5));
  EXPECT_TRUE(pool.can_allocate(2, 4));

  EXPECT_FALSE(pool.try_allocate(1, 5));
  EXPECT_EQ(pool.num_tokens(1), 12);
  EXPECT_EQ(pool.block_table(1).size(), 3u);
  EXPECT_EQ(pool.blocks_free(), 1);
  EXPECT_FALSE(pool.try_allocate(2, 8));
  EXPECT_FALSE(pool.has_sequence(2));  // a failed first allocation registers nothing

  const std::string msg = error_of([&] { pool.allocate(1, 6); });
  EXPECT_NE(msg.find("KV cache exhausted: sequence 1 needs 2 more block(s) of 4 tokens for 6 token(s), 1 of 4 free"),
            std::string::npos)
      << msg;

  // A partially filled last block still takes tokens without a new block.
  pool.allocate(1, 4);
  EXPECT_EQ(pool.blocks_free(), 0);
  EXPECT_TRUE(pool.can_allocate(2, 0));
  EXPECT_FALSE(pool.can_allocate(2, 1));
  EXPECT_THROW(pool.can_allocate(2, -1), Error);
  EXPECT_FALSE(pool.can_allocate(2, int64_t(1) << 40));  // no int32 wrap-around
  EXPECT_FALSE(pool.try_allocate(1, int64_t(1) << 40));
}

TEST(KvBlockPool, FreeReturnsBlocksAndReusesThemFirst) {
  KvBlockPool pool(KvCacheConfig{6, 2});
  pool.allocate(1, 4);  // blocks 0, 1
  pool.allocate(2, 4);  // blocks 2, 3
  pool.free(1);
  pool.free(1);   // unknown now: no-op
  pool.free(99);  // never known: no-op
  EXPECT_EQ(pool.blocks_free(), 4);
  EXPECT_EQ(pool.ref_count(0), 0);
  EXPECT_EQ(pool.ref_count(2), 1);
  pool.allocate(3, 4);
  // LIFO: the blocks seq 1 just gave back come first (warm in cache), last freed first; free()
  // gives a sequence's blocks back from its last one, so its first block is the last freed.
  EXPECT_EQ(pool.block_table(3)[0], 0);
  EXPECT_EQ(pool.block_table(3)[1], 1);
  // Preemption: free all, then re-admit from scratch.
  pool.free(2);
  pool.free(3);
  EXPECT_EQ(pool.blocks_free(), 6);
  EXPECT_TRUE(pool.can_allocate(4, 12));
  EXPECT_THROW(pool.ref_count(6), Error);
}

TEST(KvBlockPool, RegistrationErrors) {
  KvBlockPool pool(KvCacheConfig{4, 4});
  pool.add_sequence(1);
  EXPECT_THROW(pool.add_sequence(1), Error);
  EXPECT_NE(error_of([&] { pool.add_sequence(2, sliding(0, 0)); }).find("sliding_window.window must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pool.add_sequence(3, sliding(4, -1)); }).find("sliding_window.sinks must be >= 0, got -1"),
            std::string::npos);
  EXPECT_FALSE(pool.has_sequence(2));
}

TEST(KvBlockPool, CausalAndOtherMasksNeverEvict) {
  KvBlockPool pool(KvCacheConfig{64, 4});
  pool.allocate(1, 100);
  EXPECT_EQ(pool.evict_outside_window(1, 100), 0);
  kernels::MaskParams bidir;
  bidir.kind = kernels::MaskKind::kBidirectional;
  pool.add_sequence(2, bidir);
  pool.allocate(2, 20);
  pool.allocate(2, 1);
  for (int32_t id : pool.block_table(2)) EXPECT_NE(id, kEvictedBlock);
}

// Prefill keeps everything: its own early queries still see the first keys.
TEST(KvBlockPool, SlidingWindowPrefillKeepsAllThenDecodeEvicts) {
  KvBlockPool pool(KvCacheConfig{64, 4});
  pool.add_sequence(1, sliding(/*window=*/8, /*sinks=*/0));
  pool.allocate(1, 32);  // prefill positions 0..31: 8 blocks, none evicted
  EXPECT_EQ(pool.blocks_used(), 8);
  // Decode the query at 32: it sees keys 25..32, so blocks 0..5 (positions 0..23) are dead; block 6
  // (24..27) still holds 25..27.
  pool.allocate(1, 1);
  std::span<const int32_t> t = pool.block_table(1);
  ASSERT_EQ(t.size(), 9u);
  for (size_t b = 0; b < 6; ++b) EXPECT_EQ(t[b], kEvictedBlock) << b;
  for (size_t b = 6; b < 9; ++b) EXPECT_NE(t[b], kEvictedBlock) << b;
  EXPECT_EQ(pool.blocks_used(), 3);
  EXPECT_EQ(pool.slot(1, 0), -1);
  EXPECT_EQ(pool.slot(1, 23), -1);
  EXPECT_GE(pool.slot(1, 24), 0);
  EXPECT_EQ(pool.num_tokens(1), 33);  // positions stay addressable
}

TEST(KvBlockPool, SinksKeepTheirBlocks) {
  KvBlockPool pool(KvCacheConfig{64, 4});
  pool.add_sequence(1, sliding(/*window=*/4, /*sinks=*/5));  // sinks 0..4 touch blocks 0 and 1
  pool.allocate(1, 40);
  EXPECT_EQ(pool.evict_outside_window(1, 40), 7);  // lowest visible key 37: blocks 2..8 go
  std::span<const int32_t> t = pool.block_table(1);
  EXPECT_NE(t[0], kEvictedBlock);
  EXPECT_NE(t[1], kEvictedBlock);
  for (size_t b = 2; b < 9; ++b) EXPECT_EQ(t[b], kEvictedBlock) << b;
  EXPECT_NE(t[9], kEvictedBlock);
  EXPECT_EQ(pool.evict_outside_window(1, 40), 0);  // idempotent
  EXPECT_EQ(pool.blocks_used(), 3);
}

TEST(KvBlockPool, WindowEdgeCases) {
  struct Case {
    int32_t block_size, window, sinks;
    int64_t first_query, num_tokens;
    int32_t expect_evicted;
  };
  const Case cases[] = {
      {4, 1, 0, 8, 9, 2},     // window 1: only q itself; keys 0..7 dead = blocks 0, 1
      {4, 4, 0, 8, 9, 1},     // window == block: lowest key 5, block 0 dead, block 1 (4..7) holds 5..7
      {4, 5, 0, 8, 9, 1},     // lowest key 4: block 0 dead exactly at its edge
      {4, 6, 0, 8, 9, 0},     // lowest key 3: block 0 still needed
      {4, 100, 0, 50, 51, 0}, // window longer than the sequence
      {4, 1, 4, 12, 13, 2},   // sinks fill block 0 exactly: blocks 1, 2 go
      {4, 1, 3, 12, 13, 2},   // sinks end inside block 0: it stays
      {4, 1, 5, 12, 13, 1},   // sinks spill into block 1: it stays, block 2 goes
      {4, 2, 40, 12, 13, 0},  // sinks larger than the sequence: everything is a sink
      {1, 3, 2, 10, 11, 6},   // block size 1: keys 2..7 dead
      {16, 4096, 4, 5000, 5001, 55},  // Mistral-like: lowest key 905 -> blocks 1..55 (block 0 has sinks)
  };
  for (const Case& c : cases) {
    KvBlockPool pool(KvCacheConfig{1024, c.block_size});
    pool.add_sequence(1, sliding(c.window, c.sinks));
    pool.allocate(1, c.num_tokens);
    EXPECT_EQ(pool.evict_outside_window(1, c.first_query), c.expect_evicted)
        << "block " << c.block_size << " window " << c.window << " sinks " << c.sinks;
  }
}

// Decode token by token under many (block, window, sinks): after every step, no evicted position is
// visible to any later query, every position visible to the next query is resident, and residency
// stays bounded by the window plus the sink blocks.
TEST(KvBlockPool, EvictionMatchesMaskParamsExactly) {
  for (int32_t bs : {1, 2, 4, 5, 16}) {
    for (int32_t window : {1, 2, 3, 4, 7, 16, 33}) {
      for (int32_t sinks : {0, 1, 4, 6}) {
        const kernels::MaskParams mask = sliding(window, sinks);
        KvBlockPool pool(KvCacheConfig{4096, bs});
        pool.add_sequence(1, mask);
        pool.allocate(1, 10);  // prefill
        for (int32_t step = 0; step < 90; ++step) {
          const int64_t q = pool.num_tokens(1);  // the query this step computes
          pool.allocate(1, 1);
          for (int64_t k = 0; k <= q; ++k) {
            const bool resident = pool.slot(1, k) >= 0;
            if (mask.visible(int32_t(q), int32_t(k))) {
              ASSERT_TRUE(resident) << "bs " << bs << " window " << window << " sinks " << sinks << " q " << q
                                    << " k " << k;
            }
            if (!resident) {
              for (int64_t later = q; later < q + 64; ++later) {
                ASSERT_FALSE(mask.visible(int32_t(later), int32_t(k)));
              }
            }
          }
          const int32_t bound = (sinks + bs - 1) / bs + (window + bs - 1) / bs + 1;
          ASSERT_LE(pool.blocks_used(), bound) << "bs " << bs << " window " << window << " sinks " << sinks;
        }
      }
    }
  }
}

// A pool that only fits the window decodes forever: can_allocate counts the blocks allocate() will
// release first.
TEST(KvBlockPool, WindowedSequenceDecodesInASmallPool) {
  KvBlockPool pool(KvCacheConfig{3, 4});
  pool.add_sequence(1, sliding(/*window=*/4, /*sinks=*/0));
  pool.allocate(1, 8);  // 2 blocks
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(pool.can_allocate(1, 1)) << i;
    pool.allocate(1, 1);
  }
  EXPECT_EQ(pool.num_tokens(1), 1008);
  EXPECT_LE(pool.blocks_used(), 3);
  pool.free(1);
  EXPECT_EQ(pool.blocks_free(), 3);
}

TEST(KvBlockPool, SharedPrefixIsRefCounted) {
  KvBlockPool pool(KvCacheConfig{8, 4});
  pool.allocate(1, 10);  // blocks 0, 1, 2
  EXPECT_THROW(pool.share_prefix(1, 2, 6), Error);   // not whole blocks
  EXPECT_THROW(pool.share_prefix(1, 2, 12), Error);  // more than seq 1 holds
  pool.share_prefix(1, 2, 8);
  EXPECT_EQ(pool.num_tokens(2), 8);
  EXPECT_EQ(pool.block_table(2)[0], pool.block_table(1)[0]);
  EXPECT_EQ(pool.ref_count(pool.block_table(1)[0]), 2);
  EXPECT_EQ(pool.blocks_used(), 3);
  pool.allocate(2, 1);  // dst grows into a private block
  EXPECT_EQ(pool.blocks_used(), 4);
  EXPECT_NE(pool.block_table(2)[2], pool.block_table(1)[2]);
  pool.free(1);
  EXPECT_EQ(pool.blocks_used(), 3);  // shared blocks survive
  EXPECT_EQ(pool.ref_count(pool.block_table(2)[0]), 1);
  pool.free(2);
  EXPECT_EQ(pool.blocks_used(), 0);
  EXPECT_THROW(pool.share_prefix(1, 3, 0), Error);  // unknown src
}

TEST(KvBlockPool, EvictingASharedBlockOnlyDropsAReference) {
  KvBlockPool pool(KvCacheConfig{16, 4});
  pool.allocate(1, 16);
  pool.share_prefix(1, 2, 16, sliding(4, 0));
  pool.allocate(2, 1);  // seq 2 at query 16 no longer needs blocks 0..2
  EXPECT_EQ(pool.block_table(2)[0], kEvictedBlock);
  EXPECT_NE(pool.block_table(1)[0], kEvictedBlock);
  EXPECT_EQ(pool.ref_count(pool.block_table(1)[0]), 1);
  EXPECT_EQ(pool.blocks_used(), 5);  // 4 of seq 1 + 1 new of seq 2
  EXPECT_THROW(pool.share_prefix(2, 3, 4), Error);  // evicted block cannot be shared
}

// ---- the prefix cache ----

BlockKey key_of(uint64_t parent, std::vector<int32_t> tokens, int64_t first = 0, kernels::MaskParams mask = {}) {
  return prefix_block_key(parent, tokens, first, mask);
}

TEST(PrefixCache, CachedBlocksOutliveTheirSequenceAndAreFoundByExactKey) {
  KvBlockPool pool(KvCacheConfig{4, 2});
  pool.allocate(1, 5);  // blocks 0, 1 full; block 2 partial
  const uint64_t e0 = pool.cache_block(1, 0, key_of(0, {7, 8}));
  const uint64_t e1 = pool.cache_block(1, 1, key_of(e0, {9, 10}, 2));
  EXPECT_NE(e0, e1);
  EXPECT_THROW(pool.cache_block(1, 2, key_of(e1, {11, 0}, 4)), Error);  // not full
  EXPECT_EQ(pool.cache_block(1, 0, key_of(0, {7, 8})), e0);  // again: the same entry
  pool.free(1);
  EXPECT_EQ(pool.blocks_used(), 0);
  EXPECT_EQ(pool.blocks_free(), 4);  // cached blocks count as free
  EXPECT_EQ(pool.blocks_cached(), 2);

  const auto hit0 = pool.find_cached(key_of(0, {7, 8}));
  ASSERT_TRUE(hit0.has_value());
  EXPECT_EQ(hit0->entry, e0);
  EXPECT_FALSE(pool.find_cached(key_of(0, {7, 9})).has_value());        // another token
  EXPECT_FALSE(pool.find_cached(key_of(e0 + 7, {9, 10}, 2)).has_value());  // another parent
  const auto hit1 = pool.find_cached(key_of(e0, {9, 10}, 2));
  ASSERT_TRUE(hit1.has_value());

  const std::vector<int32_t> blocks = {hit0->block, hit1->block};
  EXPECT_EQ(pool.count_unheld(blocks), 2);
  pool.add_sequence_with_cached(2, blocks);
  EXPECT_EQ(pool.num_tokens(2), 4);
  EXPECT_EQ(pool.ref_count(hit0->block), 1);
  EXPECT_EQ(pool.blocks_free(), 2);
  EXPECT_EQ(pool.count_unheld(blocks), 0);
  pool.allocate(2, 1);
  EXPECT_EQ(pool.block_table(2).size(), 3u);
  EXPECT_THROW(pool.add_sequence_with_cached(3, std::vector<int32_t>{pool.block_table(2)[2]}), Error);  // not cached
}

TEST(PrefixCache, EvictionTakesTheLeastRecentlyReleasedAndDeepestFirst) {
  KvBlockPool pool(KvCacheConfig{4, 1});
  pool.allocate(1, 2);
  const uint64_t a0 = pool.cache_block(1, 0, key_of(0, {1}));
  pool.cache_block(1, 1, key_of(a0, {2}, 1));
  pool.allocate(2, 2);
  const uint64_t b0 = pool.cache_block(2, 0, key_of(0, {5}));
  pool.cache_block(2, 1, key_of(b0, {6}, 1));
  pool.free(1);  // released first: its deeper block, then its first
  pool.free(2);
  EXPECT_EQ(pool.blocks_cached(), 4);
  pool.allocate(3, 1);  // no never-used block left: evicts seq 1's second block
  EXPECT_EQ(pool.cache_evictions(), 1);
  EXPECT_TRUE(pool.find_cached(key_of(0, {1})).has_value());
  EXPECT_FALSE(pool.find_cached(key_of(a0, {2}, 1)).has_value());
  pool.allocate(3, 1);  // then seq 1's first
  EXPECT_FALSE(pool.find_cached(key_of(0, {1})).has_value());
  EXPECT_TRUE(pool.find_cached(key_of(0, {5})).has_value());
  EXPECT_EQ(pool.stats().cache_evictions, 2);
  EXPECT_EQ(pool.stats().blocks_cached, 2);
}

TEST(PrefixCache, HeldCachedBlocksAreNeverEvicted) {
  KvBlockPool pool(KvCacheConfig{2, 1});
  pool.allocate(1, 1);
  pool.cache_block(1, 0, key_of(0, {3}));
  pool.free(1);
  const auto hit = pool.find_cached(key_of(0, {3}));
  ASSERT_TRUE(hit.has_value());
  pool.add_sequence_with_cached(2, std::vector<int32_t>{hit->block});
  EXPECT_FALSE(pool.can_allocate(3, 2));  // one block left, the held one is not evictable
  pool.allocate(3, 1);
  EXPECT_TRUE(pool.find_cached(key_of(0, {3})).has_value());
  EXPECT_FALSE(pool.try_allocate(4, 1));
}

TEST(PrefixCache, KeysRecordExactlyWhatEachPositionSaw) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  kernels::MaskParams causal;
  // A window not yet full, or one whose sinks reach its lowest key, sees what causal sees.
  EXPECT_EQ(key_of(0, tokens, 0, sliding(8, 0)), key_of(0, tokens, 0, causal));
  EXPECT_EQ(key_of(0, tokens, 4, sliding(8, 0)), key_of(0, tokens, 4, causal));  // positions 4..7
  EXPECT_NE(key_of(0, tokens, 8, sliding(8, 0)), key_of(0, tokens, 8, causal));  // position 8 drops key 0
  EXPECT_EQ(key_of(0, {1}, 8, sliding(8, 1)), key_of(0, {1}, 8, causal));  // a sink keeps key 0
  EXPECT_NE(key_of(0, {1}, 9, sliding(8, 1)), key_of(0, {1}, 9, causal));  // but not key 1
  EXPECT_NE(key_of(0, tokens, 12, sliding(8, 1)), key_of(0, tokens, 12, sliding(8, 2)));
  EXPECT_NE(key_of(0, tokens, 12, sliding(8, 0)), key_of(0, tokens, 12, sliding(6, 0)));

  // Segments: the shared prefix and the first segment see what causal sees; later segments do not,
  // and two layouts that place a boundary elsewhere differ.
  const std::vector<int32_t> ends_a = {6, 10}, ends_b = {7, 10};
  kernels::MaskParams seg_a, seg_b;
  seg_a.kind = seg_b.kind = kernels::MaskKind::kSegments;
  seg_a.shared_prefix = seg_b.shared_prefix = 2;
  seg_a.num_segments = seg_b.num_segments = 2;
  seg_a.segment_ends = ends_a.data();
  seg_b.segment_ends = ends_b.data();
  EXPECT_EQ(key_of(0, tokens, 0, seg_a), key_of(0, tokens, 0, causal));
  EXPECT_EQ(key_of(0, tokens, 2, seg_a), key_of(0, tokens, 2, causal));  // prefix 0..1, segment 0 is 2..5
  EXPECT_NE(key_of(0, tokens, 4, seg_a), key_of(0, tokens, 4, causal));  // 6..7 start segment 1
  EXPECT_NE(key_of(0, tokens, 4, seg_a), key_of(0, tokens, 4, seg_b));
  EXPECT_EQ(key_of(0, tokens, 10, seg_a), key_of(0, tokens, 10, causal));  // the tail sees everything

  // Another RoPE numbering of the same positions (parallel segments) is another key.
  const std::vector<int32_t> renumbered = {4, 5, 2, 3};
  EXPECT_NE(prefix_block_key(0, tokens, 4, seg_a, renumbered), key_of(0, tokens, 4, seg_a));
  const std::vector<int32_t> own = {4, 5, 6, 7};
  EXPECT_EQ(prefix_block_key(0, tokens, 4, seg_a, own), key_of(0, tokens, 4, seg_a));

  kernels::MaskParams bidirectional;
  bidirectional.kind = kernels::MaskKind::kBidirectional;
  EXPECT_FALSE(prefix_cacheable(bidirectional));
  EXPECT_THROW(key_of(0, tokens, 0, bidirectional), Error);
}

}  // namespace
}  // namespace tessera
