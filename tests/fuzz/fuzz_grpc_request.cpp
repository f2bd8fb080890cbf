// tests/fuzz/fuzz_grpc_request.cpp: libFuzzer target: any byte string as a serialized
// tessera.v1.GenerateRequest, through the service's conversion into the front end's input
// (server/grpc/grpc_request.h), then the sampling checks and the attention checks against a
// fixed model.
// Rejections must be ApiError or tessera::Error (INVALID_ARGUMENT naming the field); anything else
// is a finding: the service would answer it with INTERNAL.
#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "server/frontend/api_error.h"
#include "server/grpc/grpc_request.h"
#include "tests/fuzz/request_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;  // the gRPC layer refuses these
  try {
    const tessera::GenerateInput input = tessera::generate_input(request, "fuzz", tessera::Clock::now());
    input.sampling.validate();
    tessera::fuzz::check_attention(input.attention, input.prompt_tokens ? input.prompt_tokens->size() : 100);
  } catch (const tessera::ApiError&) {
  } catch (const tessera::Error&) {
  }
  return 0;
}
