// tests/unit/config/encoder_input_test.cpp: the one input-length rule of embedding models: the limit
// (sentence_bert_config.json's max_seq_length, else max_position_embeddings), truncation that keeps
// the closing [SEP] as HF tokenizers do, and the refusal message when truncation is off.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config/encoder_input.h"
#include "models/config/model_config.h"
#include "models/model_files.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/tokenizer.h"
#include "tests/unit/weights/test_files.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << ::testing::PrintToString(parts);
  } catch (const Error& e) {
    for (const std::string& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

// all-MiniLM-L6-v2's config.json, the model the limit was first wrong for (256 vs 512).
constexpr const char* kMiniLmConfig = R"({
  "architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
  "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
  "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
  "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522
})";

constexpr const char* kModules = R"([
  {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
  {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
  {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])";

// A model folder as sentence-transformers saves one; sentence_bert_config.json only when given.
class ModelFolder {
 public:
  explicit ModelFolder(const std::string& tag, bool with_modules = true) : dir_(tag) {
    test::write_text(dir_.path() / "config.json", kMiniLmConfig);
    if (with_modules) {
      test::write_text(dir_.path() / "modules.json", kModules);
      std::filesystem::create_directories(dir_.path() / "1_Pooling");
      test::write_text(dir_.path() / "1_Pooling" / "config.json", R"({"pooling_mode_mean_tokens": true})");
    }
  }
  void sentence_bert_config(const std::string& json, const std::string& subfolder = "") {
    std::filesystem::create_directories(dir_.path() / subfolder);
    test::write_text(dir_.path() / subfolder / "sentence_bert_config.json", json);
  }
  void modules(const std::string& json) { test::write_text(dir_.path() / "modules.json", json); }
  ModelConfig load() const { return load_model_config(locate_model(dir_.path().string())); }

 private:
  test::TempDir dir_;
};

TEST(EncoderInputLimit, MaxSeqLengthFromSentenceBertConfig) {
  ModelFolder folder("st-limit");
  folder.sentence_bert_config(R"({"max_seq_length": 256, "do_lower_case": false})");
  const ModelConfig c = folder.load();
  ASSERT_TRUE(c.max_seq_length.has_value());
  EXPECT_EQ(*c.max_seq_length, 256);
  const EncoderInputLimit limit = encoder_input_limit(c);
  EXPECT_EQ(limit.tokens, 256);
  EXPECT_EQ(limit.field, "max_seq_length");
}

TEST(EncoderInputLimit, MaxPositionEmbeddingsWithoutSentenceBertConfig) {
  ModelFolder folder("st-no-limit");
  const ModelConfig c = folder.load();
  EXPECT_FALSE(c.max_seq_length.has_value());
  const EncoderInputLimit limit = encoder_input_limit(c);
  EXPECT_EQ(limit.tokens, 512);
  EXPECT_EQ(limit.field, "max_position_embeddings");

  // An unset max_seq_length (sentence-transformers writes null) is the same as none.
  folder.sentence_bert_config(R"({"max_seq_length": null})");
  EXPECT_EQ(encoder_input_limit(folder.load()).tokens, 512);
}

TEST(EncoderInputLimit, ReadFromTheTransformerModuleFolderOrTheRoot) {
  // The Transformer module keeps its sentence_bert_config.json in its own folder.
  ModelFolder nested("st-nested");
  nested.modules(R"([{"path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
                     {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])");
  nested.sentence_bert_config(R"({"max_seq_length": 999})");  // the root's is not the module's
  nested.sentence_bert_config(R"({"max_seq_length": 128})", "0_Transformer");
  EXPECT_EQ(encoder_input_limit(nested.load()).tokens, 128);

  // A plain HF folder (no modules.json) with a sentence_bert_config.json beside config.json.
  ModelFolder plain("st-plain", /*with_modules=*/false);
  plain.sentence_bert_config(R"({"max_seq_length": 200})");
  EXPECT_EQ(encoder_input_limit(plain.load()), (EncoderInputLimit{200, "max_seq_length"}));
}

TEST(EncoderInputLimit, MaxSeqLengthIsCappedByThePositionTable) {
  ModelConfig c = model_config_from_hf(nlohmann::json::parse(kMiniLmConfig), "bert.json");
  c.max_seq_length = 4096;  // no position embedding past 512: the table is the real limit
  EXPECT_EQ(encoder_input_limit(c), (EncoderInputLimit{512, "max_position_embeddings"}));
  c.max_seq_length = 512;
  EXPECT_EQ(encoder_input_limit(c), (EncoderInputLimit{512, "max_seq_length"}));
}

TEST(EncoderInputLimit, BadMaxSeqLengthNamesTheFileAndField) {
  ModelFolder folder("st-bad");
  for (const char* bad : {R"({"max_seq_length": 0})", R"({"max_seq_length": "256"})", R"({"max_seq_length": 2.5})"}) {
    folder.sentence_bert_config(bad);
    expect_error([&] { folder.load(); }, {"sentence_bert_config.json", "max_seq_length", "positive integer"});
  }
  folder.sentence_bert_config("{");
  expect_error([&] { folder.load(); }, {"sentence_bert_config.json", "bad JSON"});
  ModelConfig c = model_config_from_hf(nlohmann::json::parse(kMiniLmConfig), "bert.json");
  c.max_seq_length = -3;
  expect_error([&] { c.validate(); }, {"bert.json", "max_seq_length = -3"});
}

TEST(TruncateTokens, KeepsTheClosingSpecialToken) {
  // [CLS]=101 t1..t6 [SEP]=102 cut to 5: [CLS] t1 t2 t3 [SEP].
  std::vector<int32_t> ids = {101, 1, 2, 3, 4, 5, 6, 102};
  truncate_tokens(ids, 5, /*keep_last=*/true);
  EXPECT_EQ(ids, (std::vector<int32_t>{101, 1, 2, 3, 102}));
  // Without a closing special token the ids are simply cut.
  ids = {1, 2, 3, 4, 5, 6};
  truncate_tokens(ids, 4, /*keep_last=*/false);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3, 4}));
  // No room for [SEP] after [CLS]: the first token only.
  ids = {101, 1, 102};
  truncate_tokens(ids, 1, /*keep_last=*/true);
  EXPECT_EQ(ids, (std::vector<int32_t>{101}));
}

