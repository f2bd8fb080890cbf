// engine/kv_cache/prefix_cache_key.h: the prefix cache's block keys. A position's K/V depends on its
// token, its position, and the hidden states of every key its query saw in the layers before, which
// in turn depend on what those keys saw. So a block's key chains the cache entry of the block before
// it (which covers every earlier position), the block's tokens, and for each of its positions the set
// of keys its query sees. Under every mask policy that set is [0, leading) ∪ [lowest, p]
// (kernels::MaskParams::leading_keys / lowest_key): when lowest <= leading it is all of [0, p], the
// causal context, recorded as 0, so a shared prefix or a window not yet full shares blocks with a
// causal request. Otherwise the pair (leading, lowest) is recorded. Last, each position's RoPE
// position where it is not the position itself (segments with parallel positions). Blocks computed
// under another window, segment layout or numbering therefore never match.
#pragma once

#include <cstdint>
#include <span>

#include "engine/kv_cache/kv_block_pool.h"
#include "kernels/attention_mask.h"

namespace tessera {

// Whether a sequence's blocks may be cached at all: not under a bidirectional mask, where a
// position's K/V depends on the tokens after it.
bool prefix_cacheable(const kernels::MaskParams& mask);

// The key of the full block holding positions [first_position, first_position + tokens.size()),
// computed after the block whose cache entry is `parent_entry` (0 for the first block).
// rope_positions: each token's RoPE position, or empty when it is its own position.
BlockKey prefix_block_key(uint64_t parent_entry, std::span<const int32_t> tokens, int64_t first_position,
                          const kernels::MaskParams& mask, std::span<const int32_t> rope_positions = {});

}  // namespace tessera
