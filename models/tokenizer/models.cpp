// models/tokenizer/models.cpp: the vocabulary and the token models: byte-level/char BPE over merge
// ranks (HF BPE), WordPiece (greedy longest match), and score-based SentencePiece BPE.
#include <algorithm>
#include <cstdio>
#include <queue>
#include <string>

#include "common/error.h"
#include "models/tokenizer/components.h"
#include "models/tokenizer/unicode_text.h"

namespace tessera::tok {

void Vocabulary::reserve(size_t tokens) {
  spans_.reserve(tokens);
  size_t slots = 16;
  while (slots * 3 < tokens * 4) slots *= 2;
  if (slots <= slots_.size()) return;
  slots_.assign(slots, -1);
  indexed_ = 0;
  for (size_t id = 0; id < spans_.size(); ++id) {
    if (spans_[id].offset != kHole) index(static_cast<int32_t>(id));
  }
}

void Vocabulary::index(int32_t id) {
  if ((indexed_ + 1) * 4 > slots_.size() * 3) reserve(std::max<size_t>(16, slots_.size()));
  const std::string_view text = token(id);
  size_t i = std::hash<std::string_view>{}(text) & (slots_.size() - 1);
  for (; slots_[i] >= 0; i = (i + 1) & (slots_.size() - 1)) {
    if (token(slots_[i]) == text) {  // the string repeats: the lower id stands for it
      slots_[i] = std::min(slots_[i], id);
      return;
    }
  }
  slots_[i] = id;
  ++indexed_;
}

void Vocabulary::add(std::string_view token, int32_t id) {
  TESSERA_CHECK(id >= 0, "vocabulary token '" << token << "' has a negative id " << id);
  TESSERA_CHECK(arena_.size() + token.size() < kHole, "vocabulary: token strings exceed 4 GiB");
  if (static_cast<size_t>(id) >= spans_.size()) spans_.resize(static_cast<size_t>(id) + 1);
  spans_[static_cast<size_t>(id)] = {static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(token.size())};
  arena_.append(token);
  index(id);
}

int32_t Vocabulary::find(std::string_view token) const {
  if (slots_.empty()) return -1;
  for (size_t i = std::hash<std::string_view>{}(token) & (slots_.size() - 1); slots_[i] >= 0;
       i = (i + 1) & (slots_.size() - 1)) {
    if (this->token(slots_[i]) == token) return slots_[i];
  }
  return -1;
}

std::string_view Vocabulary::token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= spans_.size()) return {};
  const Span& s = spans_[static_cast<size_t>(id)];
  return s.offset == kHole ? std::string_view() : std::string_view(arena_).substr(s.offset, s.length);
}

