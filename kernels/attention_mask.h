// kernels/attention_mask.h: which keys a query may see, per sequence. The one definition of the mask
// policies' semantics at kernel level, shared by the CPU reference and the CUDA kernels.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TESSERA_HOST_DEVICE inline
#endif

namespace tessera::kernels {

enum class MaskKind : int32_t { kCausal = 0, kBidirectional = 1, kSlidingWindow = 2, kSegments = 3 };

// Positions are absolute within one sequence: keys are 0..kv_len-1 and the q_len queries are the
// last q_len positions (query i sits at position kv_len - q_len + i), as in FlashAttention's
// bottom-right alignment. That covers prefill (q_len == kv_len), chunked prefill and decode.
struct MaskParams {
  MaskKind kind = MaskKind::kCausal;
  // kSlidingWindow: q sees k when q - window < k <= q (window counts q itself, as Mistral and
  // transformers mean it), and also every k < sinks with k <= q (attention sinks).
  int32_t window = 0;
  int32_t sinks = 0;
  // kSegments: the sequence is [shared prefix][segment 0]...[segment n-1][tail]. All causal. A
  // prefix token sees the prefix; a segment token sees the prefix and its own segment; a tail token
  // (the question and every generated token) sees everything before it.
  int32_t shared_prefix = 0;
  int32_t num_segments = 0;
  const int32_t* segment_ends = nullptr;  // [num_segments] exclusive end positions, ascending, > shared_prefix;
                                          // host or device memory, matching the kernel that reads it

  TESSERA_HOST_DEVICE int32_t segments_end() const {
    return num_segments > 0 ? segment_ends[num_segments - 1] : shared_prefix;
  }
  // First position of the segment holding p (p in [shared_prefix, segments_end())).
  TESSERA_HOST_DEVICE int32_t segment_start(int32_t p) const {
    int32_t start = shared_prefix;
    for (int32_t i = 0; i < num_segments; ++i) {
      if (p < segment_ends[i]) return start;
      start = segment_ends[i];
    }
    return start;
  }

  TESSERA_HOST_DEVICE bool visible(int32_t q, int32_t k) const {
    switch (kind) {
      case MaskKind::kBidirectional:
        return true;
      case MaskKind::kCausal:
        return k <= q;
      case MaskKind::kSlidingWindow:
        return k <= q && (k > q - window || k < sinks);
      case MaskKind::kSegments:
        if (k > q) return false;
        if (k < shared_prefix || q >= segments_end()) return true;
        return k >= segment_start(q);
    }
    return false;
  }

  // Smallest key a query at position q may see, ignoring sinks and the shared prefix (which are
  // always [0, sinks) / [0, shared_prefix)). Lets a kernel visit only the keys in
  // [lowest_key(q), q] plus the leading sink/prefix range.
  TESSERA_HOST_DEVICE int32_t lowest_key(int32_t q) const {
    switch (kind) {
      case MaskKind::kSlidingWindow:
        return q - window + 1 > 0 ? q - window + 1 : 0;
      case MaskKind::kSegments:
        if (q < shared_prefix || q >= segments_end()) return 0;
        return segment_start(q);
      default:
        return 0;
    }
  }
  // Number of leading keys every (later) query sees regardless of distance: sinks or shared prefix.
  TESSERA_HOST_DEVICE int32_t leading_keys() const {
    if (kind == MaskKind::kSlidingWindow) return sinks;
    if (kind == MaskKind::kSegments) return shared_prefix;
    return 0;
  }
};

}  // namespace tessera::kernels
