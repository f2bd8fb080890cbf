// tests/fuzz/fuzz_grpc_request.cpp: libFuzzer target: any byte string as a serialized
// tessera.v1.GenerateRequest, through the service's conversion into the front end's input
// (server/grpc/grpc_request.h), then the sampling checks and the attention checks against a
// fixed model.
// Rejections must be ApiError or tessera::Error (INVALID_ARGUMENT naming the field); anything else
// is a finding: the service would answer it with INTERNAL.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/error.h"
#include "models/config/model_mask_policy.h"
#include "server/frontend/api_error.h"
#include "server/grpc/grpc_request.h"

namespace {

// The checks the front end makes of an attention policy against a model, here a Llama of 4,096
// positions and a prompt of `prompt_tokens` (at least 1), then its lowering to the kernels' form.
void check_attention(const std::optional<tessera::MaskPolicy>& attention, size_t prompt_tokens) {
  static const tessera::ModelConfig config = [] {
    tessera::ModelConfig c;
    c.arch = tessera::Architecture::kLlama;
    c.max_position_embeddings = 4096;
    return c;
  }();
  const tessera::MaskPolicy policy =
      tessera::resolve_mask_policy(attention, config, static_cast<int64_t>(std::max<size_t>(prompt_tokens, 1)));
  std::vector<int32_t> segment_ends;
  policy.lower(segment_ends);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;  // the gRPC layer refuses these
  try {
    const tessera::GenerateInput input = tessera::generate_input(request, "fuzz", tessera::Clock::now());
    input.sampling.validate();
    check_attention(input.attention, input.prompt_tokens ? input.prompt_tokens->size() : 100);
  } catch (const tessera::ApiError&) {
  } catch (const tessera::Error&) {
  }
  return 0;
}
