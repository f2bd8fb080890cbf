// tests/unit/http/tool_call_grammar_test.cpp: the tool-call constraints compiled by the grammar
// engine and walked token by token, per format, tool_choice and parallel setting, over SmolLM2's
// byte-level vocabulary (when the model is present) and a SentencePiece vocabulary that has
// Mistral v0.3's [TOOL_CALLS] control token.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>

#include "common/error.h"
#include "engine/grammar/grammar.h"
#include "models/model_files.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/tokenizer.h"
#include "server/frontend/tool_calls.h"

namespace tessera {
namespace {

constexpr std::string_view kToolCallsToken = "[TOOL_CALLS]";

// The tiny SentencePiece fixture with [TOOL_CALLS] added as a control token, as Mistral v0.3's
// vocabulary has it: a byte-fallback vocabulary where the call opening is one special token.
std::unique_ptr<Tokenizer> mistral_like_tokenizer() {
  sentencepiece::SentencePieceProcessor sp;
  const std::string path = std::string(TESSERA_TOKENIZER_FIXTURES) + "/spm_tiny/tokenizer.model";
  TESSERA_CHECK(sp.Load(path).ok(), "cannot load " << path);
  tok::GgufTokenizerData d;
  d.model = "llama";
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    d.tokens.push_back(sp.IdToPiece(id));
    d.scores.push_back(sp.GetScore(id));
    using T = tok::GgufTokenType;
    const T type = sp.IsUnknown(id) ? T::kUnknown
                   : sp.IsControl(id) ? T::kControl
                   : sp.IsByte(id)    ? T::kByte
                   : sp.IsUnused(id)  ? T::kUnused
                                      : T::kNormal;
    d.token_types.push_back(static_cast<int32_t>(type));
  }
  for (const char* control : {"[TOOL_CALLS]", "[AVAILABLE_TOOLS]"}) {
    d.tokens.push_back(control);
    d.scores.push_back(0.0f);
    d.token_types.push_back(static_cast<int32_t>(tok::GgufTokenType::kControl));
  }
  d.bos_id = sp.bos_id();
  d.eos_id = sp.eos_id();
  d.unk_id = sp.unk_id();
  return tok::tokenizer_from_gguf(d);
}

std::unique_ptr<Tokenizer> smollm2_tokenizer() {
  const auto dir = std::filesystem::path(default_model_dir()) / "smollm2-135m-instruct";
  if (!std::filesystem::exists(dir)) return nullptr;
  return load_tokenizer(locate_model(dir.string()));
}

// A tokenizer with its compiler, built once per suite: SmolLM2's 49k vocabulary takes seconds.
struct Model {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<GrammarCompiler> compiler;
  int32_t stop = -1;
  bool sentencepiece = false;
};

std::unique_ptr<Model> make_model(std::unique_ptr<Tokenizer> tokenizer, const std::string& stop, bool sentencepiece) {
  if (!tokenizer) return nullptr;
  auto model = std::make_unique<Model>();
  model->stop = tokenizer->token_to_id(stop);
  TESSERA_CHECK(model->stop >= 0, "no stop token " << stop);
  GrammarCompilerConfig config;
  config.stop_token_ids = {model->stop};
  config.vocab_size = static_cast<int32_t>(tokenizer->vocab_size());
  model->compiler = std::make_unique<GrammarCompiler>(*tokenizer, config);
  model->tokenizer = std::move(tokenizer);
  model->sentencepiece = sentencepiece;
  return model;
}

// One piece of output as the model writes it. SentencePiece puts "▁" (a space) before the first
// piece of what it encodes: a piece that starts with a space keeps it that way, one that does not
// loses it, as a model's first piece after a control token has none.
std::vector<int32_t> segment_ids(const Model& m, std::string_view text) {
  if (!m.sentencepiece) return m.tokenizer->encode(text, false).ids;
  const bool spaced = text.starts_with(' ');
  auto ids = m.tokenizer->encode(spaced ? text.substr(1) : text, false).ids;
  if (spaced || ids.empty()) return ids;
  const std::string first = m.tokenizer->id_to_token(ids[0]);
  const std::string space = "\u2581";
  TESSERA_CHECK(first.starts_with(space), "first piece '" << first << "' has no leading space");
  if (first == space) {
    ids.erase(ids.begin());
  } else {
    ids[0] = m.tokenizer->token_to_id(first.substr(space.size()));
    TESSERA_CHECK(ids[0] >= 0, "no piece '" << first.substr(space.size()) << "'");
  }
  return ids;
}

// The ids a model writes for `text`: [TOOL_CALLS] as its one control token where the vocabulary has
// it, everything else as the tokenizer splits it.
std::vector<int32_t> output_ids(const Model& m, std::string_view text) {
  const int32_t marker = m.tokenizer->token_to_id(kToolCallsToken);
  std::vector<int32_t> ids;
  while (!text.empty()) {
    const size_t at = marker >= 0 ? text.find(kToolCallsToken) : std::string_view::npos;
    const auto piece = segment_ids(m, text.substr(0, at));
    ids.insert(ids.end(), piece.begin(), piece.end());
    if (at == std::string_view::npos) break;
    ids.push_back(marker);
    text.remove_prefix(at + kToolCallsToken.size());
  }
  return ids;
}

struct Call {
  std::string name;
  std::string arguments;
};

// Calls written as the format's model writes them.
std::string call_text(ToolCallFormat format, const std::vector<Call>& calls) {
  std::string out = format == ToolCallFormat::kMistral ? "[TOOL_CALLS] [" : "";
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string key = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
    const std::string call = "{\"name\": \"" + calls[i].name + "\", \"" + key + "\": " + calls[i].arguments + "}";
    switch (format) {
      case ToolCallFormat::kHermes: out += (i ? "\n" : "") + ("<tool_call>\n" + call + "\n</tool_call>"); break;
      case ToolCallFormat::kLlama3Json: out += (i ? "\n" : "") + call; break;
      case ToolCallFormat::kMistral: out += (i ? ", " : "") + call; break;
    }
  }
  return format == ToolCallFormat::kMistral ? out + "]" : out;
}

