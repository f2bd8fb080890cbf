// The request fields of structured outputs and tool calling: response_format, vLLM's
// structured_outputs, tools, tool_choice, parallel_tool_calls and tool messages; each error names
// its field.
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/http/openai_request.h"
#include "tests/unit/http/api_error_of.h"

namespace tessera::http {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// Every error here is the client's.
template <typename Fn>
Caught invalid_request(Fn&& fn) {
  Caught c = catch_api_error(std::forward<Fn>(fn));
  EXPECT_EQ(c.kind, ErrorKind::kInvalidRequest);
  return c;
}

const std::string kChatHead = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
const std::string kCompletionHead = R"({"model":"m","prompt":"x",)";

ParsedGenerate chat(const std::string& rest) {
  const std::string body = kChatHead + rest + "}";
  return parse_chat_request(parse_body(body), body);
}
ParsedGenerate completion(const std::string& rest) {
  const std::string body = kCompletionHead + rest + "}";
  return parse_completion_request(parse_body(body), body);
}
Caught chat_error(const std::string& rest) {
  return invalid_request([&] { chat(rest); });
}
Caught completion_error(const std::string& rest) {
  return invalid_request([&] { completion(rest); });
}

TEST(ResponseFormat, TextJsonObjectAndJsonSchema) {
  EXPECT_FALSE(chat(R"("response_format":{"type":"text"})").input.constraint);
  const ParsedGenerate object = completion(R"("response_format":{"type":"json_object"})");
  ASSERT_TRUE(object.input.constraint);
  EXPECT_EQ(object.input.constraint->kind, OutputConstraint::Kind::kJsonObject);
  EXPECT_EQ(object.input.constraint_param, "response_format");
  const ParsedGenerate schema = chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"person",
      "strict":true,"schema":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}}}}})");
  ASSERT_TRUE(schema.input.constraint);
  EXPECT_EQ(schema.input.constraint->kind, OutputConstraint::Kind::kJsonSchema);
  // The client's key order is kept: properties are generated in the order the schema lists them.
  EXPECT_EQ(schema.input.constraint->text,
            R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}}})");
}

TEST(ResponseFormat, ErrorsNameTheField) {
  EXPECT_EQ(chat_error(R"("response_format":"json")").param, "response_format");
  EXPECT_EQ(chat_error(R"("response_format":{"type":"yaml"})").param, "response_format.type");
  EXPECT_EQ(chat_error(R"("response_format":{"type":"json_schema"})").param, "response_format.json_schema");
  EXPECT_EQ(chat_error(R"("response_format":{"type":"json_schema","json_schema":{"schema":{}}})").param,
            "response_format.json_schema.name");
  const Caught e = chat_error(R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":"object"}})");
  EXPECT_EQ(e.param, "response_format.json_schema.schema");
  EXPECT_THAT(e.message, HasSubstr("expected a JSON schema object, got string"));
  EXPECT_EQ(chat_error(R"("response_format":{"type":"json_object","colour":1})").param, "response_format.colour");
}

TEST(StructuredOutputs, EachKind) {
  ParsedGenerate p = completion(R"("structured_outputs":{"regex":"[0-9]{3}"})");
  ASSERT_TRUE(p.input.constraint);
  EXPECT_EQ(p.input.constraint->kind, OutputConstraint::Kind::kRegex);
  EXPECT_EQ(p.input.constraint->text, "[0-9]{3}");
  EXPECT_EQ(p.input.constraint_param, "structured_outputs");
  p = chat(R"("structured_outputs":{"choice":["yes","no"]})");
  EXPECT_EQ(p.input.constraint->kind, OutputConstraint::Kind::kChoice);
  EXPECT_EQ(p.input.constraint->choices, (std::vector<std::string>{"yes", "no"}));
  p = chat(R"("structured_outputs":{"grammar":"root ::= \"a\"+"})");
  EXPECT_EQ(p.input.constraint->kind, OutputConstraint::Kind::kEbnf);
  p = chat(R"("structured_outputs":{"json":{"type":"object","required":["b","a"]}})");
  EXPECT_EQ(p.input.constraint->kind, OutputConstraint::Kind::kJsonSchema);
  EXPECT_EQ(p.input.constraint->text, R"({"type":"object","required":["b","a"]})");
  p = chat(R"("structured_outputs":{"json":"{\"type\": \"object\", \"title\": \"t\"}"})");
  EXPECT_EQ(p.input.constraint->text, R"({"type":"object","title":"t"})");
  p = chat(R"("structured_outputs":{"json_object":true,"disable_any_whitespace":true})");
  EXPECT_EQ(p.input.constraint->kind, OutputConstraint::Kind::kJsonObject);
  EXPECT_FALSE(p.input.constraint->any_whitespace);
}

