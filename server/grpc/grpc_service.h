// server/grpc/grpc_service.h: the tessera.v1.InferenceService implementation (sync API): proto <->
// front-end types, API-key check, deadline propagation, client-cancel polling, ApiError -> status.
// Validation lives in server/frontend, never here.
//
// Thread safety: every RPC handler runs on a gRPC thread and may run concurrently with the others;
// the service holds no per-request state.
#pragma once

#include <atomic>
#include <chrono>

#include <grpcpp/grpcpp.h>

#include "tessera/v1/inference.grpc.pb.h"

namespace tessera {

class Frontend;

// A ServerContext deadline (system clock; "infinite" when the client set none) as a steady-clock
// deadline for the engine: Clock::time_point::max() when there is none.
std::chrono::steady_clock::time_point steady_deadline(std::chrono::system_clock::time_point deadline);

class InferenceService final : public v1::InferenceService::Service {
 public:
  explicit InferenceService(Frontend& frontend) : frontend_(frontend) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Embed(grpc::ServerContext* context, const v1::EmbedRequest* request,
                     v1::EmbedResponse* response) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;

  // How often a streaming handler checks for a client cancel while it waits for the engine.
  static constexpr std::chrono::milliseconds kCancelPoll{20};

 private:
  void check_api_key(const grpc::ServerContext& context) const;

  Frontend& frontend_;
};

}  // namespace tessera
