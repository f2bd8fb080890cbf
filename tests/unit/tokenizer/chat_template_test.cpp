// tests/unit/tokenizer/chat_template_test.cpp: each template against jinja2's render of the
// reference Jinja source (fixtures/chat_templates.json, written by make_chat_fixture.py), detection,
// names, and SmolLM2's default system prompt read from its GGUF.
#include <gtest/gtest.h>

#include <unistd.h>

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

TEST(ChatTemplate, MatchesJinja2RendersOfTheReferenceTemplates) {
  std::ifstream in(std::string(TESSERA_TOKENIZER_FIXTURES) + "/chat_templates.json");
  ASSERT_TRUE(in.good());
  const auto cases = nlohmann::json::parse(in);
  ASSERT_GE(cases.size(), 50u);
  size_t renders = 0, errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"];
    const auto detected = detect_chat_template_details(c["source"].get<std::string>());
    ASSERT_TRUE(detected.has_value()) << name;
    EXPECT_STREQ(chat_template_name(detected->kind), name == "smollm2" ? "chatml" : name.c_str());
    EXPECT_EQ(detected->default_system_prompt, name == "smollm2" ? kSmolLMSystem : "");
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    const bool add_generation_prompt = c["add_generation_prompt"];
    const std::string context = name + " " + c["messages"].dump() + (add_generation_prompt ? " +prompt" : "");
    if (c.contains("error")) {
      EXPECT_THROW(apply_chat_template(*detected, messages, add_generation_prompt, c["bos"], c["eos"]), Error)
          << context;
      ++errors;
    } else {
      EXPECT_EQ(apply_chat_template(*detected, messages, add_generation_prompt, c["bos"], c["eos"]),
                c["text"].get<std::string>())
          << context;
      ++renders;
    }
  }
  EXPECT_GE(renders, 40u);
  EXPECT_GE(errors, 5u);
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
