// models/tokenizer/pipeline_tokenizer.cpp: encode/decode through the HF-style stages.
#include "models/tokenizer/pipeline_tokenizer.h"

#include <algorithm>

#include "common/error.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera::tok {
namespace {

bool is_word_char(char32_t cp) { return cp == '_' || unicode::is_letter(cp) || unicode::is_numeric(cp); }

// The code point that ends at byte `end` (text[..end] is valid UTF-8).
char32_t code_point_before(std::string_view text, size_t end, size_t& start) {
  start = end;
  do {
    --start;
  } while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80);
  size_t pos = start;
  return unicode::next_code_point(text, pos);
}

}  // namespace

PipelineTokenizer::PipelineTokenizer(PipelineParts parts) : parts_(std::move(parts)) {
  TESSERA_CHECK(parts_.model != nullptr, "a tokenizer needs a model");
  vocab_size_ = static_cast<int64_t>(parts_.model->vocab().size());
  normalized_content_.resize(parts_.added_tokens.size());
  for (size_t i = 0; i < parts_.added_tokens.size(); ++i) {
    const AddedToken& t = parts_.added_tokens[i];
    TESSERA_CHECK(t.id >= 0, "added token '" << t.content << "' has no id");
    TESSERA_CHECK(!t.content.empty(), "added token " << t.id << " is empty");
    added_by_id_[t.id] = &t;
    added_by_content_.emplace(t.content, t.id);
    vocab_size_ = std::max<int64_t>(vocab_size_, t.id + 1);
    normalized_content_[i] = t.normalized && parts_.normalizer ? parts_.normalizer->normalize(t.content) : t.content;
    added_by_content_.emplace(normalized_content_[i], t.id);
    if (normalized_content_[i].empty()) continue;  // normalized away: can never match
    AddedSet& set = t.normalized ? normalized_match_ : raw_match_;
    set.by_first_byte[static_cast<uint8_t>(normalized_content_[i][0])].push_back(&t);
    set.empty = false;
  }
  const auto longest_first = [this](const AddedToken* a, const AddedToken* b) {
    const size_t la = normalized_content_[static_cast<size_t>(a - parts_.added_tokens.data())].size();
    const size_t lb = normalized_content_[static_cast<size_t>(b - parts_.added_tokens.data())].size();
    return la != lb ? la > lb : a->id < b->id;
  };
  for (AddedSet* set : {&raw_match_, &normalized_match_}) {
    for (auto& bucket : set->by_first_byte) std::sort(bucket.begin(), bucket.end(), longest_first);
  }
}

void PipelineTokenizer::split_added(std::string text, const AddedSet& set, std::vector<Segment>& out) const {
  if (set.empty) {
    out.push_back({std::move(text), -1});
    return;
  }
  size_t segment_start = 0;  // start of the text not yet emitted
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* t : set.by_first_byte[static_cast<uint8_t>(text[pos])]) {
      const std::string& content = normalized_content_[static_cast<size_t>(t - parts_.added_tokens.data())];
      if (text.compare(pos, content.size(), content) != 0) continue;
      if (t->single_word) {
        size_t unused = 0;
        const bool word_before = pos > 0 && is_word_char(code_point_before(text, pos, unused));
        size_t after = pos + content.size();
        const bool word_after = after < text.size() && is_word_char(unicode::next_code_point(text, after));
        if (word_before || word_after) continue;
      }
      hit = t;
      break;
    }
    if (hit == nullptr) {
      unicode::next_code_point(text, pos);
      continue;
    }
    size_t start = pos, end = pos + normalized_content_[static_cast<size_t>(hit - parts_.added_tokens.data())].size();
    if (hit->lstrip) {
      while (start > segment_start) {
        size_t prev = 0;
        if (!unicode::is_white_space(code_point_before(text, start, prev))) break;
        start = prev;
      }
    }
    if (hit->rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!unicode::is_white_space(unicode::next_code_point(text, next))) break;
        end = next;
      }
    }
    if (start > segment_start) out.push_back({text.substr(segment_start, start - segment_start), -1});
    // HF reports an added token as the text it matched, stripped whitespace included.
    out.push_back({text.substr(start, end - start), hit->id});
    segment_start = pos = end;
  }
  if (text.size() > segment_start) out.push_back({text.substr(segment_start), -1});
}

void PipelineTokenizer::encode_segment(const std::string& text, bool starts_text, std::vector<int32_t>& ids) const {
  std::vector<std::string> pieces{text};
  if (parts_.pre_tokenizer) parts_.pre_tokenizer->split_segment(pieces, starts_text);
  for (const auto& piece : pieces) parts_.model->tokenize(piece, ids);
}

Encoding PipelineTokenizer::encode(std::string_view input, bool add_special) const {
  // Regexes and normalization need valid UTF-8; invalid bytes become U+FFFD as a Python str would.
  std::string text = unicode::utf8_lossy(input);
  Encoding body;
  const auto add_model_tokens = [&](size_t from) {
    for (size_t i = from; i < body.ids.size(); ++i) body.tokens.push_back(id_to_token(body.ids[i]));
  };
  std::vector<Segment> raw;
  split_added(std::move(text), raw_match_, raw);
  std::vector<Segment> normalized;
  for (auto& segment : raw) {
    if (segment.added_id >= 0) {
      body.ids.push_back(segment.added_id);
      body.tokens.push_back(std::move(segment.text));
      continue;
    }
    std::string norm = parts_.normalizer ? parts_.normalizer->normalize(std::move(segment.text)) : std::move(segment.text);
    normalized.clear();
    split_added(std::move(norm), normalized_match_, normalized);
    for (auto& sub : normalized) {
      if (sub.added_id >= 0) {
        body.ids.push_back(sub.added_id);
        body.tokens.push_back(std::move(sub.text));
      } else if (!sub.text.empty()) {
        const size_t from = body.ids.size();
        encode_segment(sub.text, body.ids.empty(), body.ids);
        add_model_tokens(from);
      }
    }
  }
  if (!add_special || parts_.single_template.empty()) return body;
  Encoding encoding;
  for (const auto& item : parts_.single_template) {
    if (item.is_sequence) {
      encoding.ids.insert(encoding.ids.end(), body.ids.begin(), body.ids.end());
      encoding.tokens.insert(encoding.tokens.end(), body.tokens.begin(), body.tokens.end());
      continue;
    }
    for (const int32_t id : item.ids) {
      encoding.ids.push_back(id);
      encoding.tokens.push_back(id_to_token(id));
    }
  }
  return encoding;
}

std::string PipelineTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    // Ids the vocabulary lacks (a model's embedding may be padded past it) decode to nothing, as HF.
    if (id < 0 || id >= vocab_size_) continue;
    if (skip_special && is_special(id)) continue;
    tokens.push_back(id_to_token(id));
  }
  if (!parts_.decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  parts_.decoder->decode_chain(tokens);
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

std::string PipelineTokenizer::id_to_token(int32_t id) const {
  TESSERA_CHECK(id >= 0 && id < vocab_size_, "token id " << id << " is outside the vocabulary [0, " << vocab_size_ << ")");
  // HF names a normalized added token by its normalized form ("Foo" on a Lowercase normalizer is "foo").
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    return normalized_content_[static_cast<size_t>(it->second - parts_.added_tokens.data())];
  }
  return std::string(parts_.model->vocab().token(id));
}

int32_t PipelineTokenizer::token_to_id(std::string_view token) const {
  if (const auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
  return parts_.model->vocab().find(token);
}

bool PipelineTokenizer::is_special(int32_t id) const {
  const auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && it->second->special;
}

}  // namespace tessera::tok
