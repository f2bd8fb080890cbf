// tests/unit/scheduler/letter_tokenizer.h: a stand-in tokenizer whose every id is one letter, for
// the scheduler and engine-loop tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/tokenizer/tokenizer.h"

namespace tessera::test {

// Token id i decodes to the letter 'a' + i % 26: enough text for stop strings and streaming.
class LetterTokenizer final : public Tokenizer {
 public:
  explicit LetterTokenizer(int64_t vocab) : vocab_(vocab) {}
  Encoding encode(std::string_view text, bool) const override {
    Encoding e;
    for (char c : text) e.ids.push_back(static_cast<int32_t>(c - 'a'));
    return e;
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>('a' + id % 26);
    return s;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::string id_to_token(int32_t id) const override { return std::string(1, static_cast<char>('a' + id % 26)); }
  int32_t token_to_id(std::string_view) const override { return -1; }
  bool lossless() const override { return false; }
  bool is_special(int32_t) const override { return false; }

 private:
  int64_t vocab_;
};

}  // namespace tessera::test
