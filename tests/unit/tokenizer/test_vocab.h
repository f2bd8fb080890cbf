// tests/unit/tokenizer/test_vocab.h: small vocabularies the tokenizer tests build by hand.
#pragma once

#include <string>
#include <vector>

#include "models/tokenizer/builders.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera::tok::testing {

// A byte-level BPE vocabulary in GGUF form: 3 control tokens, the 256 byte symbols, then merged
// tokens for " the", "hello", " world", "12". Ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2,
// byte b -> 3 + b, merges after that in order.
inline GgufTokenizerData byte_level_vocab(const std::string& pre = "gpt2") {
  GgufTokenizerData d;
  d.model = "gpt2";
  d.pre = pre;
  d.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  d.token_types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(unicode::to_utf8(unicode::byte_to_unicode(static_cast<uint8_t>(b))));
    d.token_types.push_back(1);
  }
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"},
      {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}, {"1", "2"}};
  for (const auto& [left, right] : merges) {
    d.merges.push_back(left + " " + right);
    d.tokens.push_back(left + right);
    d.token_types.push_back(1);
  }
  d.tokens.push_back("<tool>");  // a USER_DEFINED added token: matched in text, but not special
  d.token_types.push_back(4);
  d.bos_id = 0;
  d.eos_id = 0;
  return d;
}

}  // namespace tessera::tok::testing
