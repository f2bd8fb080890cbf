// models/tokenizer/normalizers.cpp: HF normalizers (BertNormalizer, NFC/NFD/NFKC/NFKD, Lowercase,
// Prepend, Replace, Strip, Sequence).
#include <string>

#include "common/error.h"
#include "models/tokenizer/components.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera::tok {
namespace {

using unicode::append_utf8;
using unicode::next_code_point;

class BertNormalizer final : public Normalizer {
 public:
  explicit BertNormalizer(const BertNormalizerOptions& o) : o_(o) {}

  std::string normalize(std::string text) const override {
    if (o_.clean_text || o_.handle_chinese_chars) {
      std::string out;
      out.reserve(text.size() + text.size() / 4);
      for (size_t pos = 0; pos < text.size();) {
        const char32_t cp = next_code_point(text, pos);
        if (o_.clean_text) {
          // BERT's clean-up: drop NUL, U+FFFD and control/format characters (tab, LF and CR are
          // whitespace, not controls), map any whitespace to a plain space.
          // Controls are tested first: U+000B, U+000C and U+0085 are dropped, not turned into spaces.
          if (cp == 0 || cp == 0xFFFD) continue;
          const bool tab_or_newline = cp == '\t' || cp == '\n' || cp == '\r';
          if (!tab_or_newline && unicode::is_control_format_private(cp)) continue;
          if (tab_or_newline || unicode::is_white_space(cp)) {
            out.push_back(' ');
            continue;
          }
        }
        if (o_.handle_chinese_chars && unicode::is_cjk_ideograph(cp)) {
          out.push_back(' ');
          append_utf8(out, cp);
          out.push_back(' ');
          continue;
        }
        append_utf8(out, cp);
      }
      text = std::move(out);
    }
    if (o_.strip_accents) {
      const std::string decomposed = unicode::normalize(text, unicode::NormalForm::kNFD);
      std::string out;
      out.reserve(decomposed.size());
      for (size_t pos = 0; pos < decomposed.size();) {
        const char32_t cp = next_code_point(decomposed, pos);
        if (!unicode::is_mark_nonspacing(cp)) append_utf8(out, cp);
      }
      text = std::move(out);
    }
    if (o_.lowercase) text = unicode::to_lower(text);
    return text;
  }

 private:
  BertNormalizerOptions o_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  std::string normalize(std::string text) const override { return unicode::normalize(text, form_); }

 private:
  unicode::NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return unicode::to_lower(text); }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {
    TESSERA_CHECK(!pattern_.empty(), "Replace normalizer: the pattern is empty");
  }
  std::string normalize(std::string text) const override {
    std::string out;
    size_t start = 0;
    for (size_t hit; (hit = text.find(pattern_, start)) != std::string::npos; start = hit + pattern_.size()) {
      out.append(text, start, hit - start);
      out += content_;
    }
    out.append(text, start);
    return out;
  }

 private:
  std::string pattern_, content_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    const auto cps = unicode::to_code_points(text);
    size_t begin = 0, end = cps.size();
    if (left_) {
      while (begin < end && unicode::is_white_space(cps[begin])) ++begin;
    }
    if (right_) {
      while (end > begin && unicode::is_white_space(cps[end - 1])) --end;
    }
    std::string out;
    for (size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
    return out;
  }

 private:
  bool left_, right_;
};

class NormalizerSequence final : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<NormalizerPtr> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<NormalizerPtr> steps_;
};

}  // namespace

NormalizerPtr make_bert_normalizer(const BertNormalizerOptions& options) {
  return std::make_unique<BertNormalizer>(options);
}

NormalizerPtr make_unicode_normalizer(std::string_view form) {
  if (form == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFC);
  if (form == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFD);
  if (form == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFKC);
  if (form == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFKD);
  TESSERA_FAIL("unknown Unicode normal form '" << form << "' (expected NFC, NFD, NFKC or NFKD)");
}

NormalizerPtr make_lowercase_normalizer() { return std::make_unique<LowercaseNormalizer>(); }
NormalizerPtr make_prepend_normalizer(std::string prefix) {
  return std::make_unique<PrependNormalizer>(std::move(prefix));
}
NormalizerPtr make_replace_normalizer(std::string pattern, std::string content) {
  return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
}
NormalizerPtr make_strip_normalizer(bool left, bool right) { return std::make_unique<StripNormalizer>(left, right); }
NormalizerPtr make_normalizer_sequence(std::vector<NormalizerPtr> steps) {
  return std::make_unique<NormalizerSequence>(std::move(steps));
}

}  // namespace tessera::tok
