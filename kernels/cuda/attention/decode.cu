// kernels/cuda/attention/decode.cu: paged decode attention's dispatch point: (dtype, KV dtype,
// head_dim) -> template instance (the block size is a runtime value); an e4m3 cache only beside bf16
// activations.
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/decode.cuh"

namespace tessera::kernels::cuda {
namespace {

template <int... kDims>
std::string comma_separated(std::integer_sequence<int, kDims...>) {
  std::string list;
  ((list += (list.empty() ? "" : ", ") + std::to_string(kDims)), ...);
  return list;
}

}  // namespace

std::string decode_unsupported(DType dtype, const DecodeArgs& a) {
  if (dtype != DType::kBF16 && dtype != DType::kFP16)
    return "unsupported dtype: " + std::to_string(static_cast<int>(dtype)) + " (supported: bf16, fp16)";
  if (std::string e = kv_dtype_unsupported(dtype, a.kv_dtype); !e.empty()) return e;
  if (!with_decode_head_dim(a.head_dim, [](auto) {}))
    return "unsupported head_dim: " + std::to_string(a.head_dim) + " (supported: " +
           comma_separated(DecodeHeadDims{}) + ")";
  if (a.block_size != 16 && a.block_size != 32)
    return "unsupported block_size: " + std::to_string(a.block_size) + " (supported: 16, 32)";
  if (a.num_kv_heads <= 0 || a.num_heads <= 0 || a.num_heads % a.num_kv_heads != 0)
    return "num_heads (" + std::to_string(a.num_heads) + ") must be a positive multiple of num_kv_heads (" +
           std::to_string(a.num_kv_heads) + ")";
  if (a.min_split_tokens != 0 &&
      (a.min_split_tokens < 32 || a.min_split_tokens > DecodeConfig<128>::kMaxChunk || a.min_split_tokens % 32 != 0))
    return "min_split_tokens must be 0 or a multiple of 32 in [32, " + std::to_string(DecodeConfig<128>::kMaxChunk) +
           "], got " + std::to_string(a.min_split_tokens);
  if (a.max_context_len > DecodeConfig<128>::kMaxChunk * DecodeConfig<128>::kMaxSplits)
    return "unsupported max_context_len: " + std::to_string(a.max_context_len) + " (supported: up to " +
           std::to_string(DecodeConfig<128>::kMaxChunk * DecodeConfig<128>::kMaxSplits) + ")";
  if (static_cast<int64_t>(a.num_kv_heads) * ((a.num_heads / a.num_kv_heads + 7) / 8) > 65535)
    return "too many KV heads for one grid row: " + std::to_string(a.num_kv_heads);
  if (a.num_seqs < 0 || a.num_seqs > 65535)
    return "unsupported num_seqs: " + std::to_string(a.num_seqs) + " (supported: 0..65535)";
  if (a.max_context_len < 0 || static_cast<int64_t>(a.max_blocks_per_seq) * a.block_size < a.max_context_len)
    return "max_context_len (" + std::to_string(a.max_context_len) + ") must be in [0, max_blocks_per_seq * block_size]";
  const int64_t row = static_cast<int64_t>(a.num_heads) * a.head_dim;
  if (a.q_row_stride != 0 && (a.q_row_stride < row || a.q_row_stride % 8 != 0))
    return "q_row_stride must be 0 or a multiple of 8 >= num_heads * head_dim (" + std::to_string(row) + "), got " +
           std::to_string(a.q_row_stride);
  if (a.out_row_stride != 0 && (a.out_row_stride < row || a.out_row_stride % 8 != 0))
    return "out_row_stride must be 0 or a multiple of 8 >= num_heads * head_dim (" + std::to_string(row) +
           "), got " + std::to_string(a.out_row_stride);
  if (!is_aligned16(a.q) || !is_aligned16(a.k_cache) || !is_aligned16(a.v_cache))
    return "q, k_cache and v_cache must be 16-byte aligned";
  if (a.num_seqs > 0 && (a.block_tables == nullptr || a.context_lens == nullptr || a.out == nullptr))
    return "out, block_tables and context_lens must be set";
  if (!(a.softmax_scale > 0.f)) return "softmax_scale must be > 0";
  return "";
}

DecodeWorkspaceNeed decode_workspace_need(const DecodeArgs& args, int num_sms) {
  if (!decode_unsupported(DType::kBF16, args).empty() || args.num_seqs == 0) return {};
  const DecodeSplitPlan plan = plan_decode_split(args, num_sms);
  return {plan.bytes, plan.counters};
}

cudaError_t decode_attention(DType dtype, const DecodeArgs& args, const DecodeWorkspace& workspace, int num_sms,
                             cudaStream_t stream) {
  if (!decode_unsupported(dtype, args).empty() || num_sms <= 0) return cudaErrorInvalidValue;
  if (args.num_seqs == 0) return cudaSuccess;
  const DecodeSplitPlan plan = plan_decode_split(args, num_sms);
  if (plan.bytes > 0 && (workspace.partials == nullptr || workspace.partial_bytes < plan.bytes ||
                         workspace.counters == nullptr || workspace.counter_count < plan.counters)) {
    return cudaErrorInvalidValue;
  }
  // The head dims the kernel is built for (DecodeHeadDims), for one (activation, cache element) pair.
  auto launch = [&](auto activation, auto cache_element) -> cudaError_t {
    using T = decltype(activation);
    using KvT = decltype(cache_element);
    cudaError_t status = cudaErrorInvalidValue;
    with_decode_head_dim(args.head_dim, [&](auto dim) {
      status = launch_decode<T, KvT, decltype(dim)::value>(args, plan, workspace, stream);
    });
    return status;
  };
  // An e4m3 cache comes with bf16 activations only (decode_unsupported).
  if (args.kv_dtype == KvDType::kFp8E4M3) return launch(__nv_bfloat16{}, e4m3_t{});
  return TESSERA_DISPATCH_DTYPE(dtype, [&]() -> cudaError_t { return launch(scalar_t{}, scalar_t{}); });
}

}  // namespace tessera::kernels::cuda
