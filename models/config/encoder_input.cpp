// models/config/encoder_input.cpp: the encoder input limit and truncation (see encoder_input.h).
#include "models/config/encoder_input.h"

#include <sstream>

#include "models/tokenizer/tokenizer.h"

namespace tessera {

EncoderInputLimit encoder_input_limit(const ModelConfig& config) {
  const int64_t positions = config.max_position_embeddings;
  if (config.max_seq_length && (positions <= 0 || *config.max_seq_length <= positions)) {
    return {*config.max_seq_length, "max_seq_length"};
  }
  return {positions > 0 ? positions : 0, "max_position_embeddings"};
}

void truncate_tokens(std::vector<int32_t>& ids, int64_t limit, bool keep_last) {
  if (limit <= 0 || static_cast<int64_t>(ids.size()) <= limit) return;
  if (!keep_last || limit < 2) {
    ids.resize(static_cast<size_t>(limit));
    return;
  }
  const int32_t last = ids.back();
  ids.resize(static_cast<size_t>(limit - 1));
  ids.push_back(last);
}

std::string EncoderInputOverLimit::message(std::string_view remedy) const {
  std::ostringstream os;
  os << "input[" << index << "] has " << tokens << " tokens, over this model's limit of " << limit.tokens << " ("
     << limit.field << ")";
  if (!remedy.empty()) os << "; " << remedy;
  return os.str();
}

std::optional<EncoderInputOverLimit> fit_encoder_inputs(std::vector<std::vector<int32_t>>& inputs,
                                                        const EncoderInputLimit& limit, bool truncate,
                                                        const Tokenizer& tokenizer) {
  if (limit.tokens <= 0) return std::nullopt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int32_t>& ids = inputs[i];
    const int64_t n = static_cast<int64_t>(ids.size());
    if (n <= limit.tokens) continue;
    if (!truncate) return EncoderInputOverLimit{i, n, limit};
    // A text encoded with special tokens ends with the closing one ([SEP]); token-id inputs keep
    // their last id only when it is special too, so a plain id list is simply cut.
    truncate_tokens(ids, limit.tokens, tokenizer.is_special(ids.back()));
  }
  return std::nullopt;
}

}  // namespace tessera
