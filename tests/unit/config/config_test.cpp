// tests/unit/config/config_test.cpp: ModelConfig from HF config.json, sentence-transformers files
// and GGUF metadata; validation messages name the field and the expected value.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config/model_config.h"
#include "models/weights/gguf.h"
#include "tests/unit/weights/test_files.h"

namespace tessera {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << ::testing::PrintToString(parts);
  } catch (const Error& e) {
    for (const std::string& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

json smollm2_like() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000,
    "rope_scaling": null, "tie_word_embeddings": true, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": null
  })");
}

TEST(HfConfig, Llama) {
  const ModelConfig c = model_config_from_hf(smollm2_like(), "smol/config.json");
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.source, "smol/config.json");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c.pad_token_id, -1);
}

TEST(HfConfig, ExplicitHeadDimIsKept) {
  json j = smollm2_like();
  j["head_dim"] = 128;  // not hidden_size / num_heads = 64: kept as given
  EXPECT_EQ(model_config_from_hf(j, "c.json").head_dim, 128);
  j["head_dim"] = nullptr;  // null: derived
  EXPECT_EQ(model_config_from_hf(j, "c.json").head_dim, 64);
  j.erase("head_dim");
  j["hidden_size"] = 577;  // no head_dim and no even split
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"c.json", "hidden_size = 577", "num_attention_heads = 9"});
}

TEST(HfConfig, Llama3RopeScalingAndEosList) {
  json j = smollm2_like();
  j["rope_scaling"] = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
  j["eos_token_id"] = {128001, 128008, 128009};
  j["vocab_size"] = 128256;
  j["rope_theta"] = 500000.0;
  const ModelConfig c = model_config_from_hf(j, "l3.json");
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));

  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  expect_error([&] { model_config_from_hf(j, "l3.json"); }, {"l3.json", "original_max_position_embeddings"});
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { model_config_from_hf(j, "l3.json"); }, {"l3.json", "rope_scaling type 'yarn'", "llama3"});
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(model_config_from_hf(j, "l3.json").rope_scaling.kind, RopeScaling::Kind::kNone);

  // Newer configs: rope_parameters carries rope_theta and the scaling.
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  ModelConfig p = model_config_from_hf(j, "l3.json");
  EXPECT_EQ(p.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(p.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(p.rope_theta, 500000.0);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000.0}};
  p = model_config_from_hf(j, "l3.json");
  EXPECT_EQ(p.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_DOUBLE_EQ(p.rope_theta, 1000.0);
}

TEST(HfConfig, MistralSlidingWindow) {
  json j = smollm2_like();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = 16;
  ModelConfig c = model_config_from_hf(j, "m.json");
  EXPECT_EQ(c.arch, Architecture::kMistral);
  EXPECT_EQ(c.sliding_window, 16);
  j["sliding_window"] = nullptr;  // full attention
  EXPECT_FALSE(model_config_from_hf(j, "m.json").sliding_window.has_value());
  j.erase("sliding_window");  // transformers' MistralConfig default
  EXPECT_EQ(model_config_from_hf(j, "m.json").sliding_window, 4096);
  j["sliding_window"] = 0;
  expect_error([&] { model_config_from_hf(j, "m.json"); }, {"m.json", "sliding_window = 0", "positive"});
  // model_type alone is enough.
  j.erase("architectures");
  j["sliding_window"] = 32;
  EXPECT_EQ(model_config_from_hf(j, "m.json").arch, Architecture::kMistral);
}

TEST(HfConfig, UnsupportedArchitectureIsNamed) {
  json j = smollm2_like();
  j["architectures"] = {"GPTNeoXForCausalLM"};
  expect_error([&] { model_config_from_hf(j, "neox.json"); },
               {"neox.json", "unsupported architecture 'GPTNeoXForCausalLM'; supported: ", "LlamaForCausalLM",
                "MistralForCausalLM", "BertModel"});
  j.erase("architectures");
  j["model_type"] = "gpt_neox";
  expect_error([&] { model_config_from_hf(j, "neox.json"); }, {"unsupported model_type 'gpt_neox'"});
  j.erase("model_type");
  expect_error([&] { model_config_from_hf(j, "neox.json"); }, {"architectures", "model_type"});
}

