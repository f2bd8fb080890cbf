// kernels/cuda/attention_generic/attention_generic.cu: the generic attention's dispatch point (dtype
// -> template instance; head_dim picks the lane layout in the launcher).
#include "kernels/cuda/attention_generic/attention_generic.cuh"
#include "kernels/cuda/attention_generic/attention_generic.h"

namespace tessera::kernels::cuda {

namespace {
bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }
}  // namespace

std::string generic_attention_unsupported(DType dtype, const GenericAttentionArgs& a) {
  if (dtype != DType::kBF16 && dtype != DType::kFP16)
    return "unsupported dtype: " + std::to_string(static_cast<int>(dtype)) + " (supported: bf16, fp16)";
  if (std::string e = kv_dtype_unsupported(dtype, a.kv_dtype); !e.empty()) return e;
  if (a.kv_dtype != KvDType::kActivation && a.block_tables == nullptr)
    return "kv_dtype fp8_e4m3 applies to paged keys (block_tables) only";
  if (a.head_dim < 8 || a.head_dim > 256 || a.head_dim % 2 != 0)
    return "unsupported head_dim: " + std::to_string(a.head_dim) + " (supported: even, 8..256)";
  if (a.num_heads <= 0) return "num_heads must be > 0, got " + std::to_string(a.num_heads);
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0)
    return "num_heads (" + std::to_string(a.num_heads) + ") must be a multiple of num_kv_heads (" +
           std::to_string(a.num_kv_heads) + ")";
  if (a.num_seqs < 0) return "num_seqs must be >= 0, got " + std::to_string(a.num_seqs);
  if (a.total_q < 0) return "total_q must be >= 0, got " + std::to_string(a.total_q);
  if (a.total_q > 0 && a.num_seqs == 0) return "total_q > 0 needs num_seqs > 0";
  if (static_cast<int64_t>(a.total_q) * a.num_heads > (int64_t{1} << 32))
    return "total_q * num_heads too large: " + std::to_string(static_cast<int64_t>(a.total_q) * a.num_heads);
  const int64_t q_width = static_cast<int64_t>(a.num_heads) * a.head_dim;
  const int64_t kv_width = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  if (a.q_row_stride < q_width || a.q_row_stride % 2 != 0)
    return "q_row_stride must be even and >= num_heads * head_dim, got " + std::to_string(a.q_row_stride);
  if (a.out_row_stride < q_width || a.out_row_stride % 2 != 0)
    return "out_row_stride must be even and >= num_heads * head_dim, got " + std::to_string(a.out_row_stride);
  if (!(a.softmax_scale > 0.f)) return "softmax_scale must be > 0";
  if (a.total_q == 0) return "";
  if (a.q == nullptr || a.out == nullptr || a.k == nullptr || a.v == nullptr || a.cu_seqlens_q == nullptr)
    return "q, k, v, out and cu_seqlens_q must be set";
  if (!aligned4(a.q) || !aligned4(a.k) || !aligned4(a.v) || !aligned4(a.out))
    return "q, k, v and out must be 4-byte aligned";
  if (a.block_tables != nullptr) {
    if (a.block_size <= 0) return "block_size must be > 0, got " + std::to_string(a.block_size);
    if (a.max_blocks_per_seq <= 0)
      return "max_blocks_per_seq must be > 0, got " + std::to_string(a.max_blocks_per_seq);
    if (a.kv_lens == nullptr) return "paged keys need kv_lens";
  } else {
    if (a.cu_seqlens_k == nullptr) return "contiguous keys need cu_seqlens_k";
    if (a.k_row_stride < kv_width || a.k_row_stride % 2 != 0)
      return "k_row_stride must be even and >= num_kv_heads * head_dim, got " + std::to_string(a.k_row_stride);
    if (a.v_row_stride < kv_width || a.v_row_stride % 2 != 0)
      return "v_row_stride must be even and >= num_kv_heads * head_dim, got " + std::to_string(a.v_row_stride);
  }
  return "";
}

cudaError_t generic_attention(DType dtype, const GenericAttentionArgs& args, cudaStream_t stream) {
  if (!generic_attention_unsupported(dtype, args).empty()) return cudaErrorInvalidValue;
  if (args.total_q == 0) return cudaSuccess;
  if (args.kv_dtype == KvDType::kFp8E4M3) return launch_generic_attention<__nv_bfloat16, e4m3_t>(args, stream);
  return TESSERA_DISPATCH_DTYPE(dtype, [&] { return launch_generic_attention<scalar_t>(args, stream); });
}

}  // namespace tessera::kernels::cuda
