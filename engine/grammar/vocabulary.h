// engine/grammar/vocabulary.h: a tokenizer's vocabulary as the grammar engine reads it: how its
// strings encode bytes, and the string each token matches (none for control tokens).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {
class Tokenizer;
}

namespace tessera::grammar_detail {

// How vocabulary strings spell bytes: as-is, SentencePiece's "▁" for space and <0xNN> byte pieces,
// or GPT-2's byte-to-unicode alphabet ("Ġ" for space).
enum class VocabEncoding { kRaw, kByteFallback, kByteLevel };

// Decided from the strings themselves, as xgrammar does for HF tokenizers whose serialized form
// misdescribes them: >= 128 byte pieces is byte fallback; most of GPT-2's alphabet as
// single-character tokens and 99% of tokens spelled in it is byte level; a vocabulary whose words
// start with "▁" (SentencePiece without byte fallback) reads "▁" as space like byte fallback does.
VocabEncoding detect_vocab_encoding(const std::vector<std::string>& tokens);

class Vocabulary {
 public:
  Vocabulary(const Tokenizer& tokenizer, const std::vector<int32_t>& stop_token_ids);

  VocabEncoding encoding() const { return encoding_; }
  // The strings the engine matches, by id. A special (control) token that is not a stop token gets
  // "", which xgrammar never allows: its text is not what the user would see (decode skips it), so
  // the grammar must not take it for the characters it is spelled with. Special tokens in `markers`
  // keep their text, so a structural tag can match a template's marker (Mistral's [TOOL_CALLS]).
  std::vector<std::string> encoded_vocab(const std::vector<int32_t>& markers) const;
  // The special, non-stop tokens whose text occurs in `text`, ascending.
  std::vector<int32_t> special_tokens_in(std::string_view text) const;

 private:
  std::vector<std::string> tokens_;
  std::vector<int32_t> special_ids_;  // special and not a stop token
  VocabEncoding encoding_;
};

}  // namespace tessera::grammar_detail
