// kernels/cuda/sampling/sampling.cu: the sampling kernel's dispatch points; the only place its
// templates are instantiated.
#include "kernels/cuda/sampling/sampling.cuh"
#include "kernels/cuda/sampling/sampling.h"

namespace tessera::kernels::cuda {

namespace {

int64_t workspace_row_floats(int vocab) { return (static_cast<int64_t>(vocab) + 63) / 64 * 64; }

cudaError_t dispatch(LogitsType type, const void* logits, int64_t row_stride, int rows, int vocab,
                     const SamplingRowParams* params, const int32_t* penalty_tokens, const int32_t* penalty_counts,
                     void* workspace, size_t workspace_bytes, SampledRow* out, float* filtered, cudaStream_t stream) {
  if (!sampling_unsupported(rows, vocab, row_stride, workspace_bytes).empty()) return cudaErrorInvalidValue;
  if (rows > 0 && (logits == nullptr || params == nullptr || out == nullptr)) return cudaErrorInvalidValue;
  float* ws = static_cast<float*>(workspace);
  switch (type) {
    case LogitsType::kF32:
      return launch_sample_rows(static_cast<const float*>(logits), row_stride, rows, vocab, params, penalty_tokens,
                                penalty_counts, ws, out, filtered, stream);
    case LogitsType::kBF16:
      return launch_sample_rows(static_cast<const __nv_bfloat16*>(logits), row_stride, rows, vocab, params,
                                penalty_tokens, penalty_counts, ws, out, filtered, stream);
    case LogitsType::kFP16:
      return launch_sample_rows(static_cast<const __half*>(logits), row_stride, rows, vocab, params, penalty_tokens,
                                penalty_counts, ws, out, filtered, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t sampling_workspace_bytes(int rows, int vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  return static_cast<size_t>(rows) * static_cast<size_t>(workspace_row_floats(vocab)) * sizeof(float);
}

std::string sampling_unsupported(int rows, int vocab, int64_t row_stride, size_t workspace_bytes) {
  if (rows < 0) return "rows must be >= 0, got " + std::to_string(rows);
  if (vocab < 1 || vocab > kMaxSamplingVocab)
    return "vocab must be in [1, " + std::to_string(kMaxSamplingVocab) + "], got " + std::to_string(vocab);
  if (row_stride < vocab)
    return "row_stride must be >= vocab (" + std::to_string(vocab) + "), got " + std::to_string(row_stride);
  if (workspace_bytes < sampling_workspace_bytes(rows, vocab))
    return "workspace_bytes must be >= sampling_workspace_bytes(rows, vocab) (" +
           std::to_string(sampling_workspace_bytes(rows, vocab)) + "), got " + std::to_string(workspace_bytes);
  return "";
}

cudaError_t sample_rows(LogitsType type, const void* logits, int64_t row_stride, int rows, int vocab,
                        const SamplingRowParams* params, const int32_t* penalty_tokens, const int32_t* penalty_counts,
                        void* workspace, size_t workspace_bytes, SampledRow* out, cudaStream_t stream) {
  return dispatch(type, logits, row_stride, rows, vocab, params, penalty_tokens, penalty_counts, workspace,
                  workspace_bytes, out, nullptr, stream);
}

cudaError_t sample_rows_with_filtered(LogitsType type, const void* logits, int64_t row_stride, int rows, int vocab,
                                      const SamplingRowParams* params, const int32_t* penalty_tokens,
                                      const int32_t* penalty_counts, void* workspace, size_t workspace_bytes,
                                      SampledRow* out, float* filtered, cudaStream_t stream) {
  if (rows > 0 && filtered == nullptr) return cudaErrorInvalidValue;
  return dispatch(type, logits, row_stride, rows, vocab, params, penalty_tokens, penalty_counts, workspace,
                  workspace_bytes, out, filtered, stream);
}

}  // namespace tessera::kernels::cuda
