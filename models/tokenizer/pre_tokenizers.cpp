// models/tokenizer/pre_tokenizers.cpp: HF pre-tokenizers (Split, Digits, ByteLevel, Bert,
// Whitespace, WhitespaceSplit, Punctuation, Metaspace, Sequence) over PCRE2 (UTF + UCP).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>

#include "common/error.h"
#include "models/tokenizer/components.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera::tok {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

SplitBehavior split_behavior_from_name(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  TESSERA_FAIL("unknown split behavior '" << name
                                          << "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or "
                                             "Contiguous)");
}

namespace {

struct Span {
  size_t begin, end;
  bool is_match;
};

// Turns the match/non-match spans covering `piece` into pieces as HF's SplitDelimiterBehavior does.
void emit_pieces(const std::string& piece, std::vector<Span> spans, SplitBehavior behavior, bool invert,
                 std::vector<std::string>& out) {
  if (invert) {
    for (auto& s : spans) s.is_match = !s.is_match;
  }
  std::vector<Span> merged;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      merged = std::move(spans);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.is_match) merged.push_back(s);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& s : merged) {
    if (s.end > s.begin) out.emplace_back(piece, s.begin, s.end - s.begin);
  }
}

// Spans where each code point satisfying `pred` is its own match.
std::vector<Span> char_spans(const std::string& piece, const std::function<bool(char32_t)>& pred) {
  std::vector<Span> spans;
  size_t run_start = 0;
  for (size_t pos = 0; pos < piece.size();) {
    const size_t start = pos;
    const char32_t cp = unicode::next_code_point(piece, pos);
    if (pred(cp)) {
      if (start > run_start) spans.push_back({run_start, start, false});
      spans.push_back({start, pos, true});
      run_start = pos;
    }
  }
  if (piece.size() > run_start) spans.push_back({run_start, piece.size(), false});
  return spans;
}

class CharSplit final : public PreTokenizer {
 public:
  CharSplit(std::function<bool(char32_t)> pred, SplitBehavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void split(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size());
    for (const auto& piece : pieces) emit_pieces(piece, char_spans(piece, pred_), behavior_, false, out);
    pieces = std::move(out);
  }

 private:
  std::function<bool(char32_t)> pred_;
  SplitBehavior behavior_;
};

struct Pcre2CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct Pcre2MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

class RegexSplit final : public PreTokenizer {
 public:
  RegexSplit(std::string_view pattern, SplitBehavior behavior, bool invert)
      : pattern_(pattern), behavior_(behavior), invert_(invert) {
    const std::string rewritten = unicode::rewrite_regex_for_pcre2(pattern);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &error_offset, nullptr));
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      TESSERA_FAIL("pre-tokenizer regex '" << pattern_ << "' does not compile: " << reinterpret_cast<char*>(message)
                                           << " at offset " << error_offset);
    }
    // JIT is an optimisation only; the interpreter is used when it is unavailable.
    (void)pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);
  }

  void split(std::vector<std::string>& pieces) const override {
    std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter> match(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    std::vector<Span> spans;
    for (const auto& piece : pieces) {
      spans.clear();
      size_t prev = 0, offset = 0;
      while (offset < piece.size()) {
        const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(piece.data()), piece.size(), offset,
                                   PCRE2_NO_UTF_CHECK, match.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        TESSERA_CHECK(rc >= 0, "pre-tokenizer regex '" << pattern_ << "' failed with PCRE2 error " << rc);
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const size_t begin = ovector[0], end = ovector[1];
        if (end == begin) {  // empty matches split nothing; step over one code point
          offset = begin;
          unicode::next_code_point(piece, offset);
          continue;
        }
        if (begin > prev) spans.push_back({prev, begin, false});
        spans.push_back({begin, end, true});
        prev = offset = end;
      }
      if (piece.size() > prev) spans.push_back({prev, piece.size(), false});
      emit_pieces(piece, spans, behavior_, invert_, out);
    }
    pieces = std::move(out);
  }

 private:
  std::string pattern_;
  SplitBehavior behavior_;
  bool invert_;
  std::unique_ptr<pcre2_code, Pcre2CodeDeleter> code_;
};

class LiteralSplit final : public PreTokenizer {
 public:
  LiteralSplit(std::string literal, SplitBehavior behavior, bool invert)
      : literal_(std::move(literal)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    for (const auto& piece : pieces) {
      std::vector<Span> spans;
      size_t prev = 0;
      if (!literal_.empty()) {
        for (size_t hit; (hit = piece.find(literal_, prev)) != std::string::npos; prev = hit + literal_.size()) {
          if (hit > prev) spans.push_back({prev, hit, false});
          spans.push_back({hit, hit + literal_.size(), true});
        }
      }
      if (piece.size() > prev) spans.push_back({prev, piece.size(), false});
      emit_pieces(piece, spans, behavior_, invert_, out);
    }
    pieces = std::move(out);
  }

