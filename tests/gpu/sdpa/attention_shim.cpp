// tests/gpu/sdpa/attention_shim.cpp: a C ABI over the attention kernels, so that
// test_attention_vs_sdpa.py can call them through ctypes on torch's device pointers. Each function
// runs one op on the given stream, waits for it, and returns "" or what went wrong (a thread-local
// string, valid until the thread's next call).
//
// Mask policies come as host int32 rows of kMaskFields per sequence (kind, window, sinks,
// shared_prefix, num_segments); segment_ends is a device int32 array holding every sequence's segment
// ends back to back, in sequence order (null when no sequence has segments). dtype is DType's value
// (0 bf16, 1 fp16), kernel PrefillKernel's (0 auto, 1 mma.sync, 2 Hopper).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention_mask.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/kv_cache/kv_cache.h"

#define TESSERA_SHIM_API extern "C" __attribute__((visibility("default")))

namespace {

namespace kc = tessera::kernels::cuda;
using tessera::kernels::MaskKind;
using tessera::kernels::MaskParams;

constexpr int kMaskFields = 5;

const char* report(std::string message) {
  thread_local std::string last;
  last = std::move(message);
  return last.c_str();
}

std::string cuda_failure(const char* what, cudaError_t error) {
  return std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
}

// Device memory owned by one call; the call has waited for its work before this frees it.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  cudaError_t allocate(size_t bytes) { return cudaMalloc(&ptr_, bytes > 0 ? bytes : 16); }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// The launch's status, then whatever the work did on the device.
std::string wait_for(const char* op, cudaError_t launched, cudaStream_t stream) {
  if (launched != cudaSuccess) return cuda_failure(op, launched);
  if (const cudaError_t done = cudaStreamSynchronize(stream); done != cudaSuccess) return cuda_failure(op, done);
  return "";
}

std::string masks_from_rows(const int32_t* rows, int num_seqs, const int32_t* segment_ends,
                            std::vector<MaskParams>& masks) {
  masks.assign(num_seqs, MaskParams{});
  int64_t next_end = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int32_t* row = rows + static_cast<int64_t>(s) * kMaskFields;
    if (row[0] < 0 || row[0] > static_cast<int32_t>(MaskKind::kSegments))
      return "sequence " + std::to_string(s) + ": unknown mask kind " + std::to_string(row[0]);
    if (row[4] > 0 && segment_ends == nullptr)
      return "sequence " + std::to_string(s) + " has segments but no segment_ends";
    masks[s].kind = static_cast<MaskKind>(row[0]);
    masks[s].window = row[1];
    masks[s].sinks = row[2];
    masks[s].shared_prefix = row[3];
    masks[s].num_segments = row[4];
    masks[s].segment_ends = row[4] > 0 ? segment_ends + next_end : nullptr;
    next_end += row[4];
  }
  return "";
}

// The policies as the kernels read them: MaskParams in device memory, pointing into segment_ends.
std::string upload_masks(const int32_t* rows, int num_seqs, const int32_t* segment_ends, DeviceMemory& device,
                         cudaStream_t stream) {
  std::vector<MaskParams> masks;
  if (std::string e = masks_from_rows(rows, num_seqs, segment_ends, masks); !e.empty()) return e;
  const size_t bytes = masks.size() * sizeof(MaskParams);
  if (const cudaError_t e = device.allocate(bytes); e != cudaSuccess) return cuda_failure("mask allocation", e);
  // Waited for here: the host vector goes out of scope when this returns.
  return wait_for("mask upload", cudaMemcpyAsync(device.get(), masks.data(), bytes, cudaMemcpyHostToDevice, stream),
                  stream);
}