TEST(TruncateTokens, InputsWithinTheLimitAreUnchanged) {
  const std::vector<int32_t> original = {101, 1, 2, 102};
  for (int64_t limit : {4, 5, 512, 0}) {  // 0: no limit
    std::vector<int32_t> ids = original;
    truncate_tokens(ids, limit, /*keep_last=*/true);
    EXPECT_EQ(ids, original) << "limit " << limit;
  }
}

// A real WordPiece tokenizer ([CLS] ... [SEP]): truncating its encoding equals encoding the text
// with only the words that fit, which is what HF's truncation=True, max_length=N produces.
class FitEncoderInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_text(dir_.path() / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\nc\nd\ne\nf\ng\nh\n");
    tokenizer_ = tok::load_wordpiece_vocab((dir_.path() / "vocab.txt").string(), /*lowercase=*/true);
  }
  std::vector<int32_t> encode(const std::string& text) const { return tokenizer_->encode(text, true).ids; }

  test::TempDir dir_{"wordpiece-fit"};
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(FitEncoderInputs, TruncatesLikeHfTokenizers) {
  std::vector<std::vector<int32_t>> inputs = {encode("a b c d e f g h"), encode("a b"), {5, 6, 7, 8, 9, 10}};
  ASSERT_EQ(inputs[0].size(), 10u);  // [CLS] a..h [SEP]
  const std::vector<int32_t> short_one = inputs[1];
  EXPECT_FALSE(fit_encoder_inputs(inputs, {6, "max_seq_length"}, /*truncate=*/true, *tokenizer_).has_value());
  EXPECT_EQ(inputs[0], encode("a b c d"));  // [CLS] a b c d [SEP]
  EXPECT_EQ(inputs[0].back(), tokenizer_->token_to_id("[SEP]"));
  EXPECT_EQ(inputs[1], short_one);
  // Token ids without a closing special token: a plain cut.
  EXPECT_EQ(inputs[2], (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  inputs[2].push_back(11);
  fit_encoder_inputs(inputs, {6, "max_seq_length"}, true, *tokenizer_);
  EXPECT_EQ(inputs[2], (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
}

TEST_F(FitEncoderInputs, WithoutTruncationTheFirstInputOverTheLimitIsNamed) {
  std::vector<std::vector<int32_t>> inputs = {encode("a"), encode("a b c"), encode("a b c d e f g h")};
  const auto before = inputs;
  const std::optional<EncoderInputOverLimit> over =
      fit_encoder_inputs(inputs, {4, "max_seq_length"}, /*truncate=*/false, *tokenizer_);
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->index, 1u);
  EXPECT_EQ(over->tokens, 5);
  EXPECT_EQ(over->message("set truncate to true or shorten it"),
            "input[1] has 5 tokens, over this model's limit of 4 (max_seq_length); set truncate to true or shorten it");
  EXPECT_EQ(inputs, before);  // nothing is cut when the request is refused
  EXPECT_FALSE(fit_encoder_inputs(inputs, {10, "max_position_embeddings"}, false, *tokenizer_).has_value());
}

}  // namespace
}  // namespace tessera