int parse_byte_piece(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    value *= 16;
    if (c >= '0' && c <= '9') {
      value += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

namespace {

std::string byte_piece(uint8_t byte) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "<0x%02X>", byte);
  return buf;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

class BpeModel final : public TokenModel {
 public:
  BpeModel(Vocabulary vocab, const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& o)
      : options_(o) {
    vocab_ = std::move(vocab);
    if (o.unk_token) unk_id_ = vocab_.find(*o.unk_token);
    size_t slots = 16;
    while (slots * 3 < merges.size() * 4) slots *= 2;
    merges_.assign(slots, MergeSlot{});
    const size_t prefix_len = o.continuing_subword_prefix.size();
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const auto& [left, right] = merges[rank];
      const int32_t left_id = vocab_.find(left), right_id = vocab_.find(right);
      TESSERA_CHECK(left_id >= 0 && right_id >= 0,
                    "BPE merge " << rank << " '" << left << " " << right << "' names a token missing from the vocabulary");
      // With a continuing-subword prefix the merged token drops the right side's prefix.
      const std::string merged =
          left + (prefix_len > 0 && right.starts_with(o.continuing_subword_prefix) ? right.substr(prefix_len) : right);
      const int32_t merged_id = vocab_.find(merged);
      TESSERA_CHECK(merged_id >= 0, "BPE merge " << rank << " '" << left << " " << right << "' makes '" << merged
                                                 << "', which is missing from the vocabulary");
      MergeSlot& slot = merge_slot(pair_key(left_id, right_id));
      if (slot.key == kNoPair) slot = {pair_key(left_id, right_id), Merge{static_cast<int32_t>(rank), merged_id}};
    }
  }

  void tokenize(std::string_view piece, std::vector<int32_t>& ids) const override {
    if (piece.empty()) return;
    if (options_.ignore_merges) {
      if (const int32_t id = vocab_.find(piece); id >= 0) {
        ids.push_back(id);
        return;
      }
    }
    std::vector<Symbol> symbols;
    symbols.reserve(piece.size());
    const auto push_symbol = [&](int32_t id) {
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({id, index - 1, -1, true});
      if (index > 0) symbols[index - 1].next = index;
    };
    bool last_was_unk = false;
    std::string key;
    for (size_t pos = 0; pos < piece.size();) {
      const size_t start = pos;
      unicode::next_code_point(piece, pos);
      const std::string_view ch = piece.substr(start, pos - start);
      key.clear();
      if (start > 0) key += options_.continuing_subword_prefix;
      key += ch;
      if (pos == piece.size()) key += options_.end_of_word_suffix;
      if (const int32_t id = vocab_.find(key); id >= 0) {
        push_symbol(id);
        last_was_unk = false;
        continue;
      }
      if (options_.byte_fallback) {
        std::vector<int32_t> byte_ids;
        for (const char c : ch) {
          const int32_t id = vocab_.find(byte_piece(static_cast<uint8_t>(c)));
          if (id < 0) break;
          byte_ids.push_back(id);
        }
        if (byte_ids.size() == ch.size()) {
          for (const int32_t id : byte_ids) push_symbol(id);
          last_was_unk = false;
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (!(options_.fuse_unk && last_was_unk)) push_symbol(unk_id_);
        last_was_unk = true;
      }
    }
    merge(symbols);
    for (const auto& s : symbols) {
      if (s.alive) ids.push_back(s.id);
    }
  }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  // Merges by id pair, open addressing with linear probing: 16 bytes a merge, where unordered_map
  // nodes and buckets took 40. Ids are non-negative, so no pair's key is all ones.
  static constexpr uint64_t kNoPair = ~uint64_t{0};
  struct MergeSlot {
    uint64_t key = kNoPair;
    Merge merge{};
  };
  // The slot holding `key`, or the free slot where it would go.
  MergeSlot& merge_slot(uint64_t key) { return merges_[slot_index(key)]; }
  size_t slot_index(uint64_t key) const {
    const size_t mask = merges_.size() - 1;
    size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    while (merges_[i].key != key && merges_[i].key != kNoPair) i = (i + 1) & mask;
    return i;
  }

  const Merge* find_merge(int32_t left, int32_t right) const {
    const MergeSlot& slot = merges_[slot_index(pair_key(left, right))];
    return slot.key == kNoPair ? nullptr : &slot.merge;
  }

  // Applies merges lowest rank first, leftmost first among equal ranks, as HF's BPE does.
  void merge(std::vector<Symbol>& symbols) const {
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
        queue.push({m->rank, static_cast<int>(i), m->merged_id});
      }
    }
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[static_cast<size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      Symbol& right = symbols[static_cast<size_t>(left.next)];
      const Merge* m = find_merge(left.id, right.id);
      if (m == nullptr || m->rank != top.rank || m->merged_id != top.merged_id) continue;
      left.id = top.merged_id;
      right.alive = false;
      left.next = right.next;
      if (left.next >= 0) symbols[static_cast<size_t>(left.next)].prev = top.pos;
      if (left.prev >= 0) {
        if (const Merge* p = find_merge(symbols[static_cast<size_t>(left.prev)].id, left.id)) {
          queue.push({p->rank, left.prev, p->merged_id});
        }
      }
      if (left.next >= 0) {
        if (const Merge* n = find_merge(left.id, symbols[static_cast<size_t>(left.next)].id)) {
          queue.push({n->rank, top.pos, n->merged_id});
        }
      }
    }
  }

  BpeOptions options_;
  int32_t unk_id_ = -1;
  std::vector<MergeSlot> merges_;
};

class WordPieceModel final : public TokenModel {
 public:
  WordPieceModel(Vocabulary vocab, const WordPieceOptions& o) : options_(o) {
    vocab_ = std::move(vocab);
    unk_id_ = vocab_.find(o.unk_token);
    TESSERA_CHECK(unk_id_ >= 0, "WordPiece: the unknown token '" << o.unk_token << "' is not in the vocabulary");
  }