TEST(HfConfig, FieldErrorsNameTheField) {
  json j = smollm2_like();
  j["num_hidden_layers"] = "30";
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"c.json", "'num_hidden_layers'", "integer"});
  j = smollm2_like();
  j.erase("vocab_size");
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"c.json", "missing", "'vocab_size'"});
  j = smollm2_like();
  j["num_key_value_heads"] = 4;
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"c.json", "num_kv_heads = 4", "divisor of num_heads = 9"});
  j = smollm2_like();
  j["rms_norm_eps"] = "small";
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"'rms_norm_eps'", "number"});
  j = smollm2_like();
  j["tie_word_embeddings"] = 1;
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"'tie_word_embeddings'", "true or false"});
  j = smollm2_like();
  j["eos_token_id"] = 60000;
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"eos_token_ids = 60000", "vocab_size = 49152"});
  j = smollm2_like();
  j["head_dim"] = 63;
  expect_error([&] { model_config_from_hf(j, "c.json"); }, {"head_dim = 63", "even"});
  expect_error([] { model_config_from_hf(json::array(), "c.json"); }, {"c.json", "object"});
}

TEST(Validate, NamesFieldAndExpectation) {
  ModelConfig c = model_config_from_hf(smollm2_like(), "c.json");
  c.vocab_size = 0;
  expect_error([&] { c.validate(); }, {"c.json", "vocab_size = 0", "positive"});
  c = model_config_from_hf(smollm2_like(), "c.json");
  c.norm_eps = 0;
  expect_error([&] { c.validate(); }, {"norm_eps = 0"});
  c = model_config_from_hf(smollm2_like(), "c.json");
  c.sliding_window = 8;  // llama has no window
  expect_error([&] { c.validate(); }, {"sliding_window = 8", "mistral"});
  c = model_config_from_hf(smollm2_like(), "c.json");
  c.rope_theta = -1;
  expect_error([&] { c.validate(); }, {"rope_theta = -1"});
}

json minilm() {
  return json::parse(R"({
    "architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
    "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
    "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
    "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522
  })");
}

TEST(HfConfig, Bert) {
  const ModelConfig c = model_config_from_hf(minilm(), "bert.json");
  EXPECT_EQ(c.arch, Architecture::kBert);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.hidden_size, 384);
  EXPECT_EQ(c.num_heads, 12);
  EXPECT_EQ(c.num_kv_heads, 12);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.type_vocab_size, 2);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-12);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.pooling, Pooling::kMean);
  EXPECT_FALSE(c.normalize_embeddings);
  json j = minilm();
  j["architectures"] = {"BertForMaskedLM"};
  EXPECT_EQ(model_config_from_hf(j, "bert.json").arch, Architecture::kBert);
  j["position_embedding_type"] = "relative_key";
  expect_error([&] { model_config_from_hf(j, "bert.json"); }, {"position_embedding_type 'relative_key'"});
}

TEST(SentenceTransformers, PoolingAndNormalize) {
  test::TempDir dir("st-modules");
  std::filesystem::create_directories(dir.path() / "1_Pooling");
  test::write_text(dir.path() / "modules.json", R"([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])");
  test::write_text(dir.path() / "1_Pooling" / "config.json",
                   R"({"word_embedding_dimension": 384, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true,
                       "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false})");
  ModelConfig c = model_config_from_hf(minilm(), "bert.json");
  apply_sentence_transformers(c, dir.path().string());
  EXPECT_EQ(c.pooling, Pooling::kMean);
  EXPECT_TRUE(c.normalize_embeddings);

  test::write_text(dir.path() / "1_Pooling" / "config.json", R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false})");
  test::write_text(dir.path() / "modules.json", R"([{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])");
  c = model_config_from_hf(minilm(), "bert.json");
  apply_sentence_transformers(c, dir.path().string());
  EXPECT_EQ(c.pooling, Pooling::kCls);
  EXPECT_FALSE(c.normalize_embeddings);

  test::write_text(dir.path() / "1_Pooling" / "config.json", R"({"pooling_mode_max_tokens": true})");
  expect_error([&] { apply_sentence_transformers(c, dir.path().string()); }, {"1_Pooling", "pooling_mode_max_tokens"});
  test::write_text(dir.path() / "modules.json", R"([{"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])");
  expect_error([&] { apply_sentence_transformers(c, dir.path().string()); }, {"modules.json", "sentence_transformers.models.Dense"});
  test::write_text(dir.path() / "modules.json", "[{");
  expect_error([&] { apply_sentence_transformers(c, dir.path().string()); }, {"modules.json", "bad JSON"});
  std::filesystem::remove(dir.path() / "modules.json");
  c = model_config_from_hf(minilm(), "bert.json");
  apply_sentence_transformers(c, dir.path().string());  // no sentence-transformers files: unchanged
  EXPECT_EQ(c.pooling, Pooling::kMean);
}