TEST(StructuredOutputs, ErrorsNameTheField) {
  Caught e = chat_error(R"("structured_outputs":{"regex":"a","choice":["a"]})");
  EXPECT_EQ(e.param, "structured_outputs");
  EXPECT_THAT(e.message, HasSubstr("exactly one of json, regex, choice, grammar, json_object; got regex, choice"));
  EXPECT_EQ(chat_error(R"("structured_outputs":{})").param, "structured_outputs");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"regex":5})").param, "structured_outputs.regex");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"regex":""})").param, "structured_outputs.regex");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"choice":[]})").param, "structured_outputs.choice");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"choice":["a",1]})").param, "structured_outputs.choice");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"grammar":["root"]})").param, "structured_outputs.grammar");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"json":"{not json"})").param, "structured_outputs.json");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"json":[1]})").param, "structured_outputs.json");
  EXPECT_EQ(chat_error(R"("structured_outputs":{"structural_tag":"x"})").param, "structured_outputs.structural_tag");
  e = completion_error(R"("structured_outputs":{"regex":"a"},"response_format":{"type":"json_object"})");
  EXPECT_EQ(e.param, "structured_outputs");
  EXPECT_THAT(e.message, HasSubstr("cannot be combined with response_format json_object"));
  // A text response format leaves structured_outputs free.
  EXPECT_TRUE(chat(R"("structured_outputs":{"regex":"a"},"response_format":{"type":"text"})").input.constraint);
}

const std::string kWeatherTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather in a city",
        "parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},
        "required":["city"]}}})";

