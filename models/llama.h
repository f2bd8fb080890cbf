// models/llama.h: the Llama architecture (SmolLM2, TinyLlama, Llama-2/3): hyper-parameters, tensors
// (names from one table), forward graph. GQA, rope_theta, llama3 rope_scaling, tied embeddings.
// Mistral (models/mistral.h) reuses these tensors and this graph.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend/backend.h"
#include "models/config/model_config.h"
#include "models/graph_options.h"
#include "models/model.h"
#include "models/weights/weight_store.h"

namespace tessera {

// --- hyper-parameters ---
struct LlamaHyperParams {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;  // GQA: divides num_heads
  int32_t head_dim = 0;
  int64_t vocab_size = 0;
  float rms_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;

  // Throws tessera::Error naming the field when the config cannot describe a Llama graph.
  static LlamaHyperParams from_config(const ModelConfig& config);
};

// --- tensors ---
// One row of the tensor table: HF name with "{L}" for the layer index.
struct TensorName {
  const char* pattern;
  bool required;
};
inline constexpr TensorName kLlamaTokenEmbedding{"model.embed_tokens.weight", true};      // [vocab, hidden]
inline constexpr TensorName kLlamaAttnNorm{"model.layers.{L}.input_layernorm.weight", true};  // [hidden]
inline constexpr TensorName kLlamaQProj{"model.layers.{L}.self_attn.q_proj.weight", true};    // [heads*head_dim, hidden]
inline constexpr TensorName kLlamaKProj{"model.layers.{L}.self_attn.k_proj.weight", true};    // [kv_heads*head_dim, hidden]
inline constexpr TensorName kLlamaVProj{"model.layers.{L}.self_attn.v_proj.weight", true};    // [kv_heads*head_dim, hidden]
inline constexpr TensorName kLlamaQBias{"model.layers.{L}.self_attn.q_proj.bias", false};     // [heads*head_dim]
inline constexpr TensorName kLlamaKBias{"model.layers.{L}.self_attn.k_proj.bias", false};     // [kv_heads*head_dim]
inline constexpr TensorName kLlamaVBias{"model.layers.{L}.self_attn.v_proj.bias", false};     // [kv_heads*head_dim]
inline constexpr TensorName kLlamaOProj{"model.layers.{L}.self_attn.o_proj.weight", true};    // [hidden, heads*head_dim]
inline constexpr TensorName kLlamaMlpNorm{"model.layers.{L}.post_attention_layernorm.weight", true};  // [hidden]
inline constexpr TensorName kLlamaGateProj{"model.layers.{L}.mlp.gate_proj.weight", true};    // [intermediate, hidden]
inline constexpr TensorName kLlamaUpProj{"model.layers.{L}.mlp.up_proj.weight", true};        // [intermediate, hidden]
inline constexpr TensorName kLlamaDownProj{"model.layers.{L}.mlp.down_proj.weight", true};    // [hidden, intermediate]
inline constexpr TensorName kLlamaFinalNorm{"model.norm.weight", true};                       // [hidden]
inline constexpr TensorName kLlamaLmHead{"lm_head.weight", false};  // [vocab, hidden]; absent when tied

// "model.layers.{L}.x" -> "model.layers.3.x".
std::string tensor_name(const TensorName& name, int64_t layer = -1);

// The store's named weights handed to the backend as plain views (shared by every graph).
// `use`: kLinear for a layer's projection matrices (the backend may quantize them), kOther for
// embeddings, the lm_head, norms and biases (Backend::load_weight).
Tensor load_weight(Backend& backend, const WeightStore& store, const std::string& name, std::vector<int64_t> shape,
                   WeightUse use);
Tensor load_stacked(Backend& backend, const WeightStore& store, std::span<const std::string> names,
                    std::span<const std::vector<int64_t>> shapes, std::string fused_name, WeightUse use);

struct LlamaLayerWeights {
  Tensor attn_norm;  // [hidden]
  Tensor qkv;        // [(heads + 2*kv_heads) * head_dim, hidden]: q_proj | k_proj | v_proj, fused at load
  Tensor qkv_bias;   // [(heads + 2*kv_heads) * head_dim] or undefined
  // With GraphOptions::fuse_qkv off, instead of qkv (the bias stays fused: it is added after the join):
  Tensor q_proj;     // [heads * head_dim, hidden]
  Tensor k_proj;     // [kv_heads * head_dim, hidden]
  Tensor v_proj;     // [kv_heads * head_dim, hidden]
  Tensor o_proj;     // [hidden, heads * head_dim]
  Tensor mlp_norm;   // [hidden]
  Tensor gate_up;    // [2 * intermediate, hidden]: gate_proj | up_proj, fused at load (with
                     // GraphOptions::gate_up_epilogue, in the backend's row order for linear_silu_mul)
  // With GraphOptions::fuse_gate_up off, instead of gate_up:
  Tensor gate_proj;  // [intermediate, hidden]
  Tensor up_proj;    // [intermediate, hidden]
  Tensor down;       // [hidden, intermediate]
};

struct LlamaWeights {
  Tensor token_embedding;  // [vocab, hidden]
  std::vector<LlamaLayerWeights> layers;
  Tensor final_norm;     // [hidden]
  Tensor lm_head;        // [vocab, hidden]; shares token_embedding's buffer when tied
  Tensor rope_inv_freq;  // [head_dim / 2], llama3 scaling applied

  static LlamaWeights load(const LlamaHyperParams& hp, const WeightStore& store, Backend& backend,
                           const GraphOptions& options = {});
};

// --- graph ---
class LlamaModel : public CausalLm {
 public:
  LlamaModel(ModelConfig config, const WeightStore& store, Backend& backend, const GraphOptions& options = {});
  const GraphOptions& graph_options() const { return options_; }

  const ModelConfig& config() const override { return config_; }
  const LlamaHyperParams& hyper_params() const { return hp_; }
  Tensor forward(const ForwardBatch& batch, KvCacheStorage* cache, std::span<const int32_t> logit_rows,
                 const TensorObserver* observer = nullptr) override;
  void copy_kv(KvCacheStorage& cache, std::span<const int32_t> src_slots, std::span<const int32_t> dst_slots,
               std::span<const int32_t> rotate_by) override {
    backend_.copy_kv_rows(cache, src_slots, dst_slots, rotate_by, weights_.rope_inv_freq);
  }

 protected:
  ModelConfig config_;
  LlamaHyperParams hp_;
  Backend& backend_;
  GraphOptions options_;
  LlamaWeights weights_;

 private:
  // residual += x; x = rmsnorm(residual) * w: one op, or two with the fusion off.
  void add_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps);
};

}  // namespace tessera