const std::vector<ToolDefinition> kTools{
    {"get_weather", "Weather now.",
     R"({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
         "required": ["city"]})"},
    {"now", "", ""}};

const Call kWeather{"get_weather", R"({"city": "Paris", "unit": "c"})"};
const Call kNow{"now", "{}"};

// What the grammar lets through, the parser reads back as the same calls.
void expect_parsed(ToolCallFormat format, const std::string& text, const std::vector<Call>& want) {
  ToolCallParser parser(format);
  ParsedOutput out = parser.push(text);
  const ParsedOutput rest = parser.finish();
  out.content += rest.content;
  out.tool_calls.insert(out.tool_calls.end(), rest.tool_calls.begin(), rest.tool_calls.end());
  // Whitespace between calls is text to both the grammar and the parser.
  EXPECT_EQ(out.content.find_first_not_of(" \n"), std::string::npos) << text;
  ASSERT_EQ(out.tool_calls.size(), want.size()) << text;  // whole text at once: one delta per call
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(out.tool_calls[i].name, want[i].name);
    EXPECT_EQ(out.tool_calls[i].arguments, want[i].arguments);
  }
}

struct Case {
  ToolCallFormat format;
  ToolChoice choice;
  bool parallel;
};

std::string describe(const Case& c) {
  const char* modes[] = {"none", "auto", "required", "function"};
  return std::string(tool_call_format_name(c.format)) + " tool_choice=" + modes[static_cast<int>(c.choice.mode)] +
         (c.parallel ? " parallel" : " single");
}

