// models/bert.h: the BERT encoder (all-MiniLM-L6-v2 and kin): hyper-parameters, tensors (named by
// models/tensor_names.h), forward graph. Absolute positions, token types, post-LN, GELU, pooling
// (mean/CLS) and optional L2 normalisation as sentence-transformers configures them.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend/backend.h"
#include "models/config/model_config.h"
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

// --- tensors --- (names: models/tensor_names.h)
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
  // position_embedding + token_type_embedding[0], made at load: the table a forward with no token
  // types reads (undefined when the checkpoint has no token types).
  Tensor position_with_type0;   // [max_pos, hidden]
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
