// kernels/backend/mask_policy.cpp: MaskPolicy parsing, validation and lowering.
#include "kernels/backend/mask_policy.h"

#include <algorithm>
#include <limits>

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

MaskPolicy MaskPolicy::bidirectional() {
  MaskPolicy p;
  p.kind = Kind::kBidirectional;
  return p;
}

MaskPolicy MaskPolicy::sliding_window(int32_t window, int32_t sinks) {
  MaskPolicy p;
  p.kind = Kind::kSlidingWindow;
  p.window = window;
  p.sinks = sinks;
  return p;
}

MaskPolicy MaskPolicy::segments(std::vector<int32_t> lengths, int32_t shared_prefix, bool parallel_positions) {
  MaskPolicy p;
  p.kind = Kind::kSegments;
  p.segment_lengths = std::move(lengths);
  p.shared_prefix = shared_prefix;
  p.parallel_positions = parallel_positions;
  return p;
}

int32_t MaskPolicy::rope_position(int32_t p) const {
  if (kind != Kind::kSegments || !parallel_positions || p < shared_prefix) return p;
  int32_t start = shared_prefix;
  int32_t longest = 0;
  for (int32_t len : segment_lengths) {
    if (p < start + len) return shared_prefix + (p - start);
    start += len;
    longest = std::max(longest, len);
  }
  return shared_prefix + longest + (p - start);  // the tail
}

MaskPolicy MaskPolicy::from_json(const nlohmann::json& json) {
  TESSERA_CHECK(json.is_object() && json.size() == 1,
                "attention must be an object with exactly one policy (" << kKnownPolicies << "), got "
                                                                       << json.dump());
  const std::string kind = json.begin().key();
  const nlohmann::json& body = json.begin().value();
  const std::string field = "attention." + kind;
  TESSERA_CHECK(body.is_object(), field << " must be an object, got " << body.dump());
  if (kind == "causal") {
    reject_unknown_keys(body, {}, field);
    return causal();
  }
  if (kind == "bidirectional") {
    reject_unknown_keys(body, {}, field);
    return bidirectional();
  }
  if (kind == "sliding_window") {
    reject_unknown_keys(body, {"window", "sinks"}, field);
    MaskPolicy p = sliding_window(read_int(body, "window", field + ".window", std::nullopt),
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
    return segments(std::move(lengths), prefix, parallel);
  }
  TESSERA_FAIL("attention: unknown policy \"" << kind << "\" (expected one of " << kKnownPolicies << ")");
}

MaskPolicy MaskPolicy::parse(std::string_view json_text) {
  nlohmann::json json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  TESSERA_CHECK(!json.is_discarded(), "attention is not valid JSON: " << json_text);
  return from_json(json);
}

nlohmann::json MaskPolicy::to_json() const {
  nlohmann::json body = nlohmann::json::object();
  switch (kind) {
    case Kind::kCausal:
    case Kind::kBidirectional:
      break;
    case Kind::kSlidingWindow:
      body["window"] = window;
      body["sinks"] = sinks;
      break;
    case Kind::kSegments:
      body["lengths"] = segment_lengths;
      body["shared_prefix"] = shared_prefix;
      body["positions"] = parallel_positions ? "parallel" : "sequential";
      break;
  }
  return nlohmann::json{{name(), body}};
}

std::string MaskPolicy::name() const {
  switch (kind) {
    case Kind::kCausal: return "causal";
    case Kind::kBidirectional: return "bidirectional";
    case Kind::kSlidingWindow: return "sliding_window";
    case Kind::kSegments: return "segments";
  }
  return "?";
}

kernels::MaskParams MaskPolicy::lower(std::vector<int32_t>& segment_ends) const {
  kernels::MaskParams m;
  switch (kind) {
    case Kind::kCausal:
      m.kind = kernels::MaskKind::kCausal;
      break;
    case Kind::kBidirectional:
      m.kind = kernels::MaskKind::kBidirectional;
      break;
    case Kind::kSlidingWindow:
      m.kind = kernels::MaskKind::kSlidingWindow;
      m.window = window;
      m.sinks = sinks;
      break;
    case Kind::kSegments: {
      m.kind = kernels::MaskKind::kSegments;
      m.shared_prefix = shared_prefix;
      segment_ends.clear();
      int32_t end = shared_prefix;
      for (int32_t len : segment_lengths) {
        end += len;
        segment_ends.push_back(end);
      }
      m.num_segments = static_cast<int32_t>(segment_ends.size());
      m.segment_ends = segment_ends.empty() ? nullptr : segment_ends.data();
      break;
    }
  }
  return m;
}

}  // namespace tessera