TEST(Tools, DefinitionsChoiceAndParallel) {
  ParsedGenerate p = chat(R"("tools":[)" + kWeatherTool + R"(])");
  ASSERT_EQ(p.input.tools.size(), 1u);
  EXPECT_EQ(p.input.tools[0].name, "get_weather");
  EXPECT_EQ(p.input.tools[0].description, "Weather in a city");
  EXPECT_EQ(p.input.tools[0].parameters,
            R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]})");
  EXPECT_EQ(p.input.tool_choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_TRUE(p.input.parallel_tool_calls);
  p = chat(R"("tools":[)" + kWeatherTool + R"(],"tool_choice":"required","parallel_tool_calls":false)");
  EXPECT_EQ(p.input.tool_choice.mode, ToolChoice::Mode::kRequired);
  EXPECT_FALSE(p.input.parallel_tool_calls);
  p = chat(R"("tools":[)" + kWeatherTool + R"(],"tool_choice":{"type":"function","function":{"name":"get_weather"}})");
  EXPECT_EQ(p.input.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(p.input.tool_choice.function, "get_weather");
  EXPECT_EQ(chat(R"("tools":[)" + kWeatherTool + R"(],"tool_choice":"none")").input.tool_choice.mode,
            ToolChoice::Mode::kNone);
  EXPECT_EQ(chat(R"("tools":[])").input.tool_choice.mode, ToolChoice::Mode::kNone);
}

TEST(Tools, ErrorsNameTheField) {
  EXPECT_EQ(chat_error(R"("tools":{"type":"function"})").param, "tools");
  EXPECT_EQ(chat_error(R"("tools":[{"type":"retrieval"}])").param, "tools[0].type");
  EXPECT_EQ(chat_error(R"("tools":[{"type":"function"}])").param, "tools[0].function");
  EXPECT_EQ(chat_error(R"("tools":[{"type":"function","function":{}}])").param, "tools[0].function.name");
  EXPECT_EQ(chat_error(R"("tools":[{"type":"function","function":{"name":"f","parameters":[]}}])").param,
            "tools[0].function.parameters");
  EXPECT_EQ(chat_error(R"("tools":[{"type":"function","function":{"name":"f","extra":1}}])").param,
            "tools[0].function.extra");
  std::string many = R"("tools":[)";
  for (int i = 0; i < 129; ++i) many += (i ? "," : "") + std::string(R"({"type":"function","function":{"name":"f)") + std::to_string(i) + "\"}}";
  const Caught e = chat_error(many + "]");
  EXPECT_EQ(e.param, "tools");
  EXPECT_THAT(e.message, HasSubstr("at most 128 tools, got 129"));
  EXPECT_EQ(chat_error(R"("tool_choice":"sometimes")").param, "tool_choice");
  EXPECT_EQ(chat_error(R"("tool_choice":{"type":"function"})").param, "tool_choice.function");
  EXPECT_EQ(chat_error(R"("tool_choice":{"type":"function","function":{}})").param, "tool_choice.function.name");
  EXPECT_EQ(chat_error(R"("parallel_tool_calls":"yes")").param, "parallel_tool_calls");
  // Completions take structured outputs but not tools.
  EXPECT_EQ(completion_error(R"("tools":[)" + kWeatherTool + "]").param, "tools");
  EXPECT_EQ(completion_error(R"("tool_choice":"auto")").param, "tool_choice");
}

TEST(Tools, ValidatedAgainstEachOther) {
  auto tools_error = [](std::vector<ToolDefinition> tools, ToolChoice choice) {
    return invalid_request([&] { Frontend::validate_tools(tools, choice); });
  };
  const ToolChoice automatic;
  ToolChoice named;
  named.mode = ToolChoice::Mode::kFunction;
  named.function = "lookup";
  Caught e = tools_error({{"get_weather", "", ""}}, named);
  EXPECT_EQ(e.param, "tool_choice");
  EXPECT_THAT(e.message, HasSubstr("no tool is named 'lookup' (tools: get_weather)"));
  e = tools_error({{"a", "", ""}, {"a", "", ""}}, automatic);
  EXPECT_EQ(e.param, "tools");
  EXPECT_THAT(e.message, HasSubstr("tools[1]: the name 'a' is used by another tool"));
  EXPECT_EQ(tools_error({{"has space", "", ""}}, automatic).param, "tools");
  EXPECT_EQ(tools_error({{std::string(65, 'x'), "", ""}}, automatic).param, "tools");
  EXPECT_EQ(tools_error({{"f", "", "[1]"}}, automatic).param, "tools");
  ToolChoice required;
  required.mode = ToolChoice::Mode::kRequired;
  EXPECT_EQ(tools_error({}, required).param, "tool_choice");
  EXPECT_NO_THROW(Frontend::validate_tools({{"get-weather_2", "", R"({"type":"object"})"}}, ToolChoice{}));
}

TEST(ToolMessages, AssistantCallsAndToolResults) {
  const std::string body = R"({"model":"m","messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":[{"type":"text","text":"18 C"}]}]})";
  const ParsedGenerate p = parse_chat_request(parse_body(body), body);
  const auto& m = *p.input.messages;
  ASSERT_EQ(m.size(), 3u);
  ASSERT_EQ(m[1].tool_calls.size(), 1u);
  EXPECT_EQ(m[1].content, "");
  EXPECT_EQ(m[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(m[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(m[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(m[2].role, "tool");
  EXPECT_EQ(m[2].tool_call_id, "call_1");
  EXPECT_EQ(m[2].content, "18 C");
}

TEST(ToolMessages, ErrorsNameTheField) {
  auto message_error = [](const std::string& message) {
    return invalid_request([&] { parse_chat_request(parse_body(R"({"model":"m","messages":[)" + message + "]}")); });
  };
  EXPECT_EQ(message_error(R"({"role":"tool","content":"x"})").param, "messages[0].tool_call_id");
  EXPECT_EQ(message_error(R"({"role":"user","content":"x","tool_call_id":"c"})").param, "messages[0].tool_call_id");
  EXPECT_EQ(message_error(R"({"role":"user","content":"x","tool_calls":[]})").param, "messages[0].tool_calls");
  EXPECT_EQ(message_error(R"({"role":"assistant","tool_calls":{}})").param, "messages[0].tool_calls");
  EXPECT_EQ(message_error(R"({"role":"assistant","tool_calls":[{"type":"function"}]})").param,
            "messages[0].tool_calls[0].function");
  EXPECT_EQ(message_error(R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]})").param,
            "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(message_error(R"({"role":"tool","tool_call_id":"c"})").param, "messages[0].content");
}

}  // namespace
}  // namespace tessera::http
