// server/frontend/mask_policy_json.h: the wire form of a MaskPolicy, as request bodies (the
// `tessera.attention` object) and `tessera generate --attention` spell it.
#pragma once

#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "kernels/backend/mask_policy.h"

namespace tessera {

// {"causal":{}}, {"bidirectional":{}}, {"sliding_window":{"window":256,"sinks":4}},
// {"segments":{"lengths":[...],"shared_prefix":N,"positions":"sequential"|"parallel"}}. Throws
// tessera::Error naming the field (e.g. "attention.sliding_window.window") and what was expected.
MaskPolicy mask_policy_from_json(const nlohmann::json& json);
// The same from JSON text; text that is not JSON is an error too.
MaskPolicy parse_mask_policy(std::string_view json_text);
nlohmann::json mask_policy_to_json(const MaskPolicy& policy);

}  // namespace tessera
