// models/tokenizer/unicode_text.cpp: UTF-8 and Unicode helpers (see unicode_text.h).
#include "models/tokenizer/unicode_text.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "common/error.h"

namespace tessera::unicode {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

bool in_range(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

// Length of the valid sequence at `pos` (1..4), or 0 with `bad_len` set to the maximal invalid
// subpart's length.
size_t valid_sequence_length(std::string_view s, size_t pos, size_t& bad_len) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = at(pos);
  bad_len = 1;
  if (b0 < 0x80) return 1;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (in_range(b0, 0xC2, 0xDF)) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if (in_range(b0, 0xE1, 0xEC) || in_range(b0, 0xEE, 0xEF)) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (in_range(b0, 0xF1, 0xF3)) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    const uint8_t lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
    if (pos + k >= s.size() || !in_range(at(pos + k), lo_k, hi_k)) {
      bad_len = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

char32_t next_code_point(std::string_view text, size_t& pos) {
  size_t bad_len = 0;
  const size_t n = valid_sequence_length(text, pos, bad_len);
  if (n == 0) {
    pos += bad_len;
    return kReplacement;
  }
  const auto at = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  char32_t cp = 0;
  switch (n) {
    case 1: cp = at(0); break;
    case 2: cp = ((at(0) & 0x1Fu) << 6) | (at(1) & 0x3Fu); break;
    case 3: cp = ((at(0) & 0x0Fu) << 12) | ((at(1) & 0x3Fu) << 6) | (at(2) & 0x3Fu); break;
    default:
      cp = ((at(0) & 0x07u) << 18) | ((at(1) & 0x3Fu) << 12) | ((at(2) & 0x3Fu) << 6) | (at(3) & 0x3Fu);
  }
  pos += n;
  return cp;
}

std::vector<char32_t> to_code_points(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) out.push_back(next_code_point(text, pos));
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_utf8(char32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

size_t utf8_length(std::string_view text) {
  size_t n = 0;
  for (size_t pos = 0; pos < text.size(); ++n) next_code_point(text, pos);
  return n;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    size_t bad_len = 0;
    const size_t n = valid_sequence_length(bytes, pos, bad_len);
    if (n == 0) {
      append_utf8(out, kReplacement);
      pos += bad_len;
    } else {
      out.append(bytes.substr(pos, n));
      pos += n;
    }
  }
  return out;
}

bool ends_with_replacement(std::string_view text) { return text.ends_with("\xEF\xBF\xBD"); }

static utf8proc_category_t category(char32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

bool is_letter(char32_t cp) {
  const auto c = category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

bool is_numeric(char32_t cp) {
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t cp) {
  const auto c = category(cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

bool is_mark_nonspacing(char32_t cp) { return category(cp) == UTF8PROC_CATEGORY_MN; }

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_control_format_private(char32_t cp) {
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CO ||
         c == UTF8PROC_CATEGORY_CS;
}

bool is_cjk_ideograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

std::string normalize(std::string_view text, NormalForm form) {
  if (text.empty()) return {};
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  // utf8proc rejects invalid UTF-8; tokenizer input is repaired first so this cannot fail on it.
  const std::string valid = utf8_lossy(text);
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()),
                   static_cast<utf8proc_ssize_t>(valid.size()), &result,
                   static_cast<utf8proc_option_t>(options));
  TESSERA_CHECK(n >= 0, "unicode normalization failed: " << utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(result, &std::free);
  return std::string(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
}

std::string to_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const char32_t cp = next_code_point(text, pos);
    if (cp == 0x130) {  // the one code point whose full lowercase mapping is two code points
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

namespace {
struct ByteLevelTables {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};  // images are all below 0x144
  ByteLevelTables() {
    cp_to_byte.fill(-1);
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : next_extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}
}  // namespace

char32_t byte_to_unicode(uint8_t byte) { return byte_level_tables().byte_to_cp[byte]; }

int unicode_to_byte(char32_t cp) {
  const auto& t = byte_level_tables();
  return cp < t.cp_to_byte.size() ? t.cp_to_byte[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) append_utf8(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

std::string rewrite_regex_for_pcre2(std::string_view pattern) {
  static constexpr std::string_view kWhiteSpace =
      "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace tessera::unicode
