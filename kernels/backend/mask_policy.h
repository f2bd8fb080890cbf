// kernels/backend/mask_policy.h: MaskPolicy, the per-request attention policy a user asks for
// (causal, bidirectional, sliding_window{window, sinks}, segments{lengths, shared_prefix}), its RoPE
// positions and its lowering to kernels::MaskParams. It knows no wire format: the front ends parse
// requests into it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention_mask.h"

namespace tessera {

struct MaskPolicy {
  enum class Kind { kCausal, kBidirectional, kSlidingWindow, kSegments };
  Kind kind = Kind::kCausal;
  int32_t window = 0;  // kSlidingWindow: q sees k when q - window < k <= q
  int32_t sinks = 0;   // kSlidingWindow: the first `sinks` positions stay visible
  std::vector<int32_t> segment_lengths;  // kSegments: lengths of the segments after the prefix
  int32_t shared_prefix = 0;             // kSegments: leading tokens every segment sees
  // kSegments: every segment's RoPE positions start at shared_prefix, as in Parallel Context
  // Windows, and the tail's continue after the longest segment. A segment's K/V then depends only
  // on the prefix and its own tokens, wherever it sits, so it can be reused in any order.
  bool parallel_positions = false;

  static MaskPolicy causal() { return {}; }
  static MaskPolicy bidirectional();
  static MaskPolicy sliding_window(int32_t window, int32_t sinks = 0);
  static MaskPolicy segments(std::vector<int32_t> lengths, int32_t shared_prefix = 0, bool parallel_positions = false);

  std::string name() const;  // "causal", "sliding_window", ...

  // The RoPE position of the token at index p of the sequence: p, except under parallel positions.
  int32_t rope_position(int32_t p) const;

  // Lowers to the kernel form. segment_ends receives the absolute exclusive segment ends that the
  // returned MaskParams points at; it must outlive the MaskParams and not be resized.
  kernels::MaskParams lower(std::vector<int32_t>& segment_ends) const;
};

}  // namespace tessera
