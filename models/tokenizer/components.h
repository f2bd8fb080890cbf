// models/tokenizer/components.h: the stages of an HF-style tokenizer pipeline (normalizer,
// pre-tokenizer, model, decoder), each a small immutable object; encode/decode are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessera::tok {

// ---- normalizers --------------------------------------------------------------------------------
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};
using NormalizerPtr = std::unique_ptr<const Normalizer>;

struct BertNormalizerOptions {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;  // HF: strip_accents, defaulting to lowercase when null
  bool lowercase = true;
};
NormalizerPtr make_bert_normalizer(const BertNormalizerOptions& options);
NormalizerPtr make_unicode_normalizer(std::string_view form);  // "NFC", "NFD", "NFKC", "NFKD"
NormalizerPtr make_lowercase_normalizer();
NormalizerPtr make_prepend_normalizer(std::string prefix);  // only to non-empty text, as HF
NormalizerPtr make_replace_normalizer(std::string pattern, std::string content);
NormalizerPtr make_strip_normalizer(bool left, bool right);
NormalizerPtr make_normalizer_sequence(std::vector<NormalizerPtr> steps);

// ---- pre-tokenizers -----------------------------------------------------------------------------
// Each step refines a list of pieces into smaller pieces (offsets are not tracked: Tessera only
// needs ids and tokens).
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(std::vector<std::string>& pieces) const = 0;
  // As split(), knowing whether the pieces start the text (false after an added token): only
  // Metaspace's "first" prepend scheme cares.
  virtual void split_segment(std::vector<std::string>& pieces, bool /*starts_text*/) const { split(pieces); }
};
using PreTokenizerPtr = std::unique_ptr<const PreTokenizer>;

// HF SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
SplitBehavior split_behavior_from_name(std::string_view name);

// The GPT-2 pattern HF's ByteLevel pre-tokenizer uses when use_regex is set.
extern const char* const kGpt2Pattern;
// Llama-3's pattern (GGUF pre "llama-bpe").
extern const char* const kLlama3Pattern;

// Compiles with PCRE2 (UTF + UCP); throws tessera::Error quoting the pattern when it does not.
PreTokenizerPtr make_regex_split(std::string_view pattern, SplitBehavior behavior, bool invert);
PreTokenizerPtr make_literal_split(std::string literal, SplitBehavior behavior, bool invert);
PreTokenizerPtr make_digits_split(bool individual_digits);
PreTokenizerPtr make_byte_level(bool add_prefix_space, bool use_regex);
PreTokenizerPtr make_bert_pre_tokenizer();
PreTokenizerPtr make_whitespace_pre_tokenizer();        // \w+|[^\w\s]+
PreTokenizerPtr make_whitespace_split_pre_tokenizer();  // on whitespace, removed
PreTokenizerPtr make_punctuation_split(SplitBehavior behavior);
// prepend_scheme: "always", "first" or "never".
PreTokenizerPtr make_metaspace(std::string replacement, std::string_view prepend_scheme, bool split);
PreTokenizerPtr make_pre_tokenizer_sequence(std::vector<PreTokenizerPtr> steps);

// ---- vocabulary and models ----------------------------------------------------------------------
// Lets string maps be searched with a string_view without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Token strings by id, in one arena, and an open-addressing index from string to id. A 49k-token
// vocabulary takes about 1 MB here, where a std::string per id and an unordered_map node per string
// took 5 MB of a small model's resident memory.
class Vocabulary {
 public:
  void reserve(size_t tokens);
  // When a string repeats (GGUF vocabularies may hold duplicate unused pieces), find() returns the
  // lowest of its ids.
  void add(std::string_view token, int32_t id);
  int32_t find(std::string_view token) const;  // -1 when absent
  size_t size() const { return spans_.size(); }  // one past the largest id
  std::string_view token(int32_t id) const;      // empty for an id never added

 private:
  static constexpr uint32_t kHole = UINT32_MAX;
  struct Span {
    uint32_t offset = kHole, length = 0;
  };
  void index(int32_t id);  // adds id's string to slots_ (or keeps the lower id for a repeat)

  std::string arena_;
  std::vector<Span> spans_;    // by id
  std::vector<int32_t> slots_;  // ids by string hash, linear probing; -1 is free; size a power of two
  size_t indexed_ = 0;
};

class TokenModel {
 public:
  virtual ~TokenModel() = default;
  // Appends the ids of one pre-tokenized piece.
  virtual void tokenize(std::string_view piece, std::vector<int32_t>& ids) const = 0;
  const Vocabulary& vocab() const { return vocab_; }

 protected:
  Vocabulary vocab_;
};
using TokenModelPtr = std::unique_ptr<const TokenModel>;

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;  // unknown characters become <0xNN> pieces
  bool ignore_merges = false;  // a piece that is itself in the vocabulary is not merged
};
// merges: pairs of token strings in priority order; a merge naming an unknown token is an error.
TokenModelPtr make_bpe_model(Vocabulary vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                             const BpeOptions& options);

struct WordPieceOptions {
  std::string unk_token = "[UNK]";
  std::string continuing_subword_prefix = "##";
  size_t max_input_chars_per_word = 100;
};
TokenModelPtr make_wordpiece_model(Vocabulary vocab, const WordPieceOptions& options);

// SentencePiece-style BPE over scores (GGUF tokenizer.ggml.model = llama): repeatedly merges the
// adjacent pair whose concatenation is a mergeable piece with the highest score (leftmost on ties);
// pieces left unknown become <0xNN> byte pieces, or unk when those are missing.
struct ScoredPiece {
  float score = 0;
  bool mergeable = true;  // normal / user-defined pieces; control, unknown and byte pieces are not
};
TokenModelPtr make_spm_bpe_model(Vocabulary vocab, std::vector<ScoredPiece> pieces, int32_t unk_id);

// ---- decoders -----------------------------------------------------------------------------------
// HF decode_chain: each decoder rewrites the list of token strings; the result is concatenated.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};
using DecoderPtr = std::unique_ptr<const Decoder>;

DecoderPtr make_byte_level_decoder();
DecoderPtr make_wordpiece_decoder(std::string prefix, bool cleanup);
DecoderPtr make_metaspace_decoder(std::string replacement, bool strip_first_space);
DecoderPtr make_replace_decoder(std::string pattern, std::string content);
DecoderPtr make_byte_fallback_decoder();
DecoderPtr make_fuse_decoder();
DecoderPtr make_strip_decoder(std::string content, size_t start, size_t stop);
DecoderPtr make_decoder_sequence(std::vector<DecoderPtr> steps);

// "<0x41>" -> 0x41; -1 when `token` is not a byte piece.
int parse_byte_piece(std::string_view token);

}  // namespace tessera::tok
