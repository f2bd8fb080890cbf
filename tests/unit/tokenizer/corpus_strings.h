// tests/unit/tokenizer/corpus_strings.h: varied strings for the C++ tokenizer tests (the Python
// parity tests use corpus.py's 2,000).
#pragma once

#include <string>
#include <vector>

namespace tessera::tok::testing {

inline const std::vector<std::string>& corpus_strings() {
  static const std::vector<std::string> strings = {
      "Hello world!",
      "The quick brown fox jumps over the lazy dog.",
      "I'm sure they'll say it's fine, we've seen worse.",
      "",
      " ",
      "   leading and trailing   ",
      "a  b   c    d",
      "tab\tseparated\tvalues",
      "line one\nline two\n\nline four\n",
      "windows\r\nline endings",
      "1234567890 and 3.14159 and 1,000,000",
      "x² + y³ = z½",
      "café résumé naïve façade",
      "e\xCC\x81 decomposed",
      "Ελληνικά: Καλημέρα κόσμε",
      "Русский текст: Привет, мир!",
      "עברית: שלום עולם",
      "العربية: مرحبا بالعالم",
      "हिन्दी: नमस्ते दुनिया",
      "中文：你好，世界！",
      "日本語：こんにちは世界。",
      "한국어: 안녕하세요",
      "emoji 😀😃😄😁 and 🎉",
      "family 👨‍👩‍👧‍👦 zwj",
      "flags 🇺🇸🇫🇷🇯🇵",
      "skin tones 👍🏻👍🏿",
      "🤗 hugging face 🥰🫠",
      "math ∑∫∂√∞ ≤ ≥ ≠",
      "quotes “double” ‘single’ «guillemets»",
      "zero\u200bwidth\u200djoiner",
      "nbsp\u00a0and\u3000ideographic",
      "def f(x):\n    return x ** 2  # square\n",
      "for (int i = 0; i < n; ++i) { sum += a[i]; }",
      "{\"key\": \"value\", \"list\": [1, 2, 3]}",
      "https://example.com/path?query=1&other=two#fragment",
      "user@example.com",
      "supercalifragilisticexpialidocious",
      "Mr. Smith's 3rd car (a '99 model) cost $4,500.",
      "don't do not won't will not",
      "\xF0\x9D\x94\x98\xF0\x9D\x94\xAB\xF0\x9D\x94\xA6 math letters",
      "Ｆｕｌｌｗｉｄｔｈ ＡＳＣＩＩ",
      "private use \ue000 and astral \U00020000",
      "<|im_start|>user\nHi!<|im_end|>",
      "[CLS] a sentence [SEP]",
      "mixed \t \n \r\n whitespace",
  };
  return strings;
}

}  // namespace tessera::tok::testing
