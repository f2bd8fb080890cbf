// models/tokenizer/tokenizer.h: the Tokenizer interface (byte-level BPE, SentencePiece, WordPiece
// behind it) and incremental decoding for streaming.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct ModelFiles;

struct Encoding {
  std::vector<int32_t> ids;
  // As HF `tokens` reports them: vocabulary strings, and for an added token the text it matched
  // (whitespace it strips included).
  std::vector<std::string> tokens;
};

// Tokenizers are immutable once loaded: every method is const and safe to call from many threads.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // add_special: BOS / [CLS] ... [SEP] as HF's add_special_tokens does for this model.
  // Added/special tokens written in the text (e.g. "<|im_start|>") are split out first.
  virtual Encoding encode(std::string_view text, bool add_special) const = 0;
  // skip_special: drop special/control tokens from the output. Ids outside the vocabulary decode to
  // nothing (a model's embedding may be padded past its vocabulary), as HF does.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual int32_t token_to_id(std::string_view token) const = 0;  // -1 when absent
  // True when decode(encode(s)) == s for all valid UTF-8 s (byte-level BPE, byte-fallback SPM).
  virtual bool lossless() const = 0;
  virtual bool is_special(int32_t id) const = 0;
};

// Picks and builds the tokenizer a model ships (tokenizer.json, tokenizer.model, vocab.txt or the
// GGUF tokenizer.ggml.* metadata). Throws tessera::Error naming what is missing or unsupported.
std::unique_ptr<Tokenizer> load_tokenizer(const ModelFiles& files);

// Not thread-safe: one per stream. Streams text from ids one token at a time, never emitting half a UTF-8 character and handling
// tokenizers whose pieces only make sense in context (SentencePiece's leading space, byte pieces).
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special);
  // Returns the new text made complete by `id` (possibly empty).
  std::string push(int32_t id);
  // Whatever is left at the end (invalid trailing bytes become U+FFFD as HF does).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_..read_offset_) give the context for the next piece
  size_t read_offset_ = 0;
  std::string emitted_;       // decode of ids_[prefix_offset_..read_offset_)
};

}  // namespace tessera
