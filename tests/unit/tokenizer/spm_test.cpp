// tests/unit/tokenizer/spm_test.cpp: SentencePiece. The GGUF "llama" score-based merge on a small
// hand-made vocabulary and, on the tiny trained fixture model, against libsentencepiece itself;
// plus the libsentencepiece-backed tokenizer.model loader.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include "common/error.h"
#include "models/tokenizer/builders.h"
#include "tests/unit/tokenizer/corpus_strings.h"

namespace tessera::tok {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // ▁
const std::string kFixture = std::string(TESSERA_TOKENIZER_FIXTURES) + "/spm_tiny/tokenizer.model";

GgufTokenizerData small_llama_vocab() {
  GgufTokenizerData d;
  d.model = "llama";
  const auto add = [&](const std::string& piece, float score, int type) {
    d.tokens.push_back(piece);
    d.scores.push_back(score);
    d.token_types.push_back(type);
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    add(name, 0, 6);
  }
  // Higher score merges first.
  add(kSpace, -1, 1);
  add("h", -2, 1);
  add("e", -2, 1);
  add("l", -2, 1);
  add("o", -2, 1);
  add("ll", -3, 1);
  add(kSpace + "h", -4, 1);
  add(kSpace + "he", -5, 1);
  add("llo", -6, 1);
  add(kSpace + "hello", -7, 1);
  add("he", -8, 1);  // scores lower than ▁h + e: never used for "▁hello"
  d.bos_id = 1;
  d.eos_id = 2;
  d.unk_id = 0;
  return d;
}

TEST(SpmGguf, HighestScoreMergesFirstWithByteFallback) {
  const auto tok = tokenizer_from_gguf(small_llama_vocab());
  EXPECT_EQ(tok->encode("hello", false).tokens, (std::vector<std::string>{kSpace + "hello"}));
  const Encoding e = tok->encode("hello hé", true);
  EXPECT_EQ(e.tokens, (std::vector<std::string>{"<s>", kSpace + "hello", kSpace + "h", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(tok->decode(e.ids, true), "hello hé");
  EXPECT_EQ(tok->decode(e.ids, false), "<s> hello hé");
  EXPECT_TRUE(tok->lossless());
  EXPECT_TRUE(tok->is_special(1));
  // Control tokens written in the text are split out, and the next segment gets its "▁" again.
  EXPECT_EQ(tok->encode("</s>hello", false).tokens, (std::vector<std::string>{"</s>", kSpace + "hello"}));
}

TEST(SpmGguf, AddSpacePrefixOff) {
  auto data = small_llama_vocab();
  data.add_space_prefix = false;
  const auto tok = tokenizer_from_gguf(data);
  EXPECT_EQ(tok->encode("hello", false).tokens, (std::vector<std::string>{"he", "llo"}));
  EXPECT_EQ(tok->decode(tok->encode(" hello", false).ids, false), " hello");
}

// The trained fixture's pieces as GGUF "llama" metadata, the way llama.cpp's converter writes them.
GgufTokenizerData gguf_from_model(const sentencepiece::SentencePieceProcessor& sp) {
  GgufTokenizerData d;
  d.model = "llama";
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    d.tokens.push_back(sp.IdToPiece(id));
    d.scores.push_back(sp.GetScore(id));
    int type = 1;
    if (sp.IsUnknown(id)) type = 2;
    else if (sp.IsControl(id)) type = 3;
    else if (sp.IsUnused(id)) type = 5;
    else if (sp.IsByte(id)) type = 6;
    d.token_types.push_back(type);
  }
  d.bos_id = sp.bos_id();
  d.eos_id = sp.eos_id();
  d.unk_id = sp.unk_id();
  return d;
}

TEST(SpmGguf, ScoreMergeMatchesLibSentencePieceOnTheFixture) {
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(kFixture).ok()) << kFixture;
  const auto tok = tokenizer_from_gguf(gguf_from_model(sp));
  size_t compared = 0;
  for (const std::string& text : testing::corpus_strings()) {
    if (text.find("<s>") != std::string::npos || text.find("</s>") != std::string::npos) continue;
    std::vector<int> expected;
    ASSERT_TRUE(sp.Encode(text, &expected).ok());
    const Encoding got = tok->encode(text, false);
    ASSERT_EQ(got.ids, std::vector<int32_t>(expected.begin(), expected.end())) << "text: " << text;
    std::string decoded;
    ASSERT_TRUE(sp.Decode(expected, &decoded).ok());
    ASSERT_EQ(tok->decode(got.ids, false), decoded) << "text: " << text;
    ++compared;
  }
  EXPECT_GE(compared, 40u);
}

TEST(SentencePieceModel, LoadsEncodesAndDecodes) {
  const auto tok = load_sentencepiece_model(kFixture, true, false);
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(kFixture).ok());
  const std::string text = "Hello world 123 你好 🤗";
  std::vector<int> expected;
  ASSERT_TRUE(sp.Encode(text, &expected).ok());
  expected.insert(expected.begin(), sp.bos_id());
  const Encoding e = tok->encode(text, true);
  EXPECT_EQ(e.ids, std::vector<int32_t>(expected.begin(), expected.end()));
  EXPECT_EQ(e.tokens.front(), "<s>");
  EXPECT_EQ(tok->decode(e.ids, true), text);
  EXPECT_TRUE(tok->lossless());
  EXPECT_TRUE(tok->is_special(sp.bos_id()));
  // "<s>" in the text is the BOS token, as HF splits special tokens out first.
  const Encoding with_control = tok->encode("<s>Hello", false);
  EXPECT_EQ(with_control.ids.front(), sp.bos_id());
  EXPECT_EQ(tok->token_to_id("<s>"), sp.bos_id());
  EXPECT_EQ(tok->token_to_id("no such piece"), -1);
}

TEST(SentencePieceModel, BadFileIsAnError) {
  EXPECT_THROW(load_sentencepiece_model("/nonexistent/tokenizer.model", true, false), Error);
}

}  // namespace
}  // namespace tessera::tok
