// engine/grammar/vocabulary.cpp: vocabulary encoding detection and the strings handed to xgrammar.
#include "engine/grammar/vocabulary.h"

#include <algorithm>
#include <unordered_set>

#include "models/tokenizer/tokenizer.h"

namespace tessera::grammar_detail {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to U+0100...
std::vector<char32_t> byte_level_alphabet() {
  std::vector<char32_t> alphabet;
  char32_t next_shifted = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    alphabet.push_back(printable ? static_cast<char32_t>(b) : next_shifted++);
  }
  return alphabet;
}

std::string utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
  return out;
}

// Whether every character of `token` is in the alphabet (all of which lie below U+0144).
bool spelled_in(const std::string& token, const std::unordered_set<char32_t>& alphabet) {
  for (size_t i = 0; i < token.size();) {
    const auto lead = static_cast<unsigned char>(token[i]);
    char32_t c = lead;
    size_t length = 1;
    if (lead >= 0xc0 && lead < 0xe0 && i + 1 < token.size()) {
      c = ((lead & 0x1f) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3f);
      length = 2;
    } else if (lead >= 0x80) {
      return false;
    }
    if (!alphabet.contains(c)) return false;
    i += length;
  }
  return true;
}

constexpr std::string_view kMetaspace = "\xe2\x96\x81";  // "▁"

}  // namespace

VocabEncoding detect_vocab_encoding(const std::vector<std::string>& tokens) {
  const std::unordered_set<std::string> present(tokens.begin(), tokens.end());
  int byte_pieces = 0;
  for (int b = 0; b < 256; ++b) {
    static const char* kHex = "0123456789ABCDEF";
    byte_pieces += present.contains(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
  }
  if (byte_pieces >= 128) return VocabEncoding::kByteFallback;

  const std::vector<char32_t> alphabet = byte_level_alphabet();
  const std::unordered_set<char32_t> alphabet_set(alphabet.begin(), alphabet.end());
  int single_chars = 0;
  for (const char32_t c : alphabet) single_chars += present.contains(utf8(c));
  if (single_chars >= 128) {
    const auto spelled = std::count_if(tokens.begin(), tokens.end(),
                                       [&](const std::string& t) { return spelled_in(t, alphabet_set); });
    if (static_cast<double>(spelled) >= 0.99 * static_cast<double>(tokens.size())) {
      return VocabEncoding::kByteLevel;
    }
  }
  const auto metaspaced = std::count_if(tokens.begin(), tokens.end(),
                                        [](const std::string& t) { return t.starts_with(kMetaspace); });
  return metaspaced * 10 >= static_cast<long>(tokens.size()) ? VocabEncoding::kByteFallback
                                                             : VocabEncoding::kRaw;
}

Vocabulary::Vocabulary(const Tokenizer& tokenizer, const std::vector<int32_t>& stop_token_ids) {
  const auto size = static_cast<int32_t>(tokenizer.vocab_size());
  tokens_.reserve(size);
  for (int32_t id = 0; id < size; ++id) {
    tokens_.push_back(tokenizer.id_to_token(id));
    const bool stop = std::find(stop_token_ids.begin(), stop_token_ids.end(), id) != stop_token_ids.end();
    if (tokenizer.is_special(id) && !stop) special_ids_.push_back(id);
  }
  encoding_ = detect_vocab_encoding(tokens_);
}

std::vector<std::string> Vocabulary::encoded_vocab(const std::vector<int32_t>& markers) const {
  std::vector<std::string> encoded = tokens_;
  for (const int32_t id : special_ids_) {
    if (!std::binary_search(markers.begin(), markers.end(), id)) encoded[id].clear();
  }
  return encoded;
}

std::vector<int32_t> Vocabulary::special_tokens_in(std::string_view text) const {
  std::vector<int32_t> found;
  for (const int32_t id : special_ids_) {
    if (!tokens_[id].empty() && text.find(tokens_[id]) != std::string_view::npos) found.push_back(id);
  }
  return found;
}

}  // namespace tessera::grammar_detail
