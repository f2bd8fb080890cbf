// models/tensor_names.h: every architecture's tensor names, in one table (as llama.cpp's LLM_TN in
// src/llama-arch.h). A row gives a kind of tensor its Hugging Face name and its GGUF name ("{L}" for the
// layer index, ".weight" / ".bias" appended) and says whether a checkpoint must hold its weight and its
// bias. The graphs, the GGUF reader and the tools that write weights all name tensors through it.
#pragma once

#include <cstdint>
#include <string>

#include "models/config/model_config.h"

namespace tessera {

// What a tensor does in the graph, after llama.cpp's LLM_TENSOR_*. One kind covers a weight and its bias.
enum class TensorKind {
  kTokenEmbedding,      // [vocab, hidden]
  kPositionEmbedding,   // [max_positions, hidden]: learned absolute positions
  kTokenTypeEmbedding,  // [types, hidden]
  kEmbeddingNorm,       // [hidden]: the norm of the summed embeddings
  kAttnNorm,            // [hidden]: the norm before attention
  kAttnQ,               // [heads * head_dim, hidden]
  kAttnK,               // [kv_heads * head_dim, hidden]
  kAttnV,               // [kv_heads * head_dim, hidden]
  kAttnOut,             // [hidden, heads * head_dim]
  kAttnOutNorm,         // [hidden]: a post-LN encoder's norm after attention
  kFfnNorm,             // [hidden]: the norm before the MLP
  kFfnGate,             // [intermediate, hidden]
  kFfnUp,               // [intermediate, hidden]
  kFfnDown,             // [hidden, intermediate]
  kLayerOutNorm,        // [hidden]: a post-LN encoder's norm after the MLP
  kOutputNorm,          // [hidden]: the norm before the lm_head
  kOutput,              // [vocab, hidden]: the lm_head
};

enum class TensorPart { kWeight, kBias };
enum class Presence { kAbsent, kRequired, kOptional };

struct TensorNameRow {
  Architecture arch;
  TensorKind kind;
  const char* hf;    // "model.layers.{L}.self_attn.q_proj"
  const char* gguf;  // "blk.{L}.attn_q"; nullptr where no GGUF of the architecture is read
  Presence weight;
  Presence bias;

  constexpr Presence presence(TensorPart part) const { return part == TensorPart::kWeight ? weight : bias; }
};

namespace tensor_table {
using enum TensorKind;
using enum Presence;
inline constexpr Architecture kLlama = Architecture::kLlama;
inline constexpr Architecture kBert = Architecture::kBert;

// Mistral has no rows of its own (table_architecture). Llama's lm_head is absent when the
// config ties it to the embedding, and only some checkpoints have q/k/v biases. BERT's names are
// relative to an optional "bert." prefix (TensorNames' prefix).
inline constexpr TensorNameRow kRows[] = {
    {kLlama, kTokenEmbedding, "model.embed_tokens", "token_embd", kRequired, kAbsent},
    {kLlama, kAttnNorm, "model.layers.{L}.input_layernorm", "blk.{L}.attn_norm", kRequired, kAbsent},
    {kLlama, kAttnQ, "model.layers.{L}.self_attn.q_proj", "blk.{L}.attn_q", kRequired, kOptional},
    {kLlama, kAttnK, "model.layers.{L}.self_attn.k_proj", "blk.{L}.attn_k", kRequired, kOptional},
    {kLlama, kAttnV, "model.layers.{L}.self_attn.v_proj", "blk.{L}.attn_v", kRequired, kOptional},
    {kLlama, kAttnOut, "model.layers.{L}.self_attn.o_proj", "blk.{L}.attn_output", kRequired, kAbsent},
    {kLlama, kFfnNorm, "model.layers.{L}.post_attention_layernorm", "blk.{L}.ffn_norm", kRequired, kAbsent},
    {kLlama, kFfnGate, "model.layers.{L}.mlp.gate_proj", "blk.{L}.ffn_gate", kRequired, kAbsent},
    {kLlama, kFfnUp, "model.layers.{L}.mlp.up_proj", "blk.{L}.ffn_up", kRequired, kAbsent},
    {kLlama, kFfnDown, "model.layers.{L}.mlp.down_proj", "blk.{L}.ffn_down", kRequired, kAbsent},
    {kLlama, kOutputNorm, "model.norm", "output_norm", kRequired, kAbsent},
    {kLlama, kOutput, "lm_head", "output", kOptional, kAbsent},

    {kBert, kTokenEmbedding, "embeddings.word_embeddings", nullptr, kRequired, kAbsent},
    {kBert, kPositionEmbedding, "embeddings.position_embeddings", nullptr, kRequired, kAbsent},
    {kBert, kTokenTypeEmbedding, "embeddings.token_type_embeddings", nullptr, kOptional, kAbsent},
    {kBert, kEmbeddingNorm, "embeddings.LayerNorm", nullptr, kRequired, kRequired},
    {kBert, kAttnQ, "encoder.layer.{L}.attention.self.query", nullptr, kRequired, kRequired},
    {kBert, kAttnK, "encoder.layer.{L}.attention.self.key", nullptr, kRequired, kRequired},
    {kBert, kAttnV, "encoder.layer.{L}.attention.self.value", nullptr, kRequired, kRequired},
    {kBert, kAttnOut, "encoder.layer.{L}.attention.output.dense", nullptr, kRequired, kRequired},
    {kBert, kAttnOutNorm, "encoder.layer.{L}.attention.output.LayerNorm", nullptr, kRequired, kRequired},
    {kBert, kFfnUp, "encoder.layer.{L}.intermediate.dense", nullptr, kRequired, kRequired},
    {kBert, kFfnDown, "encoder.layer.{L}.output.dense", nullptr, kRequired, kRequired},
    {kBert, kLayerOutNorm, "encoder.layer.{L}.output.LayerNorm", nullptr, kRequired, kRequired},
};
}  // namespace tensor_table

// The architecture whose rows name `arch`'s tensors: Mistral's checkpoints use Llama's names.
constexpr Architecture table_architecture(Architecture arch) {
  return arch == Architecture::kMistral ? Architecture::kLlama : arch;
}

// The row of `kind` for `arch`'s table architecture. Throws tessera::Error when there is none.
const TensorNameRow& tensor_name_row(Architecture arch, TensorKind kind);

// One architecture's names, as llama.cpp's LLM_TN(arch): for Llama, weight(TensorKind::kAttnQ, 3) is
// "model.layers.3.self_attn.q_proj.weight".
class TensorNames {
 public:
  // `prefix` goes before every name: BertForX checkpoints nest the encoder under "bert.".
  explicit TensorNames(Architecture arch, std::string prefix = {});

  // Throw tessera::Error when the architecture has no such tensor or a per-layer name gets no layer.
  std::string name(TensorKind kind, TensorPart part, int64_t layer = -1) const;
  std::string weight(TensorKind kind, int64_t layer = -1) const { return name(kind, TensorPart::kWeight, layer); }
  std::string bias(TensorKind kind, int64_t layer = -1) const { return name(kind, TensorPart::kBias, layer); }

 private:
  Architecture arch_;
  std::string prefix_;
};

// The HF name of a llama-architecture GGUF tensor by the table (token_embd.weight ->
// model.embed_tokens.weight, blk.N.attn_q.weight -> model.layers.N.self_attn.q_proj.weight, ...);
// names the table does not hold are returned unchanged.
std::string gguf_to_hf_tensor_name(const std::string& gguf_name);

}  // namespace tessera
