// models/bert.h: the BERT encoder (all-MiniLM-L6-v2 and kin): hyper-parameters, tensors (names from
// one table), forward graph. Absolute positions, token types, post-LN, GELU, pooling (mean/CLS) and
// optional L2 normalisation as sentence-transformers configures them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend/backend.h"
#include "models/config/model_config.h"
#include "models/llama.h"  // TensorName, tensor_name
#include "models/model.h"
#include "models/weights/weight_store.h"

namespace tessera {

// --- hyper-parameters ---
struct BertHyperParams {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 0;  // 0: the checkpoint has no token-type embeddings
  float layer_norm_eps = 1e-12f;
  Pooling pooling = Pooling::kMean;  // kNone in the config means mean (sentence-transformers' default)
  bool normalize = false;

  // Throws tessera::Error naming the field when the config cannot describe a BERT graph.
  static BertHyperParams from_config(const ModelConfig& config);
};

// --- tensors --- (names relative to an optional "bert." prefix, detected at load)
inline constexpr TensorName kBertWordEmbedding{"embeddings.word_embeddings.weight", true};          // [vocab, hidden]
inline constexpr TensorName kBertPositionEmbedding{"embeddings.position_embeddings.weight", true};  // [max_pos, hidden]
inline constexpr TensorName kBertTokenTypeEmbedding{"embeddings.token_type_embeddings.weight", false};  // [types, hidden]
inline constexpr TensorName kBertEmbeddingNormW{"embeddings.LayerNorm.weight", true};  // [hidden]
inline constexpr TensorName kBertEmbeddingNormB{"embeddings.LayerNorm.bias", true};    // [hidden]
inline constexpr TensorName kBertQueryW{"encoder.layer.{L}.attention.self.query.weight", true};  // [hidden, hidden]
inline constexpr TensorName kBertQueryB{"encoder.layer.{L}.attention.self.query.bias", true};    // [hidden]
inline constexpr TensorName kBertKeyW{"encoder.layer.{L}.attention.self.key.weight", true};      // [hidden, hidden]
inline constexpr TensorName kBertKeyB{"encoder.layer.{L}.attention.self.key.bias", true};        // [hidden]
inline constexpr TensorName kBertValueW{"encoder.layer.{L}.attention.self.value.weight", true};  // [hidden, hidden]
inline constexpr TensorName kBertValueB{"encoder.layer.{L}.attention.self.value.bias", true};    // [hidden]
inline constexpr TensorName kBertAttnOutW{"encoder.layer.{L}.attention.output.dense.weight", true};  // [hidden, hidden]
inline constexpr TensorName kBertAttnOutB{"encoder.layer.{L}.attention.output.dense.bias", true};    // [hidden]
inline constexpr TensorName kBertAttnNormW{"encoder.layer.{L}.attention.output.LayerNorm.weight", true};  // [hidden]
inline constexpr TensorName kBertAttnNormB{"encoder.layer.{L}.attention.output.LayerNorm.bias", true};    // [hidden]
inline constexpr TensorName kBertInterW{"encoder.layer.{L}.intermediate.dense.weight", true};  // [intermediate, hidden]
inline constexpr TensorName kBertInterB{"encoder.layer.{L}.intermediate.dense.bias", true};    // [intermediate]
inline constexpr TensorName kBertOutW{"encoder.layer.{L}.output.dense.weight", true};          // [hidden, intermediate]
inline constexpr TensorName kBertOutB{"encoder.layer.{L}.output.dense.bias", true};            // [hidden]
inline constexpr TensorName kBertOutNormW{"encoder.layer.{L}.output.LayerNorm.weight", true};  // [hidden]
inline constexpr TensorName kBertOutNormB{"encoder.layer.{L}.output.LayerNorm.bias", true};    // [hidden]

struct BertLayerWeights {
  Tensor qkv;           // [3 * hidden, hidden]: query | key | value, fused at load
  Tensor qkv_bias;      // [3 * hidden]
  Tensor attn_out;      // [hidden, hidden]
  Tensor attn_out_bias; // [hidden]
  Tensor attn_norm_w;   // [hidden]
  Tensor attn_norm_b;   // [hidden]
  Tensor inter;         // [intermediate, hidden]
  Tensor inter_bias;    // [intermediate]
  Tensor out;           // [hidden, intermediate]
  Tensor out_bias;      // [hidden]
  Tensor out_norm_w;    // [hidden]
  Tensor out_norm_b;    // [hidden]
};

struct BertWeights {
  Tensor word_embedding;        // [vocab, hidden]
  Tensor position_embedding;    // [max_pos, hidden]
  Tensor token_type_embedding;  // [types, hidden] or undefined
  Tensor embedding_norm_w;      // [hidden]
  Tensor embedding_norm_b;      // [hidden]
  std::vector<BertLayerWeights> layers;

  static BertWeights load(const BertHyperParams& hp, const WeightStore& store, Backend& backend);
};

// --- graph ---
class BertModel final : public Encoder {
 public:
  BertModel(ModelConfig config, const WeightStore& store, Backend& backend);

  const ModelConfig& config() const override { return config_; }
  const BertHyperParams& hyper_params() const { return hp_; }
  Tensor encode(const ForwardBatch& batch, const TensorObserver* observer = nullptr) override;
  Tensor embed(const ForwardBatch& batch, const TensorObserver* observer = nullptr) override;

 private:
  ModelConfig config_;
  BertHyperParams hp_;
  Backend& backend_;
  BertWeights weights_;
};

}  // namespace tessera
