// tests/unit/weights/tensor_names_test.cpp: the tensor name table (models/tensor_names.h): HF names per
// architecture, GGUF -> HF names, and the tiny checkpoints' tensors against the table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/error.h"
#include "models/model_files.h"
#include "models/tensor_names.h"
#include "tests/error_of.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using enum TensorKind;

TEST(TensorNames, LlamaAndMistralShareHfNames) {
  for (Architecture arch : {Architecture::kLlama, Architecture::kMistral}) {
    const TensorNames names(arch);
    EXPECT_EQ(names.weight(kTokenEmbedding), "model.embed_tokens.weight");
    EXPECT_EQ(names.weight(kAttnQ, 3), "model.layers.3.self_attn.q_proj.weight");
    EXPECT_EQ(names.bias(kAttnV, 0), "model.layers.0.self_attn.v_proj.bias");
    EXPECT_EQ(names.weight(kFfnNorm, 12), "model.layers.12.post_attention_layernorm.weight");
    EXPECT_EQ(names.weight(kOutputNorm), "model.norm.weight");
    EXPECT_EQ(names.weight(kOutput), "lm_head.weight");
  }
}

TEST(TensorNames, BertNamesTakeThePrefix) {
  EXPECT_EQ(TensorNames(Architecture::kBert).weight(kTokenEmbedding), "embeddings.word_embeddings.weight");
  const TensorNames nested(Architecture::kBert, "bert.");
  EXPECT_EQ(nested.bias(kEmbeddingNorm), "bert.embeddings.LayerNorm.bias");
  EXPECT_EQ(nested.weight(kAttnOutNorm, 2), "bert.encoder.layer.2.attention.output.LayerNorm.weight");
  EXPECT_EQ(nested.bias(kFfnUp, 0), "bert.encoder.layer.0.intermediate.dense.bias");
  EXPECT_EQ(nested.weight(kLayerOutNorm, 5), "bert.encoder.layer.5.output.LayerNorm.weight");
}

TEST(TensorNames, RejectsWhatTheTableDoesNotHold) {
  EXPECT_THAT(error_of([] { TensorNames(Architecture::kLlama).weight(kAttnQ); }), HasSubstr("needs a layer index"));
  EXPECT_THAT(error_of([] { TensorNames(Architecture::kLlama).bias(kAttnNorm, 0); }),
              HasSubstr("has no model.layers.{L}.input_layernorm.bias"));
  EXPECT_THAT(error_of([] { TensorNames(Architecture::kBert).weight(kFfnGate, 0); }), HasSubstr("a bert model has no"));
}

TEST(TensorNames, MapsLlamaGgufNamesToHf) {
  EXPECT_EQ(gguf_to_hf_tensor_name("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.12.attn_norm.weight"), "model.layers.12.input_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.attn_q.weight"), "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.attn_q.bias"), "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.attn_k.weight"), "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.attn_v.weight"), "model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.3.attn_output.weight"), "model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.3.ffn_norm.weight"), "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.3.ffn_gate.weight"), "model.layers.3.mlp.gate_proj.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.3.ffn_up.weight"), "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.3.ffn_down.weight"), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("rope_freqs.weight"), "rope_freqs.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.x.attn_q.weight"), "blk.x.attn_q.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk..attn_q.weight"), "blk..attn_q.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.1.ffn_gate_exps.weight"), "blk.1.ffn_gate_exps.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.1.attn_q"), "blk.1.attn_q");
}

// Every tensor of the tiny HF checkpoints is named by the table, and each holds every tensor the
// table marks required.
TEST(TensorNames, TableCoversTheTinyCheckpoints) {
  for (const char* fixture : {"tiny-llama", "tiny-mistral", "tiny-bert"}) {
    SCOPED_TRACE(fixture);
    const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/" + fixture);
    const ModelConfig config = load_model_config(files);
    const WeightStore store = load_weights(files);
    const TensorNames names(config.arch);
    std::set<std::string> named;
    for (const TensorNameRow& row : tensor_table::kRows) {
      if (row.arch != table_architecture(config.arch)) continue;
      const bool per_layer = std::string(row.hf).find("{L}") != std::string::npos;
      for (int64_t layer = 0; layer < (per_layer ? config.num_layers : 1); ++layer) {
        for (TensorPart part : {TensorPart::kWeight, TensorPart::kBias}) {
          const Presence presence = row.presence(part);
          if (presence == Presence::kAbsent) continue;
          const std::string name = names.name(row.kind, part, per_layer ? layer : -1);
          named.insert(name);
          EXPECT_TRUE(presence != Presence::kRequired || store.contains(name)) << name << " is required";
        }
      }
    }
    for (const std::string& name : store.names()) EXPECT_TRUE(named.count(name) != 0) << name << " is not in the table";
  }
}

}  // namespace
}  // namespace tessera