// Contiguous rows: q and out num_heads * head_dim wide, k and v num_kv_heads * head_dim.
kc::PrefillArgs packed_prefill_args(void* out, const void* q, const void* k, const void* v, const int32_t* cu_seqlens_q,
                                    const int32_t* cu_seqlens_k, int num_seqs, int max_seqlen_q, int total_q,
                                    int total_k, int num_heads, int num_kv_heads, int head_dim, float softmax_scale) {
  kc::PrefillArgs args;
  args.out = out;
  args.q = q;
  args.k = k;
  args.v = v;
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  args.num_seqs = num_seqs;
  args.max_seqlen_q = max_seqlen_q;
  args.num_heads = num_heads;
  args.num_kv_heads = num_kv_heads;
  args.head_dim = head_dim;
  args.q_row_stride = args.out_row_stride = static_cast<int64_t>(num_heads) * head_dim;
  args.k_row_stride = args.v_row_stride = static_cast<int64_t>(num_kv_heads) * head_dim;
  args.softmax_scale = softmax_scale;
  // Set, so that the Hopper kernel (which needs them for its TMA descriptors) may run.
  args.total_q = total_q;
  args.total_k = total_k;
  return args;
}

// Uploads the masks into args and runs the prefill on the chosen kernel family.
std::string run_prefill(int dtype, int kernel, kc::PrefillArgs args, const int32_t* mask_rows,
                        const int32_t* segment_ends, cudaStream_t stream) {
  DeviceMemory masks;
  if (std::string e = upload_masks(mask_rows, args.num_seqs, segment_ends, masks, stream); !e.empty()) return e;
  args.masks = static_cast<const MaskParams*>(masks.get());
  const auto type = static_cast<kc::DType>(dtype);
  const auto family = static_cast<kc::PrefillKernel>(kernel);
  if (std::string why = kc::prefill_unsupported(type, args, family); !why.empty()) return "prefill: " + why;
  return wait_for("prefill_attention", kc::prefill_attention(type, args, stream, family), stream);
}

// The split-KV scratch decode_attention needs for args, zeroed counters included, then the decode.
std::string run_decode(kc::DType type, const kc::DecodeArgs& args, cudaStream_t stream) {
  int device = 0, num_sms = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_failure("cudaGetDevice", e);
  if (const cudaError_t e = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return cuda_failure("SM count", e);
  const kc::DecodeWorkspaceNeed need = kc::decode_workspace_need(args, num_sms);
  const size_t counter_bytes = static_cast<size_t>(need.counters) * sizeof(int);
  DeviceMemory partials, counters;
  if (const cudaError_t e = partials.allocate(need.partial_bytes); e != cudaSuccess)
    return cuda_failure("decode partials", e);
  if (const cudaError_t e = counters.allocate(counter_bytes); e != cudaSuccess)
    return cuda_failure("decode counters", e);
  // The decode launches with programmatic dependent launch and reads tables, lengths, masks and K/V
  // before waiting for the work ahead of it in the stream (torch's kernels that wrote them, the
  // counter reset): waiting here has all of it complete first.
  const cudaError_t reset = cudaMemsetAsync(counters.get(), 0, counter_bytes, stream);
  if (std::string e = wait_for("decode counter reset", reset, stream); !e.empty()) return e;
  const kc::DecodeWorkspace workspace{partials.get(), need.partial_bytes, static_cast<int*>(counters.get()),
                                      need.counters};
  return wait_for("decode_attention", kc::decode_attention(type, args, workspace, num_sms, stream), stream);
}

}  // namespace

// Varlen prefill over packed q [total_q, num_heads * head_dim] and k, v [total_k, num_kv_heads * head_dim].
TESSERA_SHIM_API const char* tessera_shim_prefill(int dtype, int kernel, void* out, const void* q, const void* k,
                                                  const void* v, const int32_t* cu_seqlens_q,
                                                  const int32_t* cu_seqlens_k, int num_seqs, int max_seqlen_q,
                                                  int total_q, int total_k, int num_heads, int num_kv_heads,
                                                  int head_dim, const int32_t* mask_rows,
                                                  const int32_t* segment_ends, float softmax_scale, void* stream) {
  const kc::PrefillArgs args = packed_prefill_args(out, q, k, v, cu_seqlens_q, cu_seqlens_k, num_seqs, max_seqlen_q,
                                                   total_q, total_k, num_heads, num_kv_heads, head_dim, softmax_scale);
  return report(run_prefill(dtype, kernel, args, mask_rows, segment_ends, static_cast<cudaStream_t>(stream)));
}

