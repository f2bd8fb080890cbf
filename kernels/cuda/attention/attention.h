// kernels/cuda/attention/attention.h: the attention ops' dispatch points: prefill over a packed
// varlen batch (each sequence with its own mask policy) and decode over the paged KV cache.
// Host code includes this; kernels are in prefill.cuh / decode.cuh. Stateless and thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/attention_mask.h"
#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// Packed varlen prefill. Sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) and key rows
// [cu_seqlens_k[s], cu_seqlens_k[s+1]); its queries are the last q_len positions of its keys
// (bottom-right aligned, MaskParams' convention). Query head h reads KV head h / (num_heads /
// num_kv_heads) (GQA/MQA). Rows are *_row_stride elements apart (>= heads * head_dim, a multiple of
// 8), so Q, K and V may be views into one fused QKV buffer. A query that sees no key gets 0.
struct PrefillArgs {
  void* out = nullptr;                     // [total_q, out_row_stride]: num_heads * head_dim used
  const void* q = nullptr;                 // [total_q, q_row_stride]
  const void* k = nullptr;                 // [total_k, k_row_stride]: num_kv_heads * head_dim used
  const void* v = nullptr;                 // [total_k, v_row_stride]
  const int32_t* cu_seqlens_q = nullptr;   // [num_seqs + 1], device
  const int32_t* cu_seqlens_k = nullptr;   // [num_seqs + 1], device
  const MaskParams* masks = nullptr;       // [num_seqs], device; segment_ends point to device memory
  int32_t num_seqs = 0;
  int32_t max_seqlen_q = 0;                // upper bound on any q_len (sizes the grid)
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;                    // 32, 64, 128 or 256
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0, out_row_stride = 0;
  float softmax_scale = 0.f;               // usually 1 / sqrt(head_dim)
  // Rows of q (and out) and of k (and v): cu_seqlens_q[num_seqs] and cu_seqlens_k[num_seqs], or more
  // where the matrices have more rows. The Hopper kernel's TMA descriptors span them; left 0, that
  // kernel is not used.
  int32_t total_q = 0, total_k = 0;
  // Two ints of device memory, 0 before the first call (each call leaves them 0), or null. Set, and
  // with more query tiles than SMs, the Hopper kernel runs one persistent CTA per SM that takes work
  // as it frees: the next tile's loads overlap the last one's epilogue, and short masked tiles balance
  // across SMs. Calls sharing them must be stream-ordered.
  int* tile_counters = nullptr;
  // The device's SM count, which sizes that grid; 0: asked of the device at each call (a host call
  // per layer in a prefill step, which a caller that knows it can spare).
  int32_t num_sms = 0;
};

// Which kernel family runs the prefill. kAuto takes the fastest one that supports the shape.
enum class PrefillKernel : int32_t { kAuto = 0, kMmaSync = 1, kHopper = 2 };

cudaError_t prefill_attention(DType dtype, const PrefillArgs& args, cudaStream_t stream,
                              PrefillKernel kernel = PrefillKernel::kAuto);

// Names the first unsupported value ("unsupported head_dim: 96 (supported: 32, 64, 128, 256)"), or "".
std::string prefill_unsupported(DType dtype, const PrefillArgs& args, PrefillKernel kernel = PrefillKernel::kAuto);

