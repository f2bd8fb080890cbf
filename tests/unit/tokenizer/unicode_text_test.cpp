// tests/unit/tokenizer/unicode_text_test.cpp: UTF-8 repair, the byte-level map, normalization and
// the pre-tokenizer regexes.
#include <gtest/gtest.h>

#include "common/error.h"
#include "models/tokenizer/components.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera::tok {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, LossyReplacesEachMaximalInvalidSubpart) {
  EXPECT_EQ(unicode::utf8_lossy("ok \xF0\x9F\xA4\x97"), "ok \xF0\x9F\xA4\x97");
  EXPECT_EQ(unicode::utf8_lossy("\xF0\x9F\xA4"), kFFFD);                 // truncated emoji: one
  EXPECT_EQ(unicode::utf8_lossy("\xC0\x80"), kFFFD + kFFFD);             // overlong: two
  EXPECT_EQ(unicode::utf8_lossy("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);  // surrogate: three
  EXPECT_EQ(unicode::utf8_lossy("a\xE4\xBD" "b"), "a" + kFFFD + "b");
  EXPECT_TRUE(unicode::ends_with_replacement(unicode::utf8_lossy("x\xE4")));
}

TEST(Utf8, CodePointsRoundTrip) {
  const std::string text = "aé你🤗";
  const auto cps = unicode::to_code_points(text);
  ASSERT_EQ(cps.size(), 4u);
  EXPECT_EQ(cps[3], 0x1F917u);
  std::string back;
  for (const char32_t cp : cps) unicode::append_utf8(back, cp);
  EXPECT_EQ(back, text);
  EXPECT_EQ(unicode::utf8_length(text), 4u);
}

TEST(ByteLevel, MapIsGpt2sAndReversible) {
  EXPECT_EQ(unicode::byte_to_unicode(' '), 0x120u);   // Ġ
  EXPECT_EQ(unicode::byte_to_unicode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(unicode::byte_to_unicode('A'), static_cast<char32_t>('A'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode::unicode_to_byte(unicode::byte_to_unicode(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(unicode::unicode_to_byte(0x4F60), -1);
  EXPECT_EQ(unicode::bytes_to_byte_level(" é"), "Ġ\xC3\x83\xC2\xA9");  // "ĠÃ©"
}

TEST(Unicode, NormalizationAndCase) {
  EXPECT_EQ(unicode::normalize("\xC3\xA9", unicode::NormalForm::kNFD), "e\xCC\x81");
  EXPECT_EQ(unicode::normalize("e\xCC\x81", unicode::NormalForm::kNFC), "\xC3\xA9");
  EXPECT_EQ(unicode::normalize("\xEF\xAC\x81", unicode::NormalForm::kNFKC), "fi");
  EXPECT_EQ(unicode::to_lower("ÀB\xC4\xB0"), "àbi\xCC\x87");  // İ lowercases to i + U+0307
  EXPECT_TRUE(unicode::is_white_space(0x3000));
  EXPECT_FALSE(unicode::is_white_space(0x180E));
  EXPECT_TRUE(unicode::is_numeric(0x00B2));  // ²
  EXPECT_TRUE(unicode::is_cjk_ideograph(0x4F60));
}

std::vector<std::string> split_with(const PreTokenizer& p, std::string text) {
  std::vector<std::string> pieces{std::move(text)};
  p.split(pieces);
  return pieces;
}

TEST(PreTokenizer, Gpt2RegexKeepsTheLastSpaceForTheNextWord) {
  const auto regex = make_regex_split(kGpt2Pattern, SplitBehavior::kIsolated, false);
  EXPECT_EQ(split_with(*regex, "Hello  world\n\n it's 42!"),
            (std::vector<std::string>{"Hello", " ", " world", "\n\n", " it", "'s", " 42", "!"}));
  // U+00A0 is whitespace for \s; U+3000 too.
  EXPECT_EQ(split_with(*regex, "a\xC2\xA0" "b"), (std::vector<std::string>{"a", "\xC2\xA0", "b"}));
}

TEST(PreTokenizer, DigitsSplitEachNumericCharacter) {
  EXPECT_EQ(split_with(*make_digits_split(true), "ab123²c"),
            (std::vector<std::string>{"ab", "1", "2", "3", "²", "c"}));
  EXPECT_EQ(split_with(*make_digits_split(false), "ab123c"), (std::vector<std::string>{"ab", "123", "c"}));
}

TEST(PreTokenizer, SplitBehaviours) {
  const auto pieces = [](SplitBehavior b, bool invert = false) {
    return split_with(*make_literal_split("-", b, invert), "a-b--c");
  };
  EXPECT_EQ(pieces(SplitBehavior::kRemoved), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kIsolated), (std::vector<std::string>{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithPrevious), (std::vector<std::string>{"a-", "b-", "-", "c"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithNext), (std::vector<std::string>{"a", "-b", "-", "-c"}));
  EXPECT_EQ(pieces(SplitBehavior::kContiguous), (std::vector<std::string>{"a", "-", "b", "--", "c"}));
  EXPECT_THROW(split_behavior_from_name("Sideways"), Error);
}

TEST(PreTokenizer, BertSplitsWhitespaceAndPunctuation) {
  EXPECT_EQ(split_with(*make_bert_pre_tokenizer(), " Hi,  there!¿ok§"),
            (std::vector<std::string>{"Hi", ",", "there", "!", "¿", "ok", "§"}));
}

TEST(PreTokenizer, BadRegexIsReportedWithThePattern) {
  try {
    make_regex_split("(unclosed", SplitBehavior::kIsolated, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(unclosed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::tok
