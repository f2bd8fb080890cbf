// tests/unit/http/tool_calls_test.cpp: the tool-call format per template, the structural-tag
// constraint's JSON per format and tool_choice, and the streaming parser, fed every output in every
// split.
#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "server/frontend/tool_calls.h"

namespace tessera {
namespace {

using Json = nlohmann::ordered_json;

// What a parser made of a whole output: content and, per call, its name and arguments.
struct Collected {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool operator==(const Collected&) const = default;
};

void collect(Collected& into, const ParsedOutput& out) {
  into.content += out.content;
  for (const auto& delta : out.tool_calls) {
    ASSERT_LE(delta.index, static_cast<int32_t>(into.calls.size()));
    if (delta.index == static_cast<int32_t>(into.calls.size())) {
      ASSERT_FALSE(delta.name.empty()) << "a call's first delta carries its name";
      into.calls.push_back({delta.name, ""});
    } else {
      EXPECT_TRUE(delta.name.empty()) << "only a call's first delta carries its name";
    }
    into.calls[delta.index].second += delta.arguments;
  }
}

Collected parse_in_pieces(ToolCallFormat format, const std::string& text, const std::vector<size_t>& cuts) {
  ToolCallParser parser(format);
  Collected got;
  size_t from = 0;
  for (const size_t cut : cuts) {
    collect(got, parser.push(std::string_view(text).substr(from, cut - from)));
    from = cut;
  }
  collect(got, parser.push(std::string_view(text).substr(from)));
  collect(got, parser.finish());
  return got;
}

// Every split in two and three pieces, and one character at a time, gives the same result.
void expect_any_chunking(ToolCallFormat format, const std::string& text, const Collected& want) {
  EXPECT_EQ(parse_in_pieces(format, text, {}), want) << text;
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += 3) {
      const Collected got = parse_in_pieces(format, text, {a, b});
      ASSERT_EQ(got, want) << text << " cut at " << a << ", " << b << ": content '" << got.content << "'";
    }
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  EXPECT_EQ(parse_in_pieces(format, text, every), want) << text;
}

TEST(ToolCallParser, HermesCallsBetweenText) {
  const std::string args = R"({"city": "Paris \"}\" <tool_call>", "n": [1, {"a": 2}], "ok": true})";
  const std::string text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args +
                           "}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  expect_any_chunking(ToolCallFormat::kHermes, text, {"Let me check.\n\n", {{"get_weather", args}, {"now", "{}"}}});
  expect_any_chunking(ToolCallFormat::kHermes, "No calls, just <tool> talk <tool_call", {"No calls, just <tool> talk <tool_call", {}});
  // Not a call after all: the opening is text.
  expect_any_chunking(ToolCallFormat::kHermes, "<tool_call>oops</tool_call>", {"<tool_call>oops</tool_call>", {}});
}

TEST(ToolCallParser, Llama3JsonCall) {
  const std::string args = R"({"city": "Paris", "days": [1, 2]})";
  expect_any_chunking(ToolCallFormat::kLlama3Json, "{\"name\": \"get_weather\", \"parameters\": " + args + "}",
                      {"", {{"get_weather", args}}});
  // Whitespace as the model may write it, and "arguments" for "parameters".
  expect_any_chunking(ToolCallFormat::kLlama3Json, "{\"name\":\"now\" ,\n \"arguments\" :{ }}", {"", {{"now", "{ }"}}});
  expect_any_chunking(ToolCallFormat::kLlama3Json, "JSON like {\"a\": 1} or {\"name\": 5} is text",
                      {"JSON like {\"a\": 1} or {\"name\": 5} is text", {}});
}

TEST(ToolCallParser, MistralListOfCalls) {
  const std::string text =
      R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}, "id": "abc123DEF"}])";
  expect_any_chunking(ToolCallFormat::kMistral, text, {"", {{"get_weather", R"({"city": "Paris"})"}, {"now", "{}"}}});
  expect_any_chunking(ToolCallFormat::kMistral, R"(Sure.[TOOL_CALLS][{"name":"now","arguments":{}}])",
                      {"Sure.", {{"now", "{}"}}});
  expect_any_chunking(ToolCallFormat::kMistral, "[TOOL] [x]", {"[TOOL] [x]", {}});
}

