// server/grpc/grpc_request.h: a gRPC request as the front end's input: the proto's fields turned
// into GenerateInput, SamplingParams and MaskPolicy, unvalidated (the front end validates them
// against the model exactly as it does HTTP's). Apart from the service so that a fuzzer can drive it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/frontend/frontend.h"
#include "tessera/v1/inference.pb.h"

namespace tessera {

// ApiError naming "chat.messages[i].tool_call_id" for a tool message without one.
std::vector<ChatMessage> chat_messages(const v1::ChatMessages& chat);
// nullopt for json_object false; ApiError naming "structured_output..." for a schema that is not a
// JSON object, an empty regex, grammar or choice list, or no kind set.
std::optional<OutputConstraint> output_constraint(const v1::StructuredOutput& output);
// The oneof as a MaskPolicy; ApiError (INVALID_ARGUMENT, naming "attention") when none is set.
MaskPolicy mask_policy(const v1::AttentionPolicy& attention);
SamplingParams sampling_params(const v1::GenerateRequest& request);
// ApiError naming "input" when no input is set.
GenerateInput generate_input(const v1::GenerateRequest& request, const std::string& request_id,
                             Clock::time_point deadline);

}  // namespace tessera
