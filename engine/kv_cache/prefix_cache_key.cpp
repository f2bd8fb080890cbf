// engine/kv_cache/prefix_cache_key.cpp: prefix_block_key (see prefix_cache_key.h).
#include "engine/kv_cache/prefix_cache_key.h"

#include "common/error.h"

namespace tessera {

bool prefix_cacheable(const kernels::MaskParams& mask) { return mask.kind != kernels::MaskKind::kBidirectional; }

BlockKey prefix_block_key(uint64_t parent_entry, std::span<const int32_t> tokens, int64_t first_position,
                          const kernels::MaskParams& mask, std::span<const int32_t> rope_positions) {
  TESSERA_CHECK(prefix_cacheable(mask), "prefix cache: a bidirectional block has no prefix key");
  TESSERA_CHECK(rope_positions.empty() || rope_positions.size() == tokens.size(),
                "prefix cache: " << rope_positions.size() << " RoPE positions for " << tokens.size() << " tokens");
  BlockKey key;
  key.words.reserve(1 + 3 * tokens.size());
  key.words.push_back(static_cast<int64_t>(parent_entry));
  for (int32_t t : tokens) key.words.push_back(t);
  const int64_t leading = mask.leading_keys();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t lowest = mask.lowest_key(static_cast<int32_t>(first_position + static_cast<int64_t>(i)));
    // Both fit in 31 bits (positions are int32); lowest > leading >= 0 makes the word non-zero.
    key.words.push_back(lowest <= leading ? 0 : (leading << 32) | lowest);
  }
  for (size_t i = 0; i < rope_positions.size(); ++i) {
    const int64_t shift = rope_positions[i] - (first_position + static_cast<int64_t>(i));
    if (shift != 0) key.words.push_back((static_cast<int64_t>(i) << 32) | (shift & 0xffffffff));
  }
  return key;
}

}  // namespace tessera
