// kernels/cuda/kv_cache/kv_cache.cu: the KV cache ops' dispatch points (validation, then the one
// 2-byte-element instance of each copy kernel, and a bf16 and an fp16 instance of the rotating copy),
// plus the bf16-activation / e4m3-cache instance of each for the fp8 KV cache.
#include "kernels/cuda/kv_cache/kv_cache.cuh"
#include "kernels/cuda/kv_cache/kv_cache.h"

namespace tessera::kernels::cuda {

namespace {

std::string dtype_unsupported(DType dtype, KvDType kv_dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kFP16)
    return "unsupported dtype: " + std::to_string(static_cast<int>(dtype)) + " (supported: bf16, fp16)";
  return kv_dtype_unsupported(dtype, kv_dtype);
}

bool fp8(KvDType kv_dtype) { return kv_dtype == KvDType::kFp8E4M3; }

// Rows are indexed in int32 inside the kernels' width arithmetic.
std::string width_unsupported(int num_kv_heads, int head_dim) {
  if (num_kv_heads <= 0) return "num_kv_heads must be > 0, got " + std::to_string(num_kv_heads);
  if (head_dim <= 0) return "head_dim must be > 0, got " + std::to_string(head_dim);
  if (static_cast<int64_t>(num_kv_heads) * head_dim > (1 << 24))
    return "num_kv_heads * head_dim too large: " + std::to_string(static_cast<int64_t>(num_kv_heads) * head_dim);
  return "";
}

}  // namespace

std::string kv_cache_append_unsupported(DType dtype, int tokens, int num_kv_heads, int head_dim,
                                        int64_t k_row_stride, int64_t v_row_stride, int64_t num_slots,
                                        KvDType kv_dtype) {
  if (std::string e = dtype_unsupported(dtype, kv_dtype); !e.empty()) return e;
  if (tokens < 0) return "tokens must be >= 0, got " + std::to_string(tokens);
  if (std::string e = width_unsupported(num_kv_heads, head_dim); !e.empty()) return e;
  const int64_t width = static_cast<int64_t>(num_kv_heads) * head_dim;
  if (k_row_stride < width)
    return "k_row_stride must be >= num_kv_heads * head_dim (" + std::to_string(width) + "), got " +
           std::to_string(k_row_stride);
  if (v_row_stride < width)
    return "v_row_stride must be >= num_kv_heads * head_dim (" + std::to_string(width) + "), got " +
           std::to_string(v_row_stride);
  if (num_slots < 0) return "num_slots must be >= 0, got " + std::to_string(num_slots);
  return "";
}

std::string kv_cache_gather_unsupported(DType dtype, int max_blocks_per_seq, int num_seqs, int total_k,
                                        int block_size, int num_kv_heads, int head_dim, int num_blocks,
                                        KvDType kv_dtype) {
  if (std::string e = dtype_unsupported(dtype, kv_dtype); !e.empty()) return e;
  if (num_seqs < 0) return "num_seqs must be >= 0, got " + std::to_string(num_seqs);
  if (total_k < 0) return "total_k must be >= 0, got " + std::to_string(total_k);
  if (max_blocks_per_seq < 0) return "max_blocks_per_seq must be >= 0, got " + std::to_string(max_blocks_per_seq);
  if (block_size <= 0) return "block_size must be > 0, got " + std::to_string(block_size);
  if (std::string e = width_unsupported(num_kv_heads, head_dim); !e.empty()) return e;
  if (num_blocks < 0) return "num_blocks must be >= 0, got " + std::to_string(num_blocks);
  return "";
}

cudaError_t kv_cache_append(DType dtype, void* k_cache, void* v_cache, const void* k, int64_t k_row_stride,
                            const void* v, int64_t v_row_stride, const int32_t* slot_mapping, int tokens,
                            int num_kv_heads, int head_dim, int64_t num_slots, cudaStream_t stream,
                            KvDType kv_dtype) {
  if (!kv_cache_append_unsupported(dtype, tokens, num_kv_heads, head_dim, k_row_stride, v_row_stride, num_slots,
                                   kv_dtype)
           .empty())
    return cudaErrorInvalidValue;
  const int width = num_kv_heads * head_dim;
  if (fp8(kv_dtype)) {
    return launch_kv_cache_append<KvMove::kToE4m3, __nv_bfloat16>(
        static_cast<e4m3_t*>(k_cache), static_cast<e4m3_t*>(v_cache), static_cast<const uint16_t*>(k), k_row_stride,
        static_cast<const uint16_t*>(v), v_row_stride, slot_mapping, tokens, width, num_slots, stream);
  }
  return launch_kv_cache_append<KvMove::kCopy, __nv_bfloat16>(
      static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), static_cast<const uint16_t*>(k), k_row_stride,
      static_cast<const uint16_t*>(v), v_row_stride, slot_mapping, tokens, width, num_slots, stream);
}

cudaError_t kv_cache_gather(DType dtype, void* k_out, void* v_out, const void* k_cache, const void* v_cache,
                            const int32_t* block_tables, int max_blocks_per_seq, const int32_t* cu_seqlens_k,
                            int num_seqs, int total_k, int block_size, int num_kv_heads, int head_dim, int num_blocks,
                            cudaStream_t stream, KvDType kv_dtype) {
  if (!kv_cache_gather_unsupported(dtype, max_blocks_per_seq, num_seqs, total_k, block_size, num_kv_heads, head_dim,
                                   num_blocks, kv_dtype)
           .empty())
    return cudaErrorInvalidValue;
  const int width = num_kv_heads * head_dim;
  if (fp8(kv_dtype)) {
    return launch_kv_cache_gather<KvMove::kFromE4m3, __nv_bfloat16>(
        static_cast<uint16_t*>(k_out), static_cast<uint16_t*>(v_out), static_cast<const e4m3_t*>(k_cache),
        static_cast<const e4m3_t*>(v_cache), block_tables, max_blocks_per_seq, cu_seqlens_k, num_seqs, total_k,
        block_size, width, num_blocks, stream);
  }
  return launch_kv_cache_gather<KvMove::kCopy, __nv_bfloat16>(
      static_cast<uint16_t*>(k_out), static_cast<uint16_t*>(v_out), static_cast<const uint16_t*>(k_cache),
      static_cast<const uint16_t*>(v_cache), block_tables, max_blocks_per_seq, cu_seqlens_k, num_seqs, total_k,
      block_size, width, num_blocks, stream);
}

