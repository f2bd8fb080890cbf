// tests/unit/grammar/grammar_test.cpp: the grammar engine over real vocabularies: the tiny
// byte-level BPE and SentencePiece test tokenizers, and SmolLM2's 49k vocabulary when it is present.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/vocabulary.h"
#include "models/model_files.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/tokenizer.h"
#include "tests/unit/tokenizer/test_vocab.h"

namespace tessera {
namespace {

using grammar_detail::VocabEncoding;

// The tiny byte-level vocabulary: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (the stop token),
// bytes 3..258, merges, then <tool>; the logits are padded to 300.
constexpr int32_t kImStart = 1;
constexpr int32_t kImEnd = 2;
constexpr int32_t kPaddedVocab = 300;

std::unique_ptr<Tokenizer> byte_level_tokenizer() {
  return tok::tokenizer_from_gguf(tok::testing::byte_level_vocab());
}

std::unique_ptr<Tokenizer> spm_tokenizer() {
  return tok::load_sentencepiece_model(std::string(TESSERA_TOKENIZER_FIXTURES) + "/spm_tiny/tokenizer.model",
                                       true, false);
}

std::unique_ptr<Tokenizer> smollm2_tokenizer() {
  const auto dir = std::filesystem::path(default_model_dir()) / "smollm2-135m-instruct";
  if (!std::filesystem::exists(dir)) return nullptr;
  return load_tokenizer(locate_model(dir.string()));
}

bool allowed(const std::vector<int32_t>& row, int32_t token) {
  return (static_cast<uint32_t>(row[token / 32]) >> (token % 32)) & 1u;
}

OutputConstraint schema(std::string text) {
  return {OutputConstraint::Kind::kJsonSchema, std::move(text), {}, true};
}

class GrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = byte_level_tokenizer();
    GrammarCompilerConfig config;
    config.stop_token_ids = {kImEnd};
    config.vocab_size = kPaddedVocab;
    compiler_ = std::make_unique<GrammarCompiler>(*tokenizer_, config);
  }

  std::vector<int32_t> mask(GrammarMatcher& matcher) {
    std::vector<int32_t> row(compiler_->bitmask_words());
    matcher.fill_next_token_bitmask(row);
    return row;
  }

  // Accepts every token of `text` (as the tokenizer splits it); returns how many were accepted.
  size_t accept_text(GrammarMatcher& matcher, const std::string& text) {
    const auto ids = tokenizer_->encode(text, false).ids;
    size_t accepted = 0;
    while (accepted < ids.size() && matcher.accept_token(ids[accepted])) ++accepted;
    return accepted;
  }

  bool walks(const OutputConstraint& constraint, const std::string& text) {
    GrammarMatcher matcher(compiler_->compile(constraint));
    const size_t tokens = tokenizer_->encode(text, false).ids.size();
    return accept_text(matcher, text) == tokens && matcher.accept_token(kImEnd) && matcher.is_terminated();
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GrammarCompiler> compiler_;
};

const char* kPersonSchema = R"({"type": "object", "properties": {"name": {"type": "string"},
  "age": {"type": "integer", "minimum": 0}}, "required": ["name", "age"]})";

TEST(VocabEncoding, DetectedFromTheVocabulary) {
  auto detect = [](const Tokenizer& t) {
    std::vector<std::string> tokens;
    for (int32_t id = 0; id < t.vocab_size(); ++id) tokens.push_back(t.id_to_token(id));
    return grammar_detail::detect_vocab_encoding(tokens);
  };
  EXPECT_EQ(detect(*byte_level_tokenizer()), VocabEncoding::kByteLevel);
  EXPECT_EQ(detect(*spm_tokenizer()), VocabEncoding::kByteFallback);
  EXPECT_EQ(grammar_detail::detect_vocab_encoding({"hello", "world", "##s"}), VocabEncoding::kRaw);
  if (const auto smollm = smollm2_tokenizer()) {
    EXPECT_EQ(detect(*smollm), VocabEncoding::kByteLevel);
  }
}

TEST_F(GrammarTest, SchemaMaskAtTheStartAllowsBraceLedTokensOnly) {
  GrammarMatcher matcher(compiler_->compile(schema(kPersonSchema)));
  std::vector<int32_t> row(compiler_->bitmask_words());
  EXPECT_TRUE(matcher.fill_next_token_bitmask(row));
  int count = 0;
  for (int32_t id = 0; id < kPaddedVocab; ++id) {
    if (!allowed(row, id)) continue;
    ++count;
    EXPECT_EQ(tokenizer_->decode({id}, false).front(), '{') << "token " << id;
  }
  EXPECT_GE(count, 1);
  EXPECT_TRUE(allowed(row, tokenizer_->encode("{", false).ids[0]));
  EXPECT_FALSE(allowed(row, kImEnd));
  EXPECT_FALSE(allowed(row, kPaddedVocab - 1));
}