// ---------------------------------------------------------------------------------------------
// GGUF metadata

test::GgufBuilder llama_gguf(bool with_vocab_size, bool with_output) {
  test::GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_u32("llama.block_count", 2);
  b.add_u32("llama.context_length", 2048);
  b.add_u32("llama.embedding_length", 64);
  b.add_u32("llama.feed_forward_length", 128);
  b.add_u32("llama.attention.head_count", 4);
  b.add_u32("llama.attention.head_count_kv", 2);
  b.add_f32("llama.rope.freq_base", 500000.0f);
  b.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  b.add_u32("llama.rope.dimension_count", 16);
  if (with_vocab_size) b.add_u32("llama.vocab_size", 8);
  b.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "c"});
  b.add_u32("tokenizer.ggml.bos_token_id", 1);
  b.add_u32("tokenizer.ggml.eos_token_id", 2);
  b.add_tensor({"token_embd.weight", {64, 6}, test::kGgmlF32, test::Bytes(64 * 6 * 4)});
  if (with_output) b.add_tensor({"output.weight", {64, 6}, test::kGgmlF32, test::Bytes(64 * 6 * 4)});
  return b;
}

TEST(GgufConfig, Llama) {
  const GgufFile f = GgufFile::parse(test::share(llama_gguf(true, false).build()), "tiny.gguf");
  const ModelConfig c = model_config_from_gguf(f);
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.source, "tiny.gguf");
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 8);  // llama.vocab_size wins over the token count
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.norm_eps, 1e-5);  // float32 metadata reads as its decimal value
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
}

TEST(GgufConfig, VocabFromTokensAndUntiedOutput) {
  const GgufFile f = GgufFile::parse(test::share(llama_gguf(false, true).build()), "tiny.gguf");
  const ModelConfig c = model_config_from_gguf(f);
  EXPECT_EQ(c.vocab_size, 6);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(GgufConfig, ErrorsNameTheKey) {
  test::GgufBuilder gpt2;
  gpt2.add_string("general.architecture", "gpt2");
  expect_error([&] { model_config_from_gguf(GgufFile::parse(test::share(gpt2.build()), "g.gguf")); },
               {"g.gguf", "unsupported architecture 'gpt2'", "supported: llama"});
  test::GgufBuilder partial;
  partial.add_string("general.architecture", "llama");
  partial.add_u32("llama.block_count", 2);
  expect_error([&] { model_config_from_gguf(GgufFile::parse(test::share(partial.build()), "p.gguf")); },
               {"p.gguf", "'llama.embedding_length'", "missing"});
  test::GgufBuilder b = llama_gguf(true, false);
  b.add_u32("llama.attention.key_length", 32);  // rope dims 16 != head dim 32
  expect_error([&] { model_config_from_gguf(GgufFile::parse(test::share(b.build()), "r.gguf")); },
               {"r.gguf", "rope.dimension_count = 16", "32"});
  test::GgufBuilder kv = llama_gguf(true, false);
  kv.add_string("llama.attention.head_count_kv", "two");  // duplicate key is caught first
  EXPECT_THROW(GgufFile::parse(test::share(kv.build()), "kv.gguf"), Error);
}

}  // namespace
}  // namespace tessera
