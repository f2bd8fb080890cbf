// models/tokenizer/unicode_text.h: UTF-8 and Unicode helpers the tokenizers share (code points,
// categories and normalization via utf8proc, GPT-2's byte <-> unicode map, lossy UTF-8 repair).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::unicode {

// Decodes one code point at `pos` and advances it; an invalid sequence yields U+FFFD and advances
// past its maximal invalid prefix (at least one byte).
char32_t next_code_point(std::string_view text, size_t& pos);
std::vector<char32_t> to_code_points(std::string_view text);
void append_utf8(std::string& out, char32_t cp);
std::string to_utf8(char32_t cp);
size_t utf8_length(std::string_view text);  // code points

// Repairs invalid UTF-8 as Rust's String::from_utf8_lossy does: each maximal invalid subpart
// becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
bool ends_with_replacement(std::string_view text);

// Categories (Unicode general category, via utf8proc).
bool is_letter(char32_t cp);           // L*
bool is_numeric(char32_t cp);          // Nd, Nl, No (Rust char::is_numeric)
bool is_punctuation(char32_t cp);      // P*
bool is_mark_nonspacing(char32_t cp);  // Mn
bool is_white_space(char32_t cp);      // the Unicode White_Space property (Rust char::is_whitespace)
bool is_control_format_private(char32_t cp);  // Cc, Cf, Co (and Cs)
bool is_cjk_ideograph(char32_t cp);    // the CJK blocks BERT pads with spaces

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
std::string normalize(std::string_view text, NormalForm form);
// Full lowercase mapping per code point (U+0130 becomes "i\u0307", as Rust's char::to_lowercase).
std::string to_lower(std::string_view text);

// GPT-2's reversible map from bytes to printable code points (ByteLevel pre-tokenizer/decoder).
char32_t byte_to_unicode(uint8_t byte);
// -1 when `cp` is not the image of a byte.
int unicode_to_byte(char32_t cp);
std::string bytes_to_byte_level(std::string_view bytes);

// PCRE2 patterns are run with UTF + UCP; these give `\s` / `\S` the exact Unicode White_Space
// meaning (PCRE2's UCP `\s` also matches U+180E, which Oniguruma and Rust do not).
std::string rewrite_regex_for_pcre2(std::string_view pattern);

}  // namespace tessera::unicode
