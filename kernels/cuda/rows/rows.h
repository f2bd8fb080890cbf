// kernels/cuda/rows/rows.h: small row ops the model graphs need around the big kernels: row gather
// (last-token logits), per-sequence pooling and L2 normalisation (embedding models), softmax
// (classifier heads) and fp32 conversion (outputs handed to the host as float). fp32 arithmetic
// throughout; rows are contiguous. Stateless and thread-safe; errors come back as cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// out[i, :] <- x[rows[i], :]. A negative row index gives a zero row (the caller's padding).
cudaError_t gather_rows(DType dtype,
                        void* out,             // [num_rows, width]
                        const void* x,         // [*, width]
                        const int32_t* rows,   // [num_rows], device
                        int num_rows, int width, cudaStream_t stream);

// kMean: the mean of the sequence's rows (sentence-transformers' mean pooling); kFirst: its first
// row (BERT's [CLS]); kLast: its last row (decoder embedding models). An empty sequence gives zeros.
enum class PoolKind : int32_t { kMean = 0, kFirst = 1, kLast = 2 };

// out[s, :] <- pool of x[cu_seqlens[s] .. cu_seqlens[s+1]).
cudaError_t pool_rows(DType dtype,
                      void* out,                  // [num_seqs, width]
                      const void* x,              // [cu_seqlens[num_seqs], width]
                      const int32_t* cu_seqlens,  // [num_seqs + 1], device, ascending
                      int num_seqs, int width, PoolKind kind, cudaStream_t stream);

// In place, per row: x <- x / max(‖x‖₂, eps), as torch.nn.functional.normalize (eps 1e-12 there).
cudaError_t l2_normalize_rows(DType dtype, void* x /* [rows, width] */, int rows, int width, float eps,
                              cudaStream_t stream);

// In place, per row: x <- exp(x - max) / sum(exp(x - max)).
cudaError_t softmax_rows(DType dtype, void* x /* [rows, width] */, int rows, int width, cudaStream_t stream);

// out[i] <- float(x[i]) (exact), and out[i] <- x[i] rounded to nearest even in the dtype.
cudaError_t convert_to_f32(DType dtype, float* out, const void* x, int64_t n, cudaStream_t stream);
cudaError_t convert_from_f32(DType dtype, void* out, const float* x, int64_t n, cudaStream_t stream);

// Names the first invalid value ("width must be > 0, got 0"), or "" when the call is valid. `rows`
// is num_rows / num_seqs / rows as the op names it; kind is checked only for pool_rows.
std::string rows_unsupported(DType dtype, int rows, int width);
std::string pool_rows_unsupported(DType dtype, int num_seqs, int width, PoolKind kind);
std::string convert_unsupported(DType dtype, int64_t n);

}  // namespace tessera::kernels::cuda
