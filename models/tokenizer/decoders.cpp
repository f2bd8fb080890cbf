// models/tokenizer/decoders.cpp: HF decoders (ByteLevel, WordPiece, Metaspace, Replace,
// ByteFallback, Fuse, Strip, Sequence), applied to the list of token strings.
#include <string>

#include "common/error.h"
#include "models/tokenizer/components.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera::tok {
namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t start = 0;
  for (size_t hit; (hit = s.find(from, start)) != std::string::npos; start = hit + from.size()) {
    out.append(s, start, hit - start);
    out.append(to);
  }
  if (start == 0) return;
  out.append(s, start);
  s = std::move(out);
}

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    std::string token_bytes;
    for (const auto& token : tokens) {
      token_bytes.clear();
      bool mapped = true;
      for (size_t pos = 0; pos < token.size() && mapped;) {
        const int b = unicode::unicode_to_byte(unicode::next_code_point(token, pos));
        if (b < 0) {
          mapped = false;
        } else {
          token_bytes.push_back(static_cast<char>(b));
        }
      }
      // Tokens outside the byte map (added tokens written in plain text) pass through as they are.
      bytes += mapped ? token_bytes : token;
    }
    tokens.assign(1, unicode::utf8_lossy(bytes));
  }
};

class WordPieceDecoder final : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& token = tokens[i];
      if (i != 0) {
        if (!prefix_.empty() && token.starts_with(prefix_)) {
          token.erase(0, prefix_.size());
        } else {
          token.insert(token.begin(), ' ');
        }
      }
      if (cleanup_) {
        // The clean-up HF (and BERT's original tokenizer) applies to each decoded token.
        replace_all(token, " .", ".");
        replace_all(token, " ?", "?");
        replace_all(token, " !", "!");
        replace_all(token, " ,", ",");
        replace_all(token, " ' ", "'");
        replace_all(token, " n't", "n't");
        replace_all(token, " 'm", "'m");
        replace_all(token, " do not", " don't");
        replace_all(token, " 's", "'s");
        replace_all(token, " 've", "'ve");
        replace_all(token, " 're", "'re");
      }
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first_space)
      : replacement_(std::move(replacement)), strip_first_space_(strip_first_space) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      replace_all(tokens[i], replacement_, i == 0 && strip_first_space_ ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  bool strip_first_space_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) replace_all(token, pattern_, content_);
  }

 private:
  std::string pattern_, content_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;  // bytes of consecutive <0xNN> pieces
    const auto flush = [&] {
      if (pending.empty()) return;
      if (unicode::utf8_lossy(pending) == pending) {
        out.push_back(pending);
      } else {
        // Invalid byte runs become one U+FFFD per byte, as HF's ByteFallback does.
        for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& token : tokens) {
      const int byte = parse_byte_piece(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const auto& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {
    TESSERA_CHECK(!content_.empty(), "Strip decoder: the content is empty");
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      for (size_t n = 0; n < start_ && token.starts_with(content_); ++n) token.erase(0, content_.size());
      for (size_t n = 0; n < stop_ && token.ends_with(content_); ++n) token.resize(token.size() - content_.size());
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class DecoderSequence final : public Decoder {
 public:
  explicit DecoderSequence(std::vector<DecoderPtr> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<DecoderPtr> steps_;
};

}  // namespace

DecoderPtr make_byte_level_decoder() { return std::make_unique<ByteLevelDecoder>(); }
DecoderPtr make_wordpiece_decoder(std::string prefix, bool cleanup) {
  return std::make_unique<WordPieceDecoder>(std::move(prefix), cleanup);
}
DecoderPtr make_metaspace_decoder(std::string replacement, bool strip_first_space) {
  return std::make_unique<MetaspaceDecoder>(std::move(replacement), strip_first_space);
}
DecoderPtr make_replace_decoder(std::string pattern, std::string content) {
  return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
}
DecoderPtr make_byte_fallback_decoder() { return std::make_unique<ByteFallbackDecoder>(); }
DecoderPtr make_fuse_decoder() { return std::make_unique<FuseDecoder>(); }
DecoderPtr make_strip_decoder(std::string content, size_t start, size_t stop) {
  return std::make_unique<StripDecoder>(std::move(content), start, stop);
}
DecoderPtr make_decoder_sequence(std::vector<DecoderPtr> steps) {
  return std::make_unique<DecoderSequence>(std::move(steps));
}

}  // namespace tessera::tok
