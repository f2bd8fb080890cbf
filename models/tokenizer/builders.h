// models/tokenizer/builders.h: builds tokenizers from each on-disk form: HF tokenizer.json,
// BERT vocab.txt, SentencePiece tokenizer.model, and GGUF tokenizer.ggml.* metadata.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/tokenizer/tokenizer.h"

namespace tessera {
class GgufFile;
}

namespace tessera::tok {

// tokenizer.json; `source` names it in error messages.
std::unique_ptr<Tokenizer> tokenizer_from_json(const nlohmann::json& json, const std::string& source);
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path);

// BERT's vocab.txt (one token per line, id = line number) with BertNormalizer, BertPreTokenizer,
// WordPiece and [CLS] ... [SEP].
std::unique_ptr<Tokenizer> load_wordpiece_vocab(const std::string& path, bool lowercase);

// A SentencePiece tokenizer.model through libsentencepiece. add_special adds BOS (and EOS when
// add_eos) as HF's Llama tokenizers do.
std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path, bool add_bos, bool add_eos);

// GGUF token types (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6
};

// The tokenizer.ggml.* metadata, separated from the file so tests can build vocabularies directly.
struct GgufTokenizerData {
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;    // tokenizer.ggml.pre (gpt2 only): "smollm", "gpt2", "llama-bpe", "default"
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // empty: all normal
  std::vector<float> scores;         // llama only
  std::vector<std::string> merges;   // gpt2 only: "left right"
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;  // absent: the model type's default
};

GgufTokenizerData read_gguf_tokenizer_data(const GgufFile& gguf);
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufTokenizerData& data);

}  // namespace tessera::tok
