// tests/unit/tokenizer/wordpiece_test.cpp: BertNormalizer, BertPreTokenizer, WordPiece greedy
// longest match, [CLS]/[SEP] and the WordPiece decoder, on a small vocabulary.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/components.h"

namespace tessera::tok {
namespace {

const std::vector<std::string> kVocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able",
                                         "hello", "world", "!", ".", "##s", "cafe", "你", "好", "'", "t", "don",
                                         "a", "##a"};

class WordPieceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / ("tessera_vocab_" + std::to_string(::getpid()) + ".txt");
    std::ofstream out(path_);
    for (const auto& t : kVocab) out << t << "\n";
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::unique_ptr<Tokenizer> load(bool lowercase = true) { return load_wordpiece_vocab(path_.string(), lowercase); }
  std::filesystem::path path_;
};

TEST_F(WordPieceTest, GreedyLongestMatchWithContinuationPrefix) {
  const auto tok = load();
  EXPECT_EQ(tok->encode("unaffable hellos", false).tokens,
            (std::vector<std::string>{"un", "##aff", "##able", "hello", "##s"}));
  // A word with any unmatched remainder becomes a single [UNK].
  EXPECT_EQ(tok->encode("unaffablex world", false).tokens, (std::vector<std::string>{"[UNK]", "world"}));
}

TEST_F(WordPieceTest, LongWordsAreUnknown) {
  const auto tok = load();
  EXPECT_EQ(tok->encode(std::string(100, 'a'), false).ids.size(), 100u);  // a ##a ##a ...
  EXPECT_EQ(tok->encode(std::string(101, 'a'), false).tokens, (std::vector<std::string>{"[UNK]"}));
}

TEST_F(WordPieceTest, NormalizerLowercasesStripsAccentsAndPadsCjk) {
  const auto tok = load();
  EXPECT_EQ(tok->encode("HELLO Café\t\x07world\xEF\xBF\xBD!你好", false).tokens,
            (std::vector<std::string>{"hello", "cafe", "world", "!", "你", "好"}));
  const auto cased = load(false);
  EXPECT_EQ(cased->encode("Hello", false).tokens, (std::vector<std::string>{"[UNK]"}));
}

TEST_F(WordPieceTest, SpecialTokensInTextAndTemplate) {
  const auto tok = load();
  const Encoding e = tok->encode("hello [MASK] world", true);
  EXPECT_EQ(e.tokens, (std::vector<std::string>{"[CLS]", "hello", "[MASK]", "world", "[SEP]"}));
  // Special tokens are matched before lowercasing, so lowercase text is not special.
  EXPECT_EQ(tok->encode("[mask]", false).tokens, (std::vector<std::string>{"[UNK]", "[UNK]", "[UNK]"}));
}

TEST_F(WordPieceTest, DecodeJoinsContinuationsAndCleansUp) {
  const auto tok = load();
  const Encoding e = tok->encode("unaffable hello world . don ' t !", true);
  EXPECT_EQ(tok->decode(e.ids, true), "unaffable hello world. don ' t!");
  EXPECT_EQ(tok->decode(e.ids, false), "[CLS] unaffable hello world. don ' t! [SEP]");
}

TEST(WordPiece, MissingUnkTokenIsAnError) {
  Vocabulary v;
  v.add("a", 0);
  EXPECT_THROW(make_wordpiece_model(std::move(v), WordPieceOptions{}), Error);
}

}  // namespace
}  // namespace tessera::tok
