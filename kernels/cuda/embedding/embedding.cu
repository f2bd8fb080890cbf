// kernels/cuda/embedding/embedding.cu: the embedding gather's dispatch point.
#include "kernels/cuda/embedding/embedding.cuh"
#include "kernels/cuda/embedding/embedding.h"

namespace tessera::kernels::cuda {

std::string embedding_unsupported(int tokens, int hidden, int vocab) {
  if (tokens < 0) return "tokens must be >= 0, got " + std::to_string(tokens);
  if (hidden <= 0) return "hidden must be > 0, got " + std::to_string(hidden);
  if (vocab <= 0) return "vocab must be > 0, got " + std::to_string(vocab);
  return "";
}

cudaError_t embedding_gather(DType dtype, void* out, const void* table, const int32_t* ids, int tokens, int hidden,
                             int vocab, cudaStream_t stream, bool accumulate) {
  if (!embedding_unsupported(tokens, hidden, vocab).empty()) return cudaErrorInvalidValue;
  return TESSERA_DISPATCH_DTYPE(dtype, [&] {
    return launch_embedding<scalar_t>(static_cast<scalar_t*>(out), static_cast<const scalar_t*>(table), ids, tokens,
                                      hidden, vocab, accumulate, stream);
  });
}

}  // namespace tessera::kernels::cuda
