// models/config/model_config.h: ModelConfig, a model's hyper-parameters read from HF config.json
// or GGUF metadata and validated where it is built. Unknown architectures are rejected by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera {

class GgufFile;

enum class Architecture { kLlama, kMistral, kBert };
const char* architecture_name(Architecture arch);

struct RopeScaling {
  enum class Kind { kNone, kLlama3 };
  Kind kind = Kind::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

enum class Pooling { kNone, kMean, kCls };  // sentence-embedding pooling (BERT)
const char* pooling_name(Pooling pooling);   // "none", "mean", "cls"
const char* rope_scaling_name(RopeScaling::Kind kind);  // "none", "llama3"

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string source;  // file it was read from, for messages

  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // explicit when the file gives it; else hidden_size / num_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // context length
  double norm_eps = 1e-5;               // rms_norm_eps (decoders) or layer_norm_eps (BERT)

  // Decoders (Llama, Mistral)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  std::optional<int64_t> sliding_window;  // Mistral: q sees k when q - window < k <= q

  // Encoders (BERT)
  int64_t type_vocab_size = 0;
  std::string hidden_act;  // "gelu", "silu", ...
  Pooling pooling = Pooling::kNone;
  bool normalize_embeddings = false;
  // sentence-transformers' max_seq_length (sentence_bert_config.json), the length its encode()
  // truncates inputs to; unset when the folder has none. encoder_input_limit() turns it into the
  // limit every embedding path applies (models/config/encoder_input.h).
  std::optional<int64_t> max_seq_length;

  // Special tokens (-1 when absent)
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;

  // Throws tessera::Error naming the first invalid field and what was expected.
  void validate() const;
};

// From an HF config.json document. `source` names the file in errors.
ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& source);
// For BERT folders: reads sentence-transformers' modules.json and its Pooling module's
// config.json (mean / cls pooling; a Normalize module sets normalize_embeddings), and
// sentence_bert_config.json's max_seq_length (in the Transformer module's folder, the model folder
// when modules.json is absent). Missing files leave the config as it is. Throws naming the file
// for pooling modes or modules we do not implement and for a max_seq_length that is not a
// positive integer.
void apply_sentence_transformers(ModelConfig& config, const std::string& model_dir);
// From GGUF metadata ("general.architecture", "<arch>.block_count", ...).
ModelConfig model_config_from_gguf(const GgufFile& gguf);

}  // namespace tessera