// Paged decode: one query token per sequence, attending to its context_lens[s] cached tokens. Token
// t of sequence s lives in block block_tables[s][t / block_size], slot t % block_size. The query is
// the last position (context_len - 1); masks (optional) apply sliding window + sinks, others are
// treated as causal (the whole context). Each KV head is read once for its whole query group.
// The kernel is launched with programmatic dependent launch and, before waiting for the previous
// kernel in the stream, reads block_tables, context_lens, masks and every visible K/V row except each
// sequence's newest (position context_len - 1). Those must be complete before the kernel just ahead
// of the decode starts. Host copies always are; so is every earlier kernel when that kernel ahead is
// launched without PDL or, like every Tessera kernel, releases its dependents only after its own
// griddepcontrol.wait. q and the newest K/V row may come from the kernel just before.
struct DecodeArgs {
  void* out = nullptr;                    // [num_seqs, out_row_stride]: num_heads * head_dim used
  const void* q = nullptr;                // [num_seqs, q_row_stride]: num_heads * head_dim used
  const void* k_cache = nullptr;          // [num_blocks, block_size, num_kv_heads, head_dim] of kv_dtype
  const void* v_cache = nullptr;          // [num_blocks, block_size, num_kv_heads, head_dim] of kv_dtype
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], device
  const int32_t* context_lens = nullptr;  // [num_seqs], device
  const MaskParams* masks = nullptr;      // [num_seqs] or null (all causal), device
  int32_t num_seqs = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;                   // 32, 64, 80, 96, 128 or 256
  int32_t block_size = 0;                 // 16 or 32
  int32_t max_blocks_per_seq = 0;
  int32_t max_context_len = 0;            // upper bound on any context_lens[s] (plans the split)
  float softmax_scale = 0.f;
  // Elements between sequences' rows of q and out (0: num_heads * head_dim, contiguous). Otherwise
  // >= num_heads * head_dim and a multiple of 8, so q can be read straight out of a fused QKV row.
  int64_t q_row_stride = 0;
  int64_t out_row_stride = 0;
  // The fewest tokens a split-KV chunk may have when the batch's splits fit one CTA per SM (a kernel
  // choice the tuner measures: shorter splits fill more SMs at short contexts and cost more merging).
  // 0: kDefaultMinSplitTokens; otherwise a multiple of 32 in [32, 1024].
  int32_t min_split_tokens = 0;
  // Plan every sequence's split as if it decoded alone, so that its output is the same bits in any
  // batch (the split otherwise shortens as the batch grows, which changes the order of the sums). A
  // speculative verify runs a sequence's tokens as rows of one batch: with this, a greedy request's
  // tokens are the ones plain decoding gives. Slower on batches that fewer splits would fill.
  bool split_as_one_sequence = false;
  // The most keys at the end of a sequence's context that the kernel before this one writes (the KV
  // append): 1 in a decode step, where only the newest is and the rest load before waiting for that
  // kernel; more where a step's sequences read one another's new keys (a speculative verify).
  int32_t step_keys = 1;
  // The caches' element type: the activation dtype, or e4m3 (bf16 activations only), which the kernel
  // lands in shared memory as bytes and widens to bf16 tile by tile before its MMAs.
  KvDType kv_dtype = KvDType::kActivation;
};
// 64: on the H100, batch-1 decode of SmolLM2 (3 KV heads) ran 3-6% faster than with 128 in every
// weight format, and the 7B shape (32 KV heads) the same within 1% (bench/results/
// 2026-11-25-h100-decode-split-floor.md).
inline constexpr int32_t kDefaultMinSplitTokens = 64;

// Split-KV scratch: the splits' partial results, which may hold anything between calls, and the
// merge counters, which must be 0 before the first call (zero them once after allocating; each merge
// returns its own to 0). A counter is indexed by (sequence, KV head x head tile) alone, and the
// counters have an array of their own apart from the partials, so where a counter lives does not
// depend on the split count: a call never reads another shape's partial values as its counts, and one
// workspace serves calls of every shape. Calls sharing a workspace must be stream-ordered.
struct DecodeWorkspace {
  void* partials = nullptr;
  size_t partial_bytes = 0;
  int* counters = nullptr;
  int64_t counter_count = 0;
};
// What a call of this shape needs (both 0 when no split is planned).
struct DecodeWorkspaceNeed {
  size_t partial_bytes = 0;
  int64_t counters = 0;
};
DecodeWorkspaceNeed decode_workspace_need(const DecodeArgs& args, int num_sms);
cudaError_t decode_attention(DType dtype, const DecodeArgs& args, const DecodeWorkspace& workspace, int num_sms,
                             cudaStream_t stream);
std::string decode_unsupported(DType dtype, const DecodeArgs& args);

}  // namespace tessera::kernels::cuda
