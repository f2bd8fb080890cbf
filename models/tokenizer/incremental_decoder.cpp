// models/tokenizer/incremental_decoder.cpp: streaming detokenization. Decodes a small window of ids
// (context + new ids) and emits only what the new ids added, once it no longer ends in an
// incomplete UTF-8 sequence (decoded as U+FFFD). The context makes pieces that depend on their
// neighbours (SentencePiece's leading "▁", WordPiece's "##") come out as a full decode would.
#include "models/tokenizer/tokenizer.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  ids_.push_back(id);
  const std::vector<int32_t> window(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_), ids_.end());
  const std::string text = tokenizer_.decode(window, skip_special_);
  if (text.size() <= emitted_.size() || unicode::ends_with_replacement(text)) return {};
  std::string fresh = text.substr(emitted_.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  const std::vector<int32_t> context(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_), ids_.end());
  emitted_ = tokenizer_.decode(context, skip_special_);
  return fresh;
}

std::string IncrementalDecoder::finish() {
  const std::vector<int32_t> window(ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_), ids_.end());
  const std::string text = tokenizer_.decode(window, skip_special_);
  std::string rest = text.size() > emitted_.size() ? text.substr(emitted_.size()) : std::string();
  ids_.clear();
  prefix_offset_ = read_offset_ = 0;
  emitted_.clear();
  return rest;
}

}  // namespace tessera