TEST(ToolCallParser, HoldsBackOnlyWhatMayOpenACall) {
  ToolCallParser parser(ToolCallFormat::kHermes);
  EXPECT_EQ(parser.push("Hello <tool_").content, "Hello ");
  EXPECT_EQ(parser.push("x").content, "<tool_x");
  // The name is out as soon as it is complete, before any argument.
  const ParsedOutput header = parser.push("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  ASSERT_EQ(header.tool_calls.size(), 1u);
  EXPECT_EQ(header.tool_calls[0].name, "get_weather");
  EXPECT_EQ(header.tool_calls[0].index, 0);
  const ParsedOutput fragment = parser.push("{\"city\": \"Pa");
  ASSERT_EQ(fragment.tool_calls.size(), 1u);
  EXPECT_EQ(fragment.tool_calls[0].arguments, "{\"city\": \"Pa");
  EXPECT_TRUE(fragment.tool_calls[0].name.empty());
  EXPECT_EQ(parser.calls_started(), 1);
}

TEST(ToolCallParser, FinishKeepsAnUnfinishedCallsArguments) {
  expect_any_chunking(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
                      {"", {{"get_weather", "{\"city\": \"Par"}}});
  // A call that never got its name is text.
  expect_any_chunking(ToolCallFormat::kHermes, "<tool_call>\n{\"na", {"<tool_call>\n{\"na", {}});
  expect_any_chunking(ToolCallFormat::kLlama3Json, "{\"name\": \"get_w", {"{\"name\": \"get_w", {}});
}

TEST(ToolCallFormat, PerTemplateKind) {
  EXPECT_EQ(tool_call_format(ChatTemplateKind::kChatML), ToolCallFormat::kHermes);
  EXPECT_EQ(tool_call_format(ChatTemplateKind::kMistral), ToolCallFormat::kMistral);
  EXPECT_EQ(tool_call_format(ChatTemplateKind::kLlama3), ToolCallFormat::kLlama3Json);
  EXPECT_FALSE(tool_call_format(ChatTemplateKind::kLlama2).has_value());
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::kLlama3Json), "llama3_json");
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::kMistral), "mistral");
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::kHermes), "hermes");
}

const std::vector<ToolDefinition> kTools{
    {"get_weather", "Weather now.",
     R"({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]})"},
    {"now", "", ""}};

Json constraint_json(ToolCallFormat format, const ToolChoice& choice, bool parallel) {
  const auto constraint = tool_call_constraint(format, kTools, choice, parallel);
  EXPECT_TRUE(constraint.has_value());
  if (!constraint) return {};
  EXPECT_EQ(constraint->kind, OutputConstraint::Kind::kStructuralTag);
  const Json j = Json::parse(constraint->text);
  EXPECT_EQ(j["type"], "structural_tag");
  return j["format"];
}

void expect_call_tag(const Json& tag, const std::string& begin, const std::string& end, const Json& schema) {
  EXPECT_EQ(tag["type"], "tag");
  EXPECT_EQ(tag["begin"], begin);
  EXPECT_EQ(tag["end"], end);
  EXPECT_EQ(tag["content"]["type"], "json_schema");
  EXPECT_EQ(tag["content"]["json_schema"], schema);
}

