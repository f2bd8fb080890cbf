// models/config/encoder_input.h: the one input-length rule of encoder (embedding) models, shared by
// `tessera embed`, /v1/embeddings and gRPC Embed so that a text embeds the same everywhere:
//  - the limit is sentence-transformers' max_seq_length when the model folder gives one (what
//    SentenceTransformer.encode truncates to), else max_position_embeddings;
//  - an input over the limit is truncated to it as HF tokenizers do (the text tokens are cut, the
//    closing special token [SEP] stays), or, when the caller asked for no truncation, refused with a
//    message naming the input, its token count and the limit.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/config/model_config.h"

namespace tessera {

class Tokenizer;

struct EncoderInputLimit {
  int64_t tokens = 0;      // most tokens one input may have, special tokens included; 0: no limit known
  std::string field;       // the config field it comes from: "max_seq_length" or "max_position_embeddings"
  bool operator==(const EncoderInputLimit&) const = default;
};

// max_seq_length when set, capped by max_position_embeddings (a position past the table has no
// embedding, so a larger max_seq_length cannot be honoured); else max_position_embeddings.
EncoderInputLimit encoder_input_limit(const ModelConfig& config);

// Cuts ids to `limit` tokens. With keep_last (the input ends with a special token, e.g. [SEP]) the
// last token is kept and the ones before it are cut, as HF tokenizers' truncation does for an input
// encoded with special tokens. Inputs of `limit` tokens or fewer, and limit <= 0, are left alone.
// limit 1 keeps only the first token (no room for text between [CLS] and [SEP]).
void truncate_tokens(std::vector<int32_t>& ids, int64_t limit, bool keep_last);

// An input over the limit when truncation was not asked for.
struct EncoderInputOverLimit {
  size_t index = 0;    // which input
  int64_t tokens = 0;  // how many tokens it has
  EncoderInputLimit limit;
  // "input[2] has 300 tokens, over this model's limit of 256 (max_seq_length); " + remedy
  std::string message(std::string_view remedy) const;
};

// Fits every input to `limit`. With truncate, cuts each longer input with truncate_tokens, keeping
// its last token when tokenizer.is_special says it is special, and returns nullopt. Without, changes
// nothing and returns the first input over the limit (nullopt when all fit).
std::optional<EncoderInputOverLimit> fit_encoder_inputs(std::vector<std::vector<int32_t>>& inputs,
                                                        const EncoderInputLimit& limit, bool truncate,
                                                        const Tokenizer& tokenizer);

}  // namespace tessera
