// kernels/cuda/embedding/embedding.h: token embedding gather. Stateless and thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// out[t, :] <- table[ids[t], :], or with accumulate out[t, :] += table[ids[t], :] (summed in fp32,
// rounded once; BERT adds position and token-type embeddings this way). Ids are validated by the
// tokenizer/engine before they reach the GPU; an id outside [0, vocab) still cannot read out of
// bounds here: it contributes a zero row (written as zeros, or out left unchanged when accumulating).
cudaError_t embedding_gather(DType dtype,
                             void* out,            // [tokens, hidden]
                             const void* table,    // [vocab, hidden]
                             const int32_t* ids,   // [tokens]
                             int tokens, int hidden, int vocab, cudaStream_t stream, bool accumulate = false);

std::string embedding_unsupported(int tokens, int hidden, int vocab);

}  // namespace tessera::kernels::cuda
