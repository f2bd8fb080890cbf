// kernels/cuda/embedding/embedding.h: token embedding gather. Stateless and thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common/dtype.h"

namespace tessera::kernels::cuda {

// out[t, :] <- table[ids[t], :]. Ids are validated by the tokenizer/engine before they reach the GPU;
// an id outside [0, vocab) still cannot read out of bounds here: its row is written as zeros.
cudaError_t embedding_gather(DType dtype,
                             void* out,            // [tokens, hidden]
                             const void* table,    // [vocab, hidden]
                             const int32_t* ids,   // [tokens]
                             int tokens, int hidden, int vocab, cudaStream_t stream);

std::string embedding_unsupported(int tokens, int hidden, int vocab);

}  // namespace tessera::kernels::cuda