TEST_F(GrammarTest, ValidAnswerIsAcceptedAndTerminatesAfterTheStopToken) {
  GrammarMatcher matcher(compiler_->compile(schema(kPersonSchema)));
  const std::string answer = R"({"name": "hello world", "age": 12})";
  EXPECT_EQ(accept_text(matcher, answer), tokenizer_->encode(answer, false).ids.size());
  EXPECT_FALSE(matcher.is_terminated());
  EXPECT_TRUE(allowed(mask(matcher), kImEnd));
  EXPECT_TRUE(matcher.accept_token(kImEnd));
  EXPECT_TRUE(matcher.is_terminated());
  EXPECT_FALSE(matcher.accept_token(tokenizer_->encode("x", false).ids[0]));
}

TEST_F(GrammarTest, ForbiddenTokenIsRefusedAndChangesNothing) {
  GrammarMatcher matcher(compiler_->compile(schema(kPersonSchema)));
  ASSERT_EQ(accept_text(matcher, R"({"name")"), tokenizer_->encode(R"({"name")", false).ids.size());
  const auto before = mask(matcher);
  const int32_t brace = tokenizer_->encode("}", false).ids[0];
  EXPECT_FALSE(allowed(before, brace));
  EXPECT_FALSE(matcher.accept_token(brace));
  EXPECT_FALSE(matcher.accept_token(kImEnd));
  EXPECT_FALSE(matcher.accept_token(kPaddedVocab + 5));
  EXPECT_EQ(mask(matcher), before);
  EXPECT_EQ(accept_text(matcher, R"(: "a", "age": 3})"), tokenizer_->encode(R"(: "a", "age": 3})", false).ids.size());
}

TEST_F(GrammarTest, RollbackRestoresAnEarlierState) {
  GrammarMatcher matcher(compiler_->compile(schema(kPersonSchema)));
  const auto ids = tokenizer_->encode(R"({"name": "x")", false).ids;
  ASSERT_GE(ids.size(), 4u);
  ASSERT_TRUE(matcher.accept_token(ids[0]));
  const auto after_one = mask(matcher);
  for (size_t i = 1; i < 4; ++i) ASSERT_TRUE(matcher.accept_token(ids[i]));
  EXPECT_NE(mask(matcher), after_one);
  matcher.rollback(3);
  EXPECT_EQ(mask(matcher), after_one);
  EXPECT_THROW(matcher.rollback(2), Error);
  matcher.rollback(1);
  EXPECT_EQ(accept_text(matcher, R"({"name": "x", "age": 0})"), tokenizer_->encode(R"({"name": "x", "age": 0})", false).ids.size());
}

TEST_F(GrammarTest, RegexChoiceAndEbnf) {
  const OutputConstraint regex{OutputConstraint::Kind::kRegex, "[0-9]{3}-[a-z]+", {}, true};
  EXPECT_TRUE(walks(regex, "123-abc"));
  EXPECT_FALSE(walks(regex, "12-abc"));
  const OutputConstraint choice{OutputConstraint::Kind::kChoice, "", {"yes", "no", R"(say "hi"\)"}, true};
  EXPECT_TRUE(walks(choice, "yes"));
  EXPECT_TRUE(walks(choice, R"(say "hi"\)"));
  EXPECT_FALSE(walks(choice, "ye"));
  EXPECT_FALSE(walks(choice, "yesno"));
  const OutputConstraint arithmetic{OutputConstraint::Kind::kEbnf, R"ebnf(
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= factor (("*" | "/") factor)*
    factor ::= [0-9]+ | "(" expr ")")ebnf", {}, true};
  EXPECT_TRUE(walks(arithmetic, "(12+3)*4-5/6"));
  EXPECT_FALSE(walks(arithmetic, "(1+2"));
  EXPECT_FALSE(walks(arithmetic, "1++2"));
}

