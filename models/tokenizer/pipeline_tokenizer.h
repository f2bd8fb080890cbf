// models/tokenizer/pipeline_tokenizer.h: the Tokenizer built from HF-style stages (added tokens,
// normalizer, pre-tokenizer, model, post-processor template, decoder). tokenizer.json and GGUF
// vocabularies both become one of these. Immutable once built: encode/decode are thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/tokenizer/components.h"
#include "models/tokenizer/tokenizer.h"

namespace tessera::tok {

// An HF added token: matched in the text before anything else runs.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by decode(skip_special)
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool normalized = false;   // matched in the normalized text instead of the raw text
  bool single_word = false;  // only matched when not inside a word
};

// One element of the post-processor's single-sequence template: the input's ids, or special ids.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

struct PipelineParts {
  std::vector<AddedToken> added_tokens;
  NormalizerPtr normalizer;        // may be null
  PreTokenizerPtr pre_tokenizer;   // may be null: the whole segment goes to the model
  TokenModelPtr model;             // required
  std::vector<TemplateItem> single_template;  // applied when add_special; empty adds nothing
  DecoderPtr decoder;              // may be null: tokens are joined with spaces, as HF does
  bool lossless = false;
};

class PipelineTokenizer final : public Tokenizer {
 public:
  explicit PipelineTokenizer(PipelineParts parts);

  Encoding encode(std::string_view text, bool add_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string id_to_token(int32_t id) const override;
  int32_t token_to_id(std::string_view token) const override;
  bool lossless() const override { return parts_.lossless; }
  bool is_special(int32_t id) const override;

 private:
  struct Segment {
    std::string text;
    int32_t added_id = -1;  // >= 0: the segment is this added token
  };
  // Splits `text` around the added tokens of one set (leftmost, then longest match).
  // Added tokens bucketed by first byte, longest first within a bucket.
  struct AddedSet {
    std::vector<const AddedToken*> by_first_byte[256];
    bool empty = true;
  };
  void split_added(std::string text, const AddedSet& set, std::vector<Segment>& out) const;
  void encode_segment(const std::string& text, bool starts_text, std::vector<int32_t>& ids) const;

  PipelineParts parts_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  StringMap<int32_t> added_by_content_;
  AddedSet raw_match_;         // normalized == false
  AddedSet normalized_match_;  // normalized == true
  std::vector<std::string> normalized_content_;      // by index into parts_.added_tokens
  int64_t vocab_size_ = 0;
};

}  // namespace tessera::tok