// Chunked prefill over the paged cache, as the CUDA backend runs it: each sequence's keys (its earlier
// chunks and this one, already in the cache) are gathered into contiguous rows, then the prefill runs
// with q_len < kv_len (the queries are the last q_len positions). Caches are [num_blocks, block_size,
// num_kv_heads, head_dim]; block_tables [num_seqs, max_blocks_per_seq] and cu_seqlens_* on the device.
TESSERA_SHIM_API const char* tessera_shim_chunked_prefill(
    int dtype, int kernel, void* out, const void* q, const void* k_cache, const void* v_cache, int num_blocks,
    int block_size, const int32_t* block_tables, int max_blocks_per_seq, const int32_t* cu_seqlens_q,
    const int32_t* cu_seqlens_k, int num_seqs, int max_seqlen_q, int total_q, int total_k, int num_heads,
    int num_kv_heads, int head_dim, const int32_t* mask_rows, const int32_t* segment_ends, float softmax_scale,
    void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto type = static_cast<kc::DType>(dtype);
  if (std::string why = kc::kv_cache_gather_unsupported(type, max_blocks_per_seq, num_seqs, total_k, block_size,
                                                        num_kv_heads, head_dim, num_blocks);
      !why.empty())
    return report("kv_cache_gather: " + why);
  const size_t bytes = static_cast<size_t>(total_k) * num_kv_heads * head_dim * 2;
  DeviceMemory keys, values;
  if (const cudaError_t e = keys.allocate(bytes); e != cudaSuccess) return report(cuda_failure("gather buffer", e));
  if (const cudaError_t e = values.allocate(bytes); e != cudaSuccess) return report(cuda_failure("gather buffer", e));
  const cudaError_t gathered = kc::kv_cache_gather(type, keys.get(), values.get(), k_cache, v_cache, block_tables,
                                                   max_blocks_per_seq, cu_seqlens_k, num_seqs, total_k, block_size,
                                                   num_kv_heads, head_dim, num_blocks, s);
  if (std::string e = wait_for("kv_cache_gather", gathered, s); !e.empty()) return report(e);
  const kc::PrefillArgs args =
      packed_prefill_args(out, q, keys.get(), values.get(), cu_seqlens_q, cu_seqlens_k, num_seqs, max_seqlen_q,
                          total_q, total_k, num_heads, num_kv_heads, head_dim, softmax_scale);
  return report(run_prefill(dtype, kernel, args, mask_rows, segment_ends, s));
}

// Paged decode: q and out [num_seqs, num_heads * head_dim]; caches and block_tables as above;
// context_lens on the device. mask_rows null: no masks (every sequence causal, the kernel's unmasked path).
TESSERA_SHIM_API const char* tessera_shim_decode(int dtype, void* out, const void* q, const void* k_cache,
                                                 const void* v_cache, int block_size, const int32_t* block_tables,
                                                 int max_blocks_per_seq, const int32_t* context_lens,
                                                 int max_context_len, int num_seqs, int num_heads, int num_kv_heads,
                                                 int head_dim, const int32_t* mask_rows, const int32_t* segment_ends,
                                                 float softmax_scale, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  DeviceMemory masks;
  if (mask_rows != nullptr) {
    if (std::string e = upload_masks(mask_rows, num_seqs, segment_ends, masks, s); !e.empty()) return report(e);
  }
  kc::DecodeArgs args;
  args.out = out;
  args.q = q;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.block_tables = block_tables;
  args.context_lens = context_lens;
  args.masks = static_cast<const MaskParams*>(masks.get());
  args.num_seqs = num_seqs;
  args.num_heads = num_heads;
  args.num_kv_heads = num_kv_heads;
  args.head_dim = head_dim;
  args.block_size = block_size;
  args.max_blocks_per_seq = max_blocks_per_seq;
  args.max_context_len = max_context_len;
  args.softmax_scale = softmax_scale;
  const auto type = static_cast<kc::DType>(dtype);
  if (std::string why = kc::decode_unsupported(type, args); !why.empty()) return report("decode: " + why);
  return report(run_decode(type, args, s));
}