 private:
  std::string literal_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<RegexSplit>(kGpt2Pattern, SplitBehavior::kIsolated, false);
  }
  void split(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& piece : pieces) {
        if (!piece.starts_with(' ')) piece.insert(piece.begin(), ' ');
      }
    }
    if (regex_) regex_->split(pieces);
    for (auto& piece : pieces) piece = unicode::bytes_to_byte_level(piece);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<RegexSplit> regex_;
};

bool is_bert_punctuation(char32_t cp) {
  const bool ascii_punct = (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
                           (cp >= 123 && cp <= 126);
  return ascii_punct || unicode::is_punctuation(cp);
}

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, bool prepend_always, bool prepend_first, bool split)
      : replacement_(std::move(replacement)),
        prepend_always_(prepend_always),
        prepend_first_(prepend_first),
        split_(split) {}
  void split(std::vector<std::string>& pieces) const override { split_segment(pieces, true); }
  void split_segment(std::vector<std::string>& pieces, bool starts_text) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::string text;
      for (const char c : pieces[i]) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text.push_back(c);
        }
      }
      if ((prepend_always_ || (prepend_first_ && starts_text && i == 0)) && !text.starts_with(replacement_)) {
        text = replacement_ + text;
      }
      if (split_) {
        std::vector<std::string> one{std::move(text)};
        LiteralSplit(replacement_, SplitBehavior::kMergedWithNext, false).split(one);
        for (auto& p : one) out.push_back(std::move(p));
      } else {
        out.push_back(std::move(text));
      }
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  bool prepend_always_, prepend_first_, split_;
};

class PreTokenizerSequence final : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<PreTokenizerPtr> steps) : steps_(std::move(steps)) {}
  void split(std::vector<std::string>& pieces) const override { split_segment(pieces, true); }
  void split_segment(std::vector<std::string>& pieces, bool starts_text) const override {
    for (const auto& step : steps_) step->split_segment(pieces, starts_text);
  }

 private:
  std::vector<PreTokenizerPtr> steps_;
};

}  // namespace

PreTokenizerPtr make_regex_split(std::string_view pattern, SplitBehavior behavior, bool invert) {
  return std::make_unique<RegexSplit>(pattern, behavior, invert);
}
PreTokenizerPtr make_literal_split(std::string literal, SplitBehavior behavior, bool invert) {
  return std::make_unique<LiteralSplit>(std::move(literal), behavior, invert);
}
PreTokenizerPtr make_digits_split(bool individual_digits) {
  return std::make_unique<CharSplit>(unicode::is_numeric,
                                     individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
}
PreTokenizerPtr make_byte_level(bool add_prefix_space, bool use_regex) {
  return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, use_regex);
}
PreTokenizerPtr make_bert_pre_tokenizer() {
  std::vector<PreTokenizerPtr> steps;
  steps.push_back(std::make_unique<CharSplit>(unicode::is_white_space, SplitBehavior::kRemoved));
  steps.push_back(std::make_unique<CharSplit>(is_bert_punctuation, SplitBehavior::kIsolated));
  return make_pre_tokenizer_sequence(std::move(steps));
}
PreTokenizerPtr make_whitespace_pre_tokenizer() {
  return std::make_unique<RegexSplit>(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, true);
}
PreTokenizerPtr make_whitespace_split_pre_tokenizer() {
  return std::make_unique<CharSplit>(unicode::is_white_space, SplitBehavior::kRemoved);
}
PreTokenizerPtr make_punctuation_split(SplitBehavior behavior) {
  return std::make_unique<CharSplit>(is_bert_punctuation, behavior);
}
PreTokenizerPtr make_metaspace(std::string replacement, std::string_view prepend_scheme, bool split) {
  TESSERA_CHECK(prepend_scheme == "always" || prepend_scheme == "first" || prepend_scheme == "never",
                "Metaspace: unknown prepend_scheme '" << prepend_scheme << "' (expected always, first or never)");
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), prepend_scheme == "always",
                                                 prepend_scheme == "first", split);
}
PreTokenizerPtr make_pre_tokenizer_sequence(std::vector<PreTokenizerPtr> steps) {
  return std::make_unique<PreTokenizerSequence>(std::move(steps));
}

}  // namespace tessera::tok
