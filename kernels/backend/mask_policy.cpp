// kernels/backend/mask_policy.cpp: MaskPolicy constructors, RoPE positions and lowering.
#include "kernels/backend/mask_policy.h"

#include <algorithm>

namespace tessera {

MaskPolicy MaskPolicy::bidirectional() {
  MaskPolicy p;
  p.kind = Kind::kBidirectional;
  return p;
}

MaskPolicy MaskPolicy::sliding_window(int32_t window, int32_t sinks) {
  MaskPolicy p;
  p.kind = Kind::kSlidingWindow;
  p.window = window;
  p.sinks = sinks;
  return p;
}

MaskPolicy MaskPolicy::segments(std::vector<int32_t> lengths, int32_t shared_prefix, bool parallel_positions) {
  MaskPolicy p;
  p.kind = Kind::kSegments;
  p.segment_lengths = std::move(lengths);
  p.shared_prefix = shared_prefix;
  p.parallel_positions = parallel_positions;
  return p;
}

int32_t MaskPolicy::rope_position(int32_t p) const {
  if (kind != Kind::kSegments || !parallel_positions || p < shared_prefix) return p;
  int32_t start = shared_prefix;
  int32_t longest = 0;
  for (int32_t len : segment_lengths) {
    if (p < start + len) return shared_prefix + (p - start);
    start += len;
    longest = std::max(longest, len);
  }
  return shared_prefix + longest + (p - start);  // the tail
}

std::string MaskPolicy::name() const {
  switch (kind) {
    case Kind::kCausal: return "causal";
    case Kind::kBidirectional: return "bidirectional";
    case Kind::kSlidingWindow: return "sliding_window";
    case Kind::kSegments: return "segments";
  }
  return "?";
}

kernels::MaskParams MaskPolicy::lower(std::vector<int32_t>& segment_ends) const {
  kernels::MaskParams m;
  switch (kind) {
    case Kind::kCausal:
      m.kind = kernels::MaskKind::kCausal;
      break;
    case Kind::kBidirectional:
      m.kind = kernels::MaskKind::kBidirectional;
      break;
    case Kind::kSlidingWindow:
      m.kind = kernels::MaskKind::kSlidingWindow;
      m.window = window;
      m.sinks = sinks;
      break;
    case Kind::kSegments: {
      m.kind = kernels::MaskKind::kSegments;
      m.shared_prefix = shared_prefix;
      segment_ends.clear();
      int32_t end = shared_prefix;
      for (int32_t len : segment_lengths) {
        end += len;
        segment_ends.push_back(end);
      }
      m.num_segments = static_cast<int32_t>(segment_ends.size());
      m.segment_ends = segment_ends.empty() ? nullptr : segment_ends.data();
      break;
    }
  }
  return m;
}

}  // namespace tessera
