// tests/unit/tokenizer/incremental_decoder_test.cpp: streaming detokenization never emits half a
// UTF-8 character, and the streamed pieces add up to the full decode (byte-level BPE and SPM).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "models/model_files.h"

#include "models/tokenizer/builders.h"
#include "models/tokenizer/tokenizer.h"
#include "models/tokenizer/unicode_text.h"
#include "tests/unit/tokenizer/corpus_strings.h"
#include "tests/unit/tokenizer/test_vocab.h"

namespace tessera::tok {
namespace {

// Streams `ids` and checks every emitted piece is valid UTF-8; returns the pieces.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special = false) {
  IncrementalDecoder decoder(tok, skip_special);
  std::vector<std::string> pieces;
  for (const int32_t id : ids) {
    pieces.push_back(decoder.push(id));
    EXPECT_EQ(unicode::utf8_lossy(pieces.back()), pieces.back());
    EXPECT_FALSE(unicode::ends_with_replacement(pieces.back()));
  }
  pieces.push_back(decoder.finish());
  return pieces;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p;
  return s;
}

TEST(IncrementalDecoder, EmojiSplitAcrossByteTokensComesOutWhole) {
  const auto tok = tokenizer_from_gguf(testing::byte_level_vocab());
  const Encoding e = tok->encode("🤗", false);
  ASSERT_EQ(e.ids.size(), 4u);  // one byte token per UTF-8 byte in this vocabulary
  const auto pieces = stream(*tok, e.ids);
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "", "🤗", ""}));
}

TEST(IncrementalDecoder, CjkAndAccentsStreamCharacterByCharacter) {
  const auto tok = tokenizer_from_gguf(testing::byte_level_vocab());
  const auto pieces = stream(*tok, tok->encode("你好é", false).ids);
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "你", "", "", "好", "", "é", ""}));
}

TEST(IncrementalDecoder, StreamEqualsFullDecodeOnTheCorpus) {
  const auto tok = tokenizer_from_gguf(testing::byte_level_vocab("smollm"));
  for (const std::string& text : testing::corpus_strings()) {
    const Encoding e = tok->encode(text, false);
    EXPECT_EQ(joined(stream(*tok, e.ids)), text);
  }
}

TEST(IncrementalDecoder, SkipSpecialDropsControlTokens) {
  const auto tok = tokenizer_from_gguf(testing::byte_level_vocab());
  const Encoding e = tok->encode("<|im_start|>hello<|im_end|>", false);
  EXPECT_EQ(joined(stream(*tok, e.ids, true)), "hello");
  EXPECT_EQ(joined(stream(*tok, e.ids, false)), "<|im_start|>hello<|im_end|>");
}

TEST(IncrementalDecoder, DanglingBytesBecomeReplacementAtFinish) {
  const auto tok = tokenizer_from_gguf(testing::byte_level_vocab());
  const Encoding e = tok->encode("a🤗", false);
  IncrementalDecoder decoder(*tok, false);
  EXPECT_EQ(decoder.push(e.ids[0]), "a");
  EXPECT_EQ(decoder.push(e.ids[1]), "");
  EXPECT_EQ(decoder.push(e.ids[2]), "");
  EXPECT_EQ(decoder.finish(), "\xEF\xBF\xBD");
}

TEST(IncrementalDecoder, SentencePieceLeadingSpacesComeFromContext) {
  GgufTokenizerData d;
  d.model = "llama";
  const std::string sp = "\xE2\x96\x81";
  d.tokens = {"<unk>", "<s>", "</s>", sp + "Hello", sp + "world", "!", "<0xF0>", "<0x9F>", "<0xA4>", "<0x97>"};
  d.scores = std::vector<float>(d.tokens.size(), 0.0f);
  d.token_types = {2, 3, 3, 1, 1, 1, 6, 6, 6, 6};
  d.bos_id = 1;
  d.unk_id = 0;
  const auto tok = tokenizer_from_gguf(d);
  // <s> ▁Hello ▁world ! and 🤗 as four byte pieces (the vocabulary is too small to encode it).
  const std::vector<int32_t> ids = {1, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(tok->decode(ids, true), "Hello world!🤗");
  EXPECT_EQ(stream(*tok, ids, true), (std::vector<std::string>{"", "Hello", " world", "!", "", "", "", "🤗", ""}));
}

// The real vocabularies, when fetched: streaming gives exactly the full decode, in valid UTF-8
// pieces, for byte-level BPE (SmolLM2) and WordPiece with "##" continuations (MiniLM).
TEST(IncrementalDecoder, RealVocabulariesStreamLikeTheirFullDecode) {
  size_t models = 0;
  for (const char* name : {"smollm2-135m-instruct", "all-minilm-l6-v2"}) {
    const std::filesystem::path dir = std::filesystem::path(default_model_dir()) / name;
    if (!std::filesystem::exists(dir)) continue;
    ++models;
    const auto tok = load_tokenizer(locate_model(dir.string()));
    for (const std::string& text : testing::corpus_strings()) {
      const Encoding e = tok->encode(text, true);
      EXPECT_EQ(joined(stream(*tok, e.ids)), tok->decode(e.ids, false)) << name << ": " << text;
      EXPECT_EQ(joined(stream(*tok, e.ids, true)), tok->decode(e.ids, true)) << name << ": " << text;
    }
  }
  if (models == 0) GTEST_SKIP() << "no model fetched in " << default_model_dir();
}

}  // namespace
}  // namespace tessera::tok