std::vector<Case> all_cases(ToolCallFormat format) {
  std::vector<Case> cases;
  for (const ToolChoice& choice : {ToolChoice{ToolChoice::Mode::kAuto, ""}, ToolChoice{ToolChoice::Mode::kRequired, ""},
                                   ToolChoice{ToolChoice::Mode::kFunction, "get_weather"}}) {
    for (const bool parallel : {false, true}) cases.push_back({format, choice, parallel});
  }
  return cases;
}

class ToolCallGrammar : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    spm_ = make_model(mistral_like_tokenizer(), "</s>", true).release();
    smollm2_ = make_model(smollm2_tokenizer(), "<|im_end|>", false).release();
  }
  static void TearDownTestSuite() {
    delete spm_;
    delete smollm2_;
    spm_ = smollm2_ = nullptr;
  }

  static std::shared_ptr<const CompiledGrammar> compile(const Model& m, const Case& c) {
    const auto constraint = tool_call_constraint(c.format, kTools, c.choice, c.parallel);
    TESSERA_CHECK(constraint.has_value(), "no constraint for " << describe(c));
    return m.compiler->compile(*constraint);
  }

  // How many of text's tokens the grammar takes before it refuses one; all of them and then the
  // stop token for a complete output.
  static bool accepts(const Model& m, const std::shared_ptr<const CompiledGrammar>& grammar, const std::string& text) {
    GrammarMatcher matcher(grammar);
    for (const int32_t id : output_ids(m, text)) {
      if (!matcher.accept_token(id)) return false;
    }
    return matcher.accept_token(m.stop) && matcher.is_terminated();
  }

  // Refused at some token of text itself, not only at the stop token.
  static bool refused_within(const Model& m, const std::shared_ptr<const CompiledGrammar>& grammar,
                             const std::string& text) {
    GrammarMatcher matcher(grammar);
    for (const int32_t id : output_ids(m, text)) {
      if (!matcher.accept_token(id)) return true;
    }
    return false;
  }

  static void check_format(const Model& m, ToolCallFormat format);
  static void check_case(const Model& m, const Case& c);

  static Model* spm_;
  static Model* smollm2_;
};

Model* ToolCallGrammar::spm_ = nullptr;
Model* ToolCallGrammar::smollm2_ = nullptr;

