// tests/unit/tokenizer/chat_template_test.cpp: each template against transformers' render of the
// reference Jinja source (fixtures/chat_templates.json, written by make_chat_fixture.py), with and
// without tools, detection, names, and SmolLM2's default system prompt read from its GGUF.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/model_files.h"
#include "models/tokenizer/chat_template.h"
#include "models/weights/gguf.h"

namespace tessera {
namespace {

const char* kSmolLMSystem = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// The fixture's messages in OpenAI form; arguments are written compactly, as a client might, so
// the renderer has to re-serialise them the way the template does.
std::vector<ChatMessage> fixture_messages(const nlohmann::ordered_json& list) {
  std::vector<ChatMessage> messages;
  for (const auto& m : list) {
    ChatMessage message{m["role"], m["content"]};
    if (m.contains("tool_call_id")) message.tool_call_id = m["tool_call_id"];
    for (const auto& call : m.value("tool_calls", nlohmann::ordered_json::array())) {
      message.tool_calls.push_back({call["id"], call["function"]["name"], call["function"]["arguments"].dump()});
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

std::vector<ToolDefinition> fixture_tools(const nlohmann::ordered_json& c) {
  std::vector<ToolDefinition> tools;
  for (const auto& t : c.value("tools", nlohmann::ordered_json::array())) {
    const auto& f = t["function"];
    tools.push_back({f["name"], f.value("description", ""), f.contains("parameters") ? f["parameters"].dump() : ""});
  }
  return tools;
}

TEST(ChatTemplate, MatchesTransformersRendersOfTheReferenceTemplates) {
  std::ifstream in(std::string(TESSERA_TOKENIZER_FIXTURES) + "/chat_templates.json");
  ASSERT_TRUE(in.good());
  const auto cases = nlohmann::ordered_json::parse(in);
  ASSERT_GE(cases.size(), 200u);
  size_t renders = 0, errors = 0, with_tools = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"];
    const auto detected = detect_chat_template_details(c["source"].get<std::string>());
    ASSERT_TRUE(detected.has_value()) << name;
    EXPECT_EQ(chat_template_name(detected->kind), c["kind"].get<std::string>()) << name;
    EXPECT_EQ(detected->default_system_prompt, c["default_system_prompt"].get<std::string>()) << name;
    const auto messages = fixture_messages(c["messages"]);
    const auto tools = fixture_tools(c);
    with_tools += !tools.empty();
    const bool add_generation_prompt = c["add_generation_prompt"];
    const std::string context = name + " " + c["messages"].dump() + (tools.empty() ? "" : " +tools") +
                                (add_generation_prompt ? " +prompt" : "");
    const std::string bos = c["bos"], eos = c["eos"];
    if (c.contains("error")) {
      EXPECT_THROW(apply_chat_template(*detected, messages, tools, add_generation_prompt, bos, eos), Error) << context;
      ++errors;
    } else {
      EXPECT_EQ(apply_chat_template(*detected, messages, tools, add_generation_prompt, bos, eos),
                c["text"].get<std::string>())
          << context;
      ++renders;
    }
  }
  EXPECT_GE(renders, 180u);
  EXPECT_GE(errors, 30u);
  EXPECT_GE(with_tools, 60u);
}

const std::vector<ToolDefinition> kWeatherTool{
    {"get_weather", "Weather now.", R"({"type":"object","properties":{"city":{"type":"string"}}})"}};

TEST(ChatTemplate, Llama2HasNoToolFormat) {
  const ChatTemplate llama2{ChatTemplateKind::kLlama2, {}, ChatTemplateVariant::kBase};
  try {
    apply_chat_template(llama2, {{"user", "Hi"}}, kWeatherTool, true, "<s>", "</s>");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tool format"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(apply_chat_template(llama2, {{"user", "Hi"}}, {}, true, "<s>", "</s>"));
}

TEST(ChatTemplate, BaseTemplatesGivenToolsRenderTheirModelsToolFormat) {
  const std::vector<ChatMessage> chat{{"user", "Weather in Paris?"}};
  const ChatTemplate base_llama3{ChatTemplateKind::kLlama3, {}, ChatTemplateVariant::kBase};
  EXPECT_NE(apply_chat_template(base_llama3, chat, kWeatherTool, true).find("Environment: ipython\n"),
            std::string::npos);
  const ChatTemplate base_mistral{ChatTemplateKind::kMistral, {}, ChatTemplateVariant::kBase};
  EXPECT_EQ(apply_chat_template(base_mistral, chat, kWeatherTool, true, "<s>", "</s>"),
            "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
            "\"Weather now.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
            "\"string\"}}}}}][/AVAILABLE_TOOLS][INST] Weather in Paris?[/INST]");
  const ChatTemplate smollm{ChatTemplateKind::kChatML, kSmolLMSystem, ChatTemplateVariant::kBase};
  const std::string chatml = apply_chat_template(smollm, chat, kWeatherTool, true);
  EXPECT_EQ(chatml.rfind(std::string("<|im_start|>system\n") + kSmolLMSystem + "\n\n# Tools\n", 0), 0u) << chatml;
  EXPECT_NE(chatml.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), std::string::npos);
}

TEST(ChatTemplate, MalformedArgumentsAreAnError) {
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"call_1", "get_weather", "{\"city\": "});
  EXPECT_THROW(apply_chat_template(ChatTemplateKind::kChatML, {{"user", "Hi"}, call}, false), Error);
  call.tool_calls[0].arguments = "";  // no arguments: {}
  EXPECT_NE(apply_chat_template(ChatTemplateKind::kChatML, {{"user", "Hi"}, call}, false).find("\"arguments\": {}}"),
            std::string::npos);
}

TEST(ChatTemplate, MistralCallIdsAreNineAlphanumerics) {
  EXPECT_EQ(mistral_tool_call_id("abc123DEF"), "abc123DEF");
  for (const std::string id : {"call_8f2a", "call_0123456789abcdef", "", "abc-23DEF"}) {
    const std::string derived = mistral_tool_call_id(id);
    ASSERT_EQ(derived.size(), 9u) << id;
    for (const char c : derived) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    EXPECT_EQ(derived, mistral_tool_call_id(id));
  }
  EXPECT_NE(mistral_tool_call_id("call_1"), mistral_tool_call_id("call_2"));
  // A call and its result name the same derived id.
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"call_1", "get_weather", "{}"});
  ChatMessage result{"tool", "22"};
  result.tool_call_id = "call_1";
  const std::string text = apply_chat_template(ChatTemplateKind::kMistral, {{"user", "Hi"}, call, result}, false);
  const std::string id = mistral_tool_call_id("call_1");
  EXPECT_NE(text.find("\"id\": \"" + id + "\"}]"), std::string::npos) << text;
  EXPECT_NE(text.find("\"call_id\": \"" + id + "\"}[/TOOL_RESULTS]"), std::string::npos) << text;
}

