// kernels/cuda/attention/prefill.cu: prefill attention's dispatch point: (dtype, head_dim, kernel
// family) -> template instance. The mask kind is dispatched per sequence inside the kernel.
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/prefill_hopper.h"
#include "kernels/cuda/attention/prefill_mma.cuh"

namespace tessera::kernels::cuda {

std::string prefill_unsupported(DType dtype, const PrefillArgs& a, PrefillKernel kernel) {
  if (dtype != DType::kBF16 && dtype != DType::kFP16)
    return "unsupported dtype: " + std::to_string(static_cast<int>(dtype)) + " (supported: bf16, fp16)";
  if (a.head_dim != 32 && a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256)
    return "unsupported head_dim: " + std::to_string(a.head_dim) + " (supported: 32, 64, 128, 256)";
  if (a.num_heads <= 0 || a.num_heads > 65535)
    return "unsupported num_heads: " + std::to_string(a.num_heads) + " (supported: 1..65535)";
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0)
    return "num_heads (" + std::to_string(a.num_heads) + ") must be a multiple of num_kv_heads (" +
           std::to_string(a.num_kv_heads) + ")";
  if (a.num_seqs < 0 || a.num_seqs > 65535)
    return "unsupported num_seqs: " + std::to_string(a.num_seqs) + " (supported: 0..65535)";
  if (a.max_seqlen_q < 0) return "max_seqlen_q must be >= 0, got " + std::to_string(a.max_seqlen_q);
  if (a.total_q < 0 || a.total_k < 0)
    return "total_q and total_k must be >= 0, got " + std::to_string(a.total_q) + " and " + std::to_string(a.total_k);
  const int64_t q_width = static_cast<int64_t>(a.num_heads) * a.head_dim;
  const int64_t kv_width = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  if (a.q_row_stride < q_width || a.q_row_stride % 8 != 0)
    return "q_row_stride must be a multiple of 8 and >= num_heads * head_dim, got " + std::to_string(a.q_row_stride);
  if (a.out_row_stride < q_width || a.out_row_stride % 8 != 0)
    return "out_row_stride must be a multiple of 8 and >= num_heads * head_dim, got " +
           std::to_string(a.out_row_stride);
  if (a.k_row_stride < kv_width || a.k_row_stride % 8 != 0)
    return "k_row_stride must be a multiple of 8 and >= num_kv_heads * head_dim, got " +
           std::to_string(a.k_row_stride);
  if (a.v_row_stride < kv_width || a.v_row_stride % 8 != 0)
    return "v_row_stride must be a multiple of 8 and >= num_kv_heads * head_dim, got " +
           std::to_string(a.v_row_stride);
  if (!is_aligned16(a.q) || !is_aligned16(a.k) || !is_aligned16(a.v) || !is_aligned16(a.out))
    return "q, k, v and out must be 16-byte aligned";
  if (a.num_seqs > 0 && (a.cu_seqlens_q == nullptr || a.cu_seqlens_k == nullptr || a.masks == nullptr))
    return "cu_seqlens_q, cu_seqlens_k and masks must be set";
  if (!(a.softmax_scale > 0.f)) return "softmax_scale must be > 0";
  if (kernel != PrefillKernel::kAuto && kernel != PrefillKernel::kMmaSync && kernel != PrefillKernel::kHopper)
    return "unsupported prefill kernel: " + std::to_string(static_cast<int>(kernel));
  if (kernel == PrefillKernel::kHopper && !hopper_prefill_supported(dtype, a))
    return "the Hopper prefill kernel needs an sm_90 device, sm_90a code in the build, total_q and total_k set "
           "and head_dim 64, 128 or 256 "
           "(head_dim " + std::to_string(a.head_dim) + ")";
  return "";
}

cudaError_t prefill_attention(DType dtype, const PrefillArgs& args, cudaStream_t stream, PrefillKernel kernel) {
  if (!prefill_unsupported(dtype, args, kernel).empty()) return cudaErrorInvalidValue;
  if (args.num_seqs == 0 || args.max_seqlen_q == 0) return cudaSuccess;
  if (kernel == PrefillKernel::kHopper || (kernel == PrefillKernel::kAuto && hopper_prefill_supported(dtype, args)))
    return launch_prefill_hopper(dtype, args, stream);
  return TESSERA_DISPATCH_DTYPE(dtype, [&]() -> cudaError_t {
    switch (args.head_dim) {
      case 32:
        return launch_prefill_mma<scalar_t, 32>(args, stream);
      case 64:
        return launch_prefill_mma<scalar_t, 64>(args, stream);
      case 128:
        return launch_prefill_mma<scalar_t, 128>(args, stream);
      case 256:
        return launch_prefill_mma<scalar_t, 256>(args, stream);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace tessera::kernels::cuda