void ToolCallGrammar::check_case(const Model& m, const Case& c) {
  SCOPED_TRACE(describe(c));
  std::shared_ptr<const CompiledGrammar> grammar;
  ASSERT_NO_THROW(grammar = compile(m, c));
  const ToolCallFormat f = c.format;
  const bool named = c.choice.mode == ToolChoice::Mode::kFunction;
  const std::string one = call_text(f, {kWeather});
  EXPECT_TRUE(accepts(m, grammar, one)) << one;
  expect_parsed(f, one, {kWeather});
  // Compact JSON, escapes and UTF-8 in the arguments.
  EXPECT_TRUE(accepts(m, grammar, call_text(f, {{"get_weather", R"({"city":"S\u00e3o \"Paulo\" été"})"}})));
  EXPECT_TRUE(refused_within(m, grammar, call_text(f, {{"delete_files", "{}"}})));
  EXPECT_TRUE(refused_within(m, grammar, call_text(f, {{"get_weather", R"({"unit": "c"})"}})));
  EXPECT_TRUE(refused_within(m, grammar, call_text(f, {{"get_weather", R"({"city": 5})"}})));
  EXPECT_TRUE(refused_within(m, grammar, call_text(f, {{"get_weather", R"({"city": "Paris", "unit": "k"})"}})));
  EXPECT_EQ(accepts(m, grammar, call_text(f, {kNow})), !named);
  const std::string two = call_text(f, {kWeather, named ? kWeather : kNow});
  if (c.parallel) {
    EXPECT_TRUE(accepts(m, grammar, two)) << two;
    expect_parsed(f, two, {kWeather, named ? kWeather : kNow});
  } else {
    EXPECT_TRUE(refused_within(m, grammar, two)) << two;
  }
  const std::string text = "Let me check the weather. ";
  if (c.choice.mode == ToolChoice::Mode::kAuto) {
    EXPECT_TRUE(accepts(m, grammar, text));
    EXPECT_TRUE(accepts(m, grammar, text + one)) << text + one;
    EXPECT_TRUE(refused_within(m, grammar, text + call_text(f, {{"get_weather", R"({"city": 5})"}})));
  } else {
    EXPECT_TRUE(refused_within(m, grammar, text + one));
  }
}

void ToolCallGrammar::check_format(const Model& m, ToolCallFormat format) {
  for (const Case& c : all_cases(format)) check_case(m, c);
}

TEST_F(ToolCallGrammar, HermesOverSmolLM2) {
  if (!smollm2_) GTEST_SKIP() << "SmolLM2 is not in the model dir (scripts/fetch-models)";
  check_format(*smollm2_, ToolCallFormat::kHermes);
}

TEST_F(ToolCallGrammar, Llama3JsonOverSmolLM2) {
  if (!smollm2_) GTEST_SKIP() << "SmolLM2 is not in the model dir (scripts/fetch-models)";
  check_format(*smollm2_, ToolCallFormat::kLlama3Json);
}

// SmolLM2 has no [TOOL_CALLS] token: the opening is spelled in ordinary pieces.
TEST_F(ToolCallGrammar, MistralOverSmolLM2) {
  if (!smollm2_) GTEST_SKIP() << "SmolLM2 is not in the model dir (scripts/fetch-models)";
  check_format(*smollm2_, ToolCallFormat::kMistral);
}

TEST_F(ToolCallGrammar, HermesOverSentencePiece) { check_format(*spm_, ToolCallFormat::kHermes); }

TEST_F(ToolCallGrammar, Llama3JsonOverSentencePiece) { check_format(*spm_, ToolCallFormat::kLlama3Json); }

// The calls open with the single [TOOL_CALLS] control token.
TEST_F(ToolCallGrammar, MistralOverSentencePieceWithItsControlToken) {
  check_format(*spm_, ToolCallFormat::kMistral);
}

bool allowed(const std::vector<int32_t>& row, int32_t token) {
  return (static_cast<uint32_t>(row[token / 32]) >> (token % 32)) & 1u;
}

// The engine keeps [TOOL_CALLS]'s text only because the constraint names it; other control tokens
// ([AVAILABLE_TOOLS]) stay unmatchable.
TEST_F(ToolCallGrammar, MistralControlTokenIsAllowedWhereACallMayOpen) {
  const int32_t tool_calls = spm_->tokenizer->token_to_id(kToolCallsToken);
  const int32_t available_tools = spm_->tokenizer->token_to_id("[AVAILABLE_TOOLS]");
  ASSERT_GE(tool_calls, 0);
  ASSERT_TRUE(spm_->tokenizer->is_special(tool_calls));
  EXPECT_EQ(output_ids(*spm_, call_text(ToolCallFormat::kMistral, {kWeather})).front(), tool_calls);
  std::vector<int32_t> row(spm_->compiler->bitmask_words());
  for (const auto mode : {ToolChoice::Mode::kRequired, ToolChoice::Mode::kAuto}) {
    GrammarMatcher matcher(compile(*spm_, {ToolCallFormat::kMistral, {mode, ""}, true}));
    matcher.fill_next_token_bitmask(row);
    EXPECT_TRUE(allowed(row, tool_calls));
    EXPECT_FALSE(allowed(row, available_tools));
    EXPECT_EQ(allowed(row, spm_->stop), mode == ToolChoice::Mode::kAuto);
    ASSERT_TRUE(matcher.accept_token(tool_calls));
    matcher.fill_next_token_bitmask(row);
    EXPECT_FALSE(allowed(row, tool_calls));
    EXPECT_FALSE(allowed(row, spm_->stop));
  }
}

}  // namespace
}  // namespace tessera