TEST(ToolCallConstraint, HermesTagPerFunction) {
  const Json f = constraint_json(ToolCallFormat::kHermes, {}, true);
  EXPECT_EQ(f["type"], "triggered_tags");
  EXPECT_EQ(f["triggers"], Json::array({"<tool_call>"}));
  EXPECT_EQ(f["at_least_one"], false);
  EXPECT_EQ(f["stop_after_first"], false);
  ASSERT_EQ(f["tags"].size(), 2u);
  expect_call_tag(f["tags"][0], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", "}\n</tool_call>",
                  Json::parse(kTools[0].parameters));
  // Without parameters, any object.
  expect_call_tag(f["tags"][1], "<tool_call>\n{\"name\": \"now\", \"arguments\": ", "}\n</tool_call>",
                  Json{{"type", "object"}});
  // Key order survives: xgrammar follows the schema's declared property order.
  EXPECT_EQ(f["tags"][0]["content"]["json_schema"]["properties"].begin().key(), "city");
}

TEST(ToolCallConstraint, ChoiceAndParallel) {
  const Json required = constraint_json(ToolCallFormat::kLlama3Json, {ToolChoice::Mode::kRequired, ""}, false);
  EXPECT_EQ(required["at_least_one"], true);
  EXPECT_EQ(required["stop_after_first"], true);
  EXPECT_EQ(required["triggers"], Json::array({"{\"name\": "}));
  ASSERT_EQ(required["tags"].size(), 2u);
  expect_call_tag(required["tags"][0], "{\"name\": \"get_weather\", \"parameters\": ", "}",
                  Json::parse(kTools[0].parameters));
  const Json named = constraint_json(ToolCallFormat::kLlama3Json, {ToolChoice::Mode::kFunction, "now"}, true);
  EXPECT_EQ(named["at_least_one"], true);
  ASSERT_EQ(named["tags"].size(), 1u);
  EXPECT_EQ(named["tags"][0]["begin"], "{\"name\": \"now\", \"parameters\": ");
  // Every tag's begin starts with a trigger.
  for (const auto& tag : required["tags"]) EXPECT_TRUE(tag["begin"].get<std::string>().starts_with("{\"name\": "));
}

TEST(ToolCallConstraint, MistralListOfCallsAfterItsToken) {
  const Json f = constraint_json(ToolCallFormat::kMistral, {}, true);
  EXPECT_EQ(f["type"], "triggered_tags");
  EXPECT_EQ(f["triggers"], Json::array({"[TOOL_CALLS]"}));
  EXPECT_EQ(f["at_least_one"], false);
  EXPECT_EQ(f["stop_after_first"], true);
  ASSERT_EQ(f["tags"].size(), 1u);
  const Json& list = f["tags"][0];
  EXPECT_EQ(list["begin"], "[TOOL_CALLS] [");
  EXPECT_EQ(list["end"], "]");
  const Json& calls = list["content"];
  EXPECT_EQ(calls["type"], "tags_with_separator");
  EXPECT_EQ(calls["separator"], ", ");
  EXPECT_EQ(calls["at_least_one"], true);
  EXPECT_EQ(calls["stop_after_first"], false);
  ASSERT_EQ(calls["tags"].size(), 2u);
  expect_call_tag(calls["tags"][0], "{\"name\": \"get_weather\", \"arguments\": ", "}", Json::parse(kTools[0].parameters));
  const Json single = constraint_json(ToolCallFormat::kMistral, {ToolChoice::Mode::kRequired, ""}, false);
  EXPECT_EQ(single["at_least_one"], true);
  EXPECT_EQ(single["tags"][0]["content"]["stop_after_first"], true);
}

TEST(ToolCallConstraint, NoneNoToolsAndUnknownFunction) {
  EXPECT_FALSE(tool_call_constraint(ToolCallFormat::kHermes, kTools, {ToolChoice::Mode::kNone, ""}, true).has_value());
  EXPECT_FALSE(tool_call_constraint(ToolCallFormat::kHermes, {}, {}, true).has_value());
  EXPECT_THROW(tool_call_constraint(ToolCallFormat::kHermes, kTools, {ToolChoice::Mode::kFunction, "nope"}, true),
               Error);
  const std::vector<ToolDefinition> broken{{"f", "", "{\"type\": "}};
  EXPECT_THROW(tool_call_constraint(ToolCallFormat::kHermes, broken, {}, true), Error);
}

}  // namespace
}  // namespace tessera
