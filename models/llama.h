// models/llama.h: the Llama architecture (SmolLM2, TinyLlama, Llama-2/3): hyper-parameters, tensors
// (named by models/tensor_names.h), forward graph. GQA, rope_theta, llama3 rope_scaling, tied
// embeddings. Mistral (models/mistral.h) reuses these tensors and this graph.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/backend/backend.h"
#include "models/config/model_config.h"
#include "models/graph_options.h"
#include "models/model.h"
#include "models/tensor_shard.h"
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
  // What one rank of `shard` computes: its heads, KV heads and FFN columns. Throws naming the counts
  // when one does not divide by the group's size (a KV head is never replicated: a model whose KV
  // heads do not split runs on fewer ranks).
  LlamaHyperParams sharded(const TensorShard& shard) const;
};

// --- tensors --- (names: models/tensor_names.h)
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
  Tensor lm_head;        // [vocab, hidden], or this rank's rows of it (lm_head_shard); shares
                         // token_embedding's buffer when tied and whole
  Tensor rope_inv_freq;  // [head_dim / 2], llama3 scaling applied

  // `hp`: the whole model's; each layer's projections are loaded as `shard`'s part of them (q, k, v,
  // gate and up by output rows, o_proj and down by input columns), the lm_head as
  // lm_head_shard's rows, everything else whole.
  static LlamaWeights load(const LlamaHyperParams& hp, const WeightStore& store, Backend& backend,
                           const GraphOptions& options = {}, const TensorShard& shard = {});
};

// The part of the lm_head's rows (the vocabulary) one rank computes logits for: `shard` where
// GraphOptions::split_lm_head is on and the vocabulary divides by the ranks, else the whole.
TensorShard lm_head_shard(const LlamaHyperParams& hp, const GraphOptions& options, const TensorShard& shard);

// --- graph ---
class LlamaModel : public CausalLm {
 public:
  LlamaModel(ModelConfig config, const WeightStore& store, Backend& backend, const GraphOptions& options = {});
  const GraphOptions& graph_options() const { return options_; }

  const ModelConfig& config() const override { return config_; }
  // This rank's: its heads and FFN columns when the backend is one rank of a tensor-parallel group.
  const LlamaHyperParams& hyper_params() const { return hp_; }
  int64_t cache_kv_heads() const override { return hp_.num_kv_heads; }
  Tensor forward(const ForwardBatch& batch, KvCacheStorage* cache, std::span<const int32_t> logit_rows,
                 const TensorObserver* observer = nullptr) override;
  void copy_kv(KvCacheStorage& cache, std::span<const int32_t> src_slots, std::span<const int32_t> dst_slots,
               std::span<const int32_t> rotate_by) override {
    backend_.copy_kv_rows(cache, src_slots, dst_slots, rotate_by, weights_.rope_inv_freq);
  }

 protected:
  ModelConfig config_;
  TensorShard shard_;
  LlamaHyperParams hp_;
  TensorShard lm_head_shard_;
  Backend& backend_;
  GraphOptions options_;
  LlamaWeights weights_;

 private:
  // residual += x; x = rmsnorm(residual) * w: one op, or two with the fusion off. On one rank of a
  // tensor-parallel group x is a row-split projection's partial sum: it is all-reduced first (in
  // the same op where the backend fuses them).
  void add_norm(Tensor& x, Tensor& residual, const Tensor& w, float eps);
  // [rows, vocab] logits of the final-normed hidden rows: this rank's slice of the vocabulary
  // gathered with the others' where the lm_head is split.
  Tensor logits_of(const Tensor& hidden);
};

}  // namespace tessera