  void tokenize(std::string_view word, std::vector<int32_t>& ids) const override {
    if (word.empty()) return;
    std::vector<size_t> bounds;  // code point boundaries, ending with word.size()
    for (size_t pos = 0; pos < word.size();) {
      bounds.push_back(pos);
      unicode::next_code_point(word, pos);
    }
    if (bounds.size() > options_.max_input_chars_per_word) {
      ids.push_back(unk_id_);
      return;
    }
    bounds.push_back(word.size());
    std::vector<int32_t> pieces;
    std::string candidate;
    for (size_t start = 0; start + 1 < bounds.size();) {
      int32_t found = -1;
      size_t end = bounds.size() - 1;
      for (; end > start; --end) {
        candidate.clear();
        if (start > 0) candidate += options_.continuing_subword_prefix;
        candidate.append(word.substr(bounds[start], bounds[end] - bounds[start]));
        found = vocab_.find(candidate);
        if (found >= 0) break;
      }
      if (found < 0) {
        ids.push_back(unk_id_);
        return;
      }
      pieces.push_back(found);
      start = end;
    }
    ids.insert(ids.end(), pieces.begin(), pieces.end());
  }

 private:
  WordPieceOptions options_;
  int32_t unk_id_ = -1;
};

class SpmBpeModel final : public TokenModel {
 public:
  SpmBpeModel(Vocabulary vocab, std::vector<ScoredPiece> pieces, int32_t unk_id)
      : pieces_(std::move(pieces)), unk_id_(unk_id) {
    vocab_ = std::move(vocab);
    TESSERA_CHECK(pieces_.size() >= vocab_.size(),
                  "SentencePiece vocabulary: " << pieces_.size() << " scores for " << vocab_.size() << " tokens");
    for (int b = 0; b < 256; ++b) byte_ids_[b] = vocab_.find(byte_piece(static_cast<uint8_t>(b)));
  }

  void tokenize(std::string_view text, std::vector<int32_t>& ids) const override {
    if (text.empty()) return;
    struct Symbol {
      size_t start, len;
      int prev, next;
    };
    std::vector<Symbol> symbols;
    for (size_t pos = 0; pos < text.size();) {
      const size_t start = pos;
      unicode::next_code_point(text, pos);
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({start, pos - start, index - 1, -1});
      if (index > 0) symbols[static_cast<size_t>(index) - 1].next = index;
    }
    struct Bigram {
      float score;
      int left, right;
      size_t len;
      bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
    };
    std::priority_queue<Bigram> queue;
    const auto try_add = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const size_t len = symbols[static_cast<size_t>(left)].len + symbols[static_cast<size_t>(right)].len;
      const int32_t id = vocab_.find(text.substr(symbols[static_cast<size_t>(left)].start, len));
      if (id < 0 || !pieces_[static_cast<size_t>(id)].mergeable) return;
      queue.push({pieces_[static_cast<size_t>(id)].score, left, right, len});
    };
    for (size_t i = 1; i < symbols.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
    while (!queue.empty()) {
      const Bigram top = queue.top();
      queue.pop();
      Symbol& left = symbols[static_cast<size_t>(top.left)];
      Symbol& right = symbols[static_cast<size_t>(top.right)];
      // Stale when either side has merged since this bigram was queued.
      if (left.len == 0 || right.len == 0 || left.next != top.right || left.len + right.len != top.len) continue;
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (left.next >= 0) symbols[static_cast<size_t>(left.next)].prev = top.left;
      try_add(left.prev, top.left);
      try_add(top.left, left.next);
    }
    for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
      const Symbol& s = symbols[static_cast<size_t>(i)];
      const std::string_view piece = text.substr(s.start, s.len);
      if (const int32_t id = vocab_.find(piece); id >= 0) {
        ids.push_back(id);
        continue;
      }
      for (const char c : piece) {
        const int32_t byte_id = byte_ids_[static_cast<uint8_t>(c)];
        if (byte_id >= 0) {
          ids.push_back(byte_id);
        } else if (unk_id_ >= 0) {
          ids.push_back(unk_id_);
          break;  // one unknown piece per character, as SentencePiece without byte fallback
        }
      }
    }
  }

 private:
  std::vector<ScoredPiece> pieces_;
  int32_t unk_id_;
  int32_t byte_ids_[256];
};

}  // namespace

TokenModelPtr make_bpe_model(Vocabulary vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                             const BpeOptions& options) {
  return std::make_unique<BpeModel>(std::move(vocab), merges, options);
}
TokenModelPtr make_wordpiece_model(Vocabulary vocab, const WordPieceOptions& options) {
  return std::make_unique<WordPieceModel>(std::move(vocab), options);
}
TokenModelPtr make_spm_bpe_model(Vocabulary vocab, std::vector<ScoredPiece> pieces, int32_t unk_id) {
  return std::make_unique<SpmBpeModel>(std::move(vocab), std::move(pieces), unk_id);
}

}  // namespace tessera::tok
