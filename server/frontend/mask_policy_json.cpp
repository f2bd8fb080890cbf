// server/frontend/mask_policy_json.cpp: MaskPolicy from and to its JSON wire form.
#include "server/frontend/mask_policy_json.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tessera {

namespace {

constexpr const char* kKnownPolicies = "causal, bidirectional, sliding_window, segments";

int32_t read_int(const nlohmann::json& object, const std::string& key, const std::string& field,
                 std::optional<int32_t> default_value) {
  auto it = object.find(key);
  if (it == object.end()) {
    TESSERA_CHECK(default_value.has_value(), field << " is required");
    return *default_value;
  }
  TESSERA_CHECK(it->is_number_integer(), field << " must be an integer, got " << it->dump());
  const int64_t v = it->get<int64_t>();
  TESSERA_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
                field << " is out of range: " << v);
  return static_cast<int32_t>(v);
}

void reject_unknown_keys(const nlohmann::json& object, std::initializer_list<const char*> known,
                         const std::string& field) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    TESSERA_CHECK(ok, field << "." << it.key() << " is not a known field");
  }
}

}  // namespace

MaskPolicy mask_policy_from_json(const nlohmann::json& json) {
  TESSERA_CHECK(json.is_object() && json.size() == 1,
                "attention must be an object with exactly one policy (" << kKnownPolicies << "), got "
                                                                       << json.dump());
  const std::string kind = json.begin().key();
  const nlohmann::json& body = json.begin().value();
  const std::string field = "attention." + kind;
  TESSERA_CHECK(body.is_object(), field << " must be an object, got " << body.dump());
  if (kind == "causal") {
    reject_unknown_keys(body, {}, field);
    return MaskPolicy::causal();
  }
  if (kind == "bidirectional") {
    reject_unknown_keys(body, {}, field);
    return MaskPolicy::bidirectional();
  }
  if (kind == "sliding_window") {
    reject_unknown_keys(body, {"window", "sinks"}, field);
    MaskPolicy p = MaskPolicy::sliding_window(read_int(body, "window", field + ".window", std::nullopt),
                                              read_int(body, "sinks", field + ".sinks", 0));
    TESSERA_CHECK(p.window >= 1, field << ".window must be >= 1, got " << p.window);
    TESSERA_CHECK(p.sinks >= 0, field << ".sinks must be >= 0, got " << p.sinks);
    return p;
  }
  if (kind == "segments") {
    reject_unknown_keys(body, {"lengths", "shared_prefix", "positions"}, field);
    auto it = body.find("lengths");
    TESSERA_CHECK(it != body.end(), field << ".lengths is required");
    TESSERA_CHECK(it->is_array() && !it->empty(),
                  field << ".lengths must be a non-empty array of integers, got " << it->dump());
    std::vector<int32_t> lengths;
    for (size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& v = (*it)[i];
      TESSERA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 &&
                        v.get<int64_t>() <= std::numeric_limits<int32_t>::max(),
                    field << ".lengths[" << i << "] must be an integer >= 1, got " << v.dump());
      lengths.push_back(v.get<int32_t>());
    }
    const int32_t prefix = read_int(body, "shared_prefix", field + ".shared_prefix", 0);
    TESSERA_CHECK(prefix >= 0, field << ".shared_prefix must be >= 0, got " << prefix);
    bool parallel = false;
    if (auto pos = body.find("positions"); pos != body.end()) {
      TESSERA_CHECK(pos->is_string() && (*pos == "sequential" || *pos == "parallel"),
                    field << ".positions must be \"sequential\" or \"parallel\", got " << pos->dump());
      parallel = *pos == "parallel";
    }
    return MaskPolicy::segments(std::move(lengths), prefix, parallel);
  }
  TESSERA_FAIL("attention: unknown policy \"" << kind << "\" (expected one of " << kKnownPolicies << ")");
}

MaskPolicy parse_mask_policy(std::string_view json_text) {
  nlohmann::json json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  TESSERA_CHECK(!json.is_discarded(), "attention is not valid JSON: " << json_text);
  return mask_policy_from_json(json);
}

nlohmann::json mask_policy_to_json(const MaskPolicy& policy) {
  nlohmann::json body = nlohmann::json::object();
  switch (policy.kind) {
    case MaskPolicy::Kind::kCausal:
    case MaskPolicy::Kind::kBidirectional:
      break;
    case MaskPolicy::Kind::kSlidingWindow:
      body["window"] = policy.window;
      body["sinks"] = policy.sinks;
      break;
    case MaskPolicy::Kind::kSegments:
      body["lengths"] = policy.segment_lengths;
      body["shared_prefix"] = policy.shared_prefix;
      body["positions"] = policy.parallel_positions ? "parallel" : "sequential";
      break;
  }
  return nlohmann::json{{policy.name(), body}};
}

}  // namespace tessera