TEST_F(GrammarTest, PatternsAndTightenedFormatsHold) {
  EXPECT_TRUE(walks(schema(R"({"type": "string", "pattern": "^a\\.b$"})"), R"("a.b")"));
  EXPECT_FALSE(walks(schema(R"({"type": "string", "pattern": "^a\\.b$"})"), R"("axb")"));
  const auto optional_part = schema(R"({"type": "string", "pattern": "^[A-Z]{2}(-[0-9]+)?$"})");
  EXPECT_TRUE(walks(optional_part, R"("AB-12")"));
  EXPECT_TRUE(walks(optional_part, R"("AB")"));
  EXPECT_FALSE(walks(optional_part, R"("AB12")"));
  const auto time = schema(R"({"type": "string", "format": "time"})");
  EXPECT_TRUE(walks(time, R"("23:59:01.5Z")"));
  EXPECT_FALSE(walks(time, R"("23:59:015Z")"));
  EXPECT_FALSE(walks(time, R"("23:59:60Z")"));
  const auto ipv4 = schema(R"({"type": "string", "format": "ipv4"})");
  EXPECT_TRUE(walks(ipv4, R"("192.168.0.1")"));
  EXPECT_FALSE(walks(ipv4, R"("192.168.00.1")"));
  const auto date = schema(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(walks(date, R"("2024-12-31")"));
  EXPECT_FALSE(walks(date, R"("2023-02-31")"));
}

TEST_F(GrammarTest, JsonObjectTakesAnyObjectButNoArray) {
  const OutputConstraint object{OutputConstraint::Kind::kJsonObject, "", {}, true};
  EXPECT_TRUE(walks(object, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(walks(object, "[1]"));
}

TEST_F(GrammarTest, ControlTokensAreNeverFreeTextButAStructuralTagMatchesItsMarker) {
  GrammarMatcher any_string(compiler_->compile(schema(R"({"type": "string"})")));
  ASSERT_EQ(accept_text(any_string, "\"ab"), 3u);
  const auto in_string = mask(any_string);
  EXPECT_TRUE(allowed(in_string, tokenizer_->encode("<", false).ids[0]));
  EXPECT_FALSE(allowed(in_string, kImStart));
  EXPECT_FALSE(allowed(in_string, 0));

  const OutputConstraint tag{OutputConstraint::Kind::kStructuralTag, R"({"type": "structural_tag",
    "format": {"type": "triggered_tags", "triggers": ["<|im_start|>"], "tags": [{"type": "tag",
      "begin": "<|im_start|>", "content": {"type": "json_schema", "json_schema": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}, "end": "\n"}]}})", {}, true};
  GrammarMatcher tool_call(compiler_->compile(tag));
  EXPECT_TRUE(allowed(mask(tool_call), kImStart));
  EXPECT_EQ(accept_text(tool_call, "hello "), 2u);
  EXPECT_TRUE(tool_call.accept_token(kImStart));
  EXPECT_FALSE(allowed(mask(tool_call), kImStart));
  const std::string call = "{\"city\": \"Paris\"}\n";
  EXPECT_EQ(accept_text(tool_call, call), tokenizer_->encode(call, false).ids.size());
  EXPECT_TRUE(tool_call.accept_token(kImEnd));
}

TEST_F(GrammarTest, SchemaErrorsNameTheKeywordAndWhereItIs) {
  auto where_of = [&](const std::string& text) -> std::string {
    try {
      compiler_->compile(schema(text));
    } catch (const GrammarError& e) {
      EXPECT_NE(std::string(e.what()).find(e.where().substr(e.where().rfind('.') + 1)), std::string::npos)
          << e.what();
      return e.where();
    }
    return "(compiled)";
  };
  EXPECT_EQ(where_of(R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": "3"}}})"),
            "properties.age.minimum");
  EXPECT_EQ(where_of(R"({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": true}}})"),
            "properties.tags.uniqueItems");
  EXPECT_EQ(where_of(R"({"not": {"type": "string"}})"), "not");
  EXPECT_EQ(where_of(R"({"type": "string", "format": "credit-card"})"), "format");
  EXPECT_EQ(where_of(R"({"type": "number", "multipleOf": 0.5})"), "multipleOf");
  EXPECT_EQ(where_of(R"({"anyOf": [{"type": "string"}, {"type": "integer", "maximum": []}]})"),
            "anyOf.1.maximum");
  EXPECT_EQ(where_of(R"({"$ref": "#/$defs/a", "minimum": 1, "$defs": {"a": {"type": "integer"}}})"),
            "minimum");
  EXPECT_EQ(where_of(R"({"type": "object", "properties": {"x": {"type": "strin"}}})"), "properties.x.type");
  EXPECT_EQ(where_of(R"({"minLength": 2})"), "minLength");
  EXPECT_EQ(where_of(R"({"type": "integer", "minimum": 5, "maximum": 1})"), "");  // xgrammar's own check
  try {
    compiler_->compile(schema(R"({"type": "object",)"));
    FAIL() << "invalid JSON compiled";
  } catch (const GrammarError& e) {
    EXPECT_EQ(e.where(), "");
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
}

TEST_F(GrammarTest, RegexAndEbnfErrorsGiveXgrammarsReasonWithoutItsInternals) {
  for (const OutputConstraint& bad : {OutputConstraint{OutputConstraint::Kind::kRegex, "(ab", {}, true},
                                      OutputConstraint{OutputConstraint::Kind::kEbnf, "root ::= undefined_rule", {}, true},
                                      OutputConstraint{OutputConstraint::Kind::kEbnf, "start ::= \"a\"", {}, true},
                                      OutputConstraint{OutputConstraint::Kind::kChoice, "", {}, true}}) {
    try {
      compiler_->compile(bad);
      ADD_FAILURE() << "compiled: " << bad.text;
    } catch (const GrammarError& e) {
      const std::string message = e.what();
      EXPECT_FALSE(message.empty());
      EXPECT_EQ(message.find(".cc:"), std::string::npos) << message;
      EXPECT_EQ(message.find("Check failed"), std::string::npos) << message;
    }
  }
}

TEST_F(GrammarTest, CacheReturnsTheSameGrammarForTheSameConstraint) {
  const auto first = compiler_->compile(schema(kPersonSchema));
  EXPECT_EQ(compiler_->compile(schema(kPersonSchema)), first);
  OutputConstraint compact = schema(kPersonSchema);
  compact.any_whitespace = false;
  EXPECT_NE(compiler_->compile(compact), first);
  EXPECT_NE(compiler_->compile(schema(R"({"type": "string"})")), first);
  EXPECT_EQ(compiler_->vocab_size(), kPaddedVocab);
  EXPECT_EQ(compiler_->bitmask_words(), (kPaddedVocab + 31) / 32);
}

TEST(GrammarConfig, ValidateNamesTheField) {
  GrammarCompilerConfig config;
  config.vocab_size = 10;
  EXPECT_THROW(config.validate(), Error);  // no stop token
  config.stop_token_ids = {12};
  EXPECT_THROW(config.validate(), Error);
  config.stop_token_ids = {2};
  EXPECT_NO_THROW(config.validate());
  const auto tokenizer = byte_level_tokenizer();
  EXPECT_THROW(GrammarCompiler(*tokenizer, config), Error);  // below the tokenizer's vocabulary
}

TEST(GrammarSentencePiece, SchemaWalkOverByteFallbackVocabulary) {
  const auto tokenizer = spm_tokenizer();
  GrammarCompilerConfig config;
  config.stop_token_ids = {tokenizer->token_to_id("</s>")};
  config.vocab_size = static_cast<int32_t>(tokenizer->vocab_size());
  GrammarCompiler compiler(*tokenizer, config);
  GrammarMatcher matcher(compiler.compile(schema(kPersonSchema)));
  const std::string answer = "{\"name\": \"The server ünïcode\", \"age\": 42}";
  // SentencePiece prefixes the text with "▁" (space); the model's first piece of an answer has none.
  auto ids = tokenizer->encode(answer, false).ids;
  ASSERT_EQ(tokenizer->id_to_token(ids[0]), "\u2581{");
  ids[0] = tokenizer->token_to_id("{");
  ASSERT_GE(ids[0], 0);
  for (const int32_t id : ids) {
    ASSERT_TRUE(matcher.accept_token(id)) << tokenizer->id_to_token(id);
  }
  EXPECT_TRUE(matcher.accept_token(config.stop_token_ids[0]));
  EXPECT_TRUE(matcher.is_terminated());
}

TEST(GrammarSmolLM2, SchemaWalkOver49kVocabulary) {
  const auto tokenizer = smollm2_tokenizer();
  if (!tokenizer) GTEST_SKIP() << "SmolLM2 is not in the model dir (scripts/fetch-models)";
  GrammarCompilerConfig config;
  config.stop_token_ids = {tokenizer->token_to_id("<|im_end|>")};
  config.vocab_size = static_cast<int32_t>(tokenizer->vocab_size());
  GrammarCompiler compiler(*tokenizer, config);
  GrammarMatcher matcher(compiler.compile(schema(kPersonSchema)));
  std::vector<int32_t> row(compiler.bitmask_words());
  ASSERT_TRUE(matcher.fill_next_token_bitmask(row));
  EXPECT_FALSE(allowed(row, tokenizer->token_to_id("<|im_start|>")));
  for (const int32_t id : tokenizer->encode(R"({"name": "Ada Lovelace", "age": 36})", false).ids) {
    ASSERT_TRUE(allowed(row, id)) << tokenizer->id_to_token(id);
    ASSERT_TRUE(matcher.accept_token(id));
    matcher.fill_next_token_bitmask(row);
  }
  EXPECT_TRUE(matcher.accept_token(config.stop_token_ids[0]));
  EXPECT_TRUE(matcher.is_terminated());
}

}  // namespace
}  // namespace tessera