std::string kv_cache_append_rope_unsupported(DType dtype, int tokens, int num_heads, int num_kv_heads, int head_dim,
                                             int64_t q_row_stride, int64_t k_row_stride, int64_t v_row_stride,
                                             int64_t num_slots, KvDType kv_dtype) {
  if (std::string e = kv_cache_append_unsupported(dtype, tokens, num_kv_heads, head_dim, k_row_stride, v_row_stride,
                                                  num_slots, kv_dtype);
      !e.empty())
    return e;
  if (num_heads <= 0 || num_heads + num_kv_heads > 65535)
    return "num_heads must be > 0 and num_heads + num_kv_heads <= 65535 (a grid row each), got " +
           std::to_string(num_heads) + " + " + std::to_string(num_kv_heads);
  if (head_dim % 2 != 0) return "head_dim must be even, got " + std::to_string(head_dim);
  if (q_row_stride < static_cast<int64_t>(num_heads) * head_dim)
    return "q_row_stride must be >= num_heads * head_dim (" + std::to_string(int64_t{num_heads} * head_dim) +
           "), got " + std::to_string(q_row_stride);
  return "";
}

cudaError_t kv_cache_append_rope(DType dtype, void* k_cache, void* v_cache, void* q, int64_t q_row_stride,
                                 const void* k, int64_t k_row_stride, const void* v, int64_t v_row_stride,
                                 const int32_t* positions, const int32_t* slot_mapping, int tokens, int num_heads,
                                 int num_kv_heads, int head_dim, int64_t num_slots, const float* inv_freq,
                                 cudaStream_t stream, KvDType kv_dtype) {
  if (!kv_cache_append_rope_unsupported(dtype, tokens, num_heads, num_kv_heads, head_dim, q_row_stride, k_row_stride,
                                        v_row_stride, num_slots, kv_dtype)
           .empty() ||
      (tokens > 0 && inv_freq == nullptr))
    return cudaErrorInvalidValue;
  if (fp8(kv_dtype)) {  // bf16 activations (validated above)
    using T = __nv_bfloat16;
    return launch_kv_cache_append_rope<T, e4m3_t>(
        static_cast<e4m3_t*>(k_cache), static_cast<e4m3_t*>(v_cache), static_cast<T*>(q), q_row_stride,
        static_cast<const T*>(k), k_row_stride, static_cast<const T*>(v), v_row_stride, positions, slot_mapping, tokens,
        num_heads, num_kv_heads, head_dim, num_slots, inv_freq, stream);
  }
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_kv_cache_append_rope<scalar_t, scalar_t>(
        static_cast<scalar_t*>(k_cache), static_cast<scalar_t*>(v_cache), static_cast<scalar_t*>(q), q_row_stride,
        static_cast<const scalar_t*>(k), k_row_stride, static_cast<const scalar_t*>(v), v_row_stride, positions,
        slot_mapping, tokens, num_heads, num_kv_heads, head_dim, num_slots, inv_freq, stream);
  });
}

std::string kv_cache_copy_rotate_unsupported(DType dtype, int rows, int num_kv_heads, int head_dim, KvDType kv_dtype) {
  if (std::string e = dtype_unsupported(dtype, kv_dtype); !e.empty()) return e;
  if (rows < 0) return "rows must be >= 0, got " + std::to_string(rows);
  if (std::string e = width_unsupported(num_kv_heads, head_dim); !e.empty()) return e;
  if (head_dim % 2 != 0) return "head_dim must be even, got " + std::to_string(head_dim);
  return "";
}

cudaError_t kv_cache_copy_rotate(DType dtype, void* k_cache, void* v_cache, const int32_t* src_rows,
                                 const int32_t* dst_rows, const int32_t* rotate_by, int rows, int num_kv_heads,
                                 int head_dim, const float* inv_freq, cudaStream_t stream, KvDType kv_dtype) {
  if (!kv_cache_copy_rotate_unsupported(dtype, rows, num_kv_heads, head_dim, kv_dtype).empty())
    return cudaErrorInvalidValue;
  if (fp8(kv_dtype)) {
    return launch_kv_cache_copy_rotate<__nv_bfloat16, e4m3_t>(static_cast<e4m3_t*>(k_cache),
                                                              static_cast<e4m3_t*>(v_cache), src_rows, dst_rows,
                                                              rotate_by, rows, num_kv_heads, head_dim, inv_freq, stream);
  }
  if (dtype == DType::kBF16) {
    return launch_kv_cache_copy_rotate<__nv_bfloat16, __nv_bfloat16>(
        static_cast<__nv_bfloat16*>(k_cache), static_cast<__nv_bfloat16*>(v_cache), src_rows, dst_rows, rotate_by, rows,
        num_kv_heads, head_dim, inv_freq, stream);
  }
  return launch_kv_cache_copy_rotate<__half, __half>(static_cast<__half*>(k_cache), static_cast<__half*>(v_cache),
                                                     src_rows, dst_rows, rotate_by, rows, num_kv_heads, head_dim,
                                                     inv_freq, stream);
}

}  // namespace tessera::kernels::cuda
