// tests/unit/http/mask_policy_json_test.cpp: the attention policy's JSON wire form: every policy,
// the round trip, and errors that name the field.
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "server/frontend/mask_policy_json.h"
#include "tests/error_of.h"

namespace tessera {
namespace {

TEST(MaskPolicyJson, ParsesEveryPolicy) {
  EXPECT_EQ(parse_mask_policy(R"({"causal":{}})").kind, MaskPolicy::Kind::kCausal);
  EXPECT_EQ(parse_mask_policy(R"({"bidirectional":{}})").kind, MaskPolicy::Kind::kBidirectional);
  const MaskPolicy w = parse_mask_policy(R"({"sliding_window":{"window":256,"sinks":4}})");
  EXPECT_EQ(w.kind, MaskPolicy::Kind::kSlidingWindow);
  EXPECT_EQ(w.window, 256);
  EXPECT_EQ(w.sinks, 4);
  EXPECT_EQ(parse_mask_policy(R"({"sliding_window":{"window":8}})").sinks, 0);
  const MaskPolicy s = parse_mask_policy(R"({"segments":{"lengths":[3,5],"shared_prefix":2}})");
  EXPECT_EQ(s.kind, MaskPolicy::Kind::kSegments);
  EXPECT_EQ(s.segment_lengths, (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(s.shared_prefix, 2);
  EXPECT_FALSE(s.parallel_positions);
  const MaskPolicy par = parse_mask_policy(R"({"segments":{"lengths":[3,5],"positions":"parallel"}})");
  EXPECT_TRUE(par.parallel_positions);
  // Round trip.
  EXPECT_EQ(mask_policy_from_json(mask_policy_to_json(s)).segment_lengths, s.segment_lengths);
  EXPECT_EQ(mask_policy_from_json(mask_policy_to_json(w)).window, 256);
  EXPECT_TRUE(mask_policy_from_json(mask_policy_to_json(par)).parallel_positions);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"segments":{"lengths":[3],"positions":"shuffled"}})"); })
                .find("attention.segments.positions must be \"sequential\" or \"parallel\""),
            std::string::npos);
}

TEST(MaskPolicyJson, ErrorsNameTheField) {
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"sliding_window":{"sinks":4}})"); }).find("attention.sliding_window.window is required"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"sliding_window":{"window":0}})"); }).find("attention.sliding_window.window must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"sliding_window":{"window":"8"}})"); }).find("attention.sliding_window.window must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"segments":{"lengths":[3,0]}})"); }).find("attention.segments.lengths[1]"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"segments":{}})"); }).find("attention.segments.lengths is required"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"causal":{"window":3}})"); }).find("attention.causal.window is not a known field"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"diagonal":{}})"); }).find("unknown policy \"diagonal\""), std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy(R"({"causal":{},"bidirectional":{}})"); }).find("exactly one policy"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_policy("{not json"); }).find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace tessera