TEST(ChatTemplate, NamesRoundTripAndUnknownNamesListTheKnownOnes) {
  for (const auto kind : {ChatTemplateKind::kChatML, ChatTemplateKind::kLlama2, ChatTemplateKind::kMistral,
                          ChatTemplateKind::kLlama3}) {
    EXPECT_EQ(chat_template_from_name(chat_template_name(kind)), kind);
  }
  try {
    chat_template_from_name("vicuna");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("vicuna"), std::string::npos) << what;
    EXPECT_NE(what.find("chatml, llama2, mistral, llama3"), std::string::npos) << what;
  }
  EXPECT_FALSE(detect_chat_template("{{ messages }}").has_value());
}

TEST(ChatTemplate, EscapedNewlinesInTheDefaultSystemPrompt) {
  const std::string src =
      "{% if messages[0]['role'] != \"system\" %}{{ '<|im_start|>system\\nBe brief.\\nBe kind.<|im_end|>\\n' }}"
      "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}{% endfor %}";
  const auto t = detect_chat_template_details(src);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->default_system_prompt, "Be brief.\nBe kind.");
  // A template that takes the system prompt from a variable has no default.
  const auto plain = detect_chat_template_details(
      "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n' + default_system + '<|im_end|>' }}{% endif %}");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->default_system_prompt, "");
}

TEST(ChatTemplate, SmolLM2GgufTemplateCarriesItsDefaultSystemPrompt) {
  const char* env = std::getenv("TESSERA_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir = env && *env ? std::filesystem::path(env)
                                                : std::filesystem::path(home ? home : "/") / ".cache/tessera/models";
  const auto path = dir / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SmolLM2 not fetched: " << path;
  const GgufFile gguf = GgufFile::open(path.string());
  const auto t = detect_chat_template_details(gguf.get_string("tokenizer.chat_template"));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->kind, ChatTemplateKind::kChatML);
  EXPECT_EQ(t->default_system_prompt, kSmolLMSystem);
  EXPECT_EQ(apply_chat_template(*t, {{"user", "Hi"}}, true),
            std::string("<|im_start|>system\n") + kSmolLMSystem +
                "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, LoadsTheTemplateAModelShips) {
  const std::filesystem::path smollm = std::filesystem::path(default_model_dir()) / "smollm2-135m-instruct";
  if (std::filesystem::exists(smollm)) {
    const ModelChatTemplate t = load_chat_template(locate_model(smollm.string()));
    ASSERT_TRUE(t.detected.has_value());
    EXPECT_EQ(t.detected->kind, ChatTemplateKind::kChatML);
    EXPECT_EQ(t.detected->default_system_prompt, kSmolLMSystem);
    EXPECT_EQ(t.bos_token, "<|im_start|>");
    EXPECT_EQ(t.eos_token, "<|im_end|>");
  }
  // An HF folder: tokenizer_config.json with a named-template list and token objects.
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_chat_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer_config.json") << R"({
      "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
      "chat_template": [{"name": "tool_use", "template": "{{ tools }}"},
                        {"name": "default", "template": "{{ bos_token }}[INST] {{ m }} [/INST]"}]})";
  }
  ModelFiles files;
  files.name = "test";
  files.dir = dir.string();
  const ModelChatTemplate t = load_chat_template(files);
  ASSERT_TRUE(t.detected.has_value());
  EXPECT_EQ(t.detected->kind, ChatTemplateKind::kMistral);
  EXPECT_EQ(t.bos_token, "<s>");
  EXPECT_EQ(t.eos_token, "</s>");
  // No tokenizer_config.json: no template, no error.
  std::filesystem::remove(dir / "tokenizer_config.json");
  EXPECT_TRUE(load_chat_template(files).source.empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
