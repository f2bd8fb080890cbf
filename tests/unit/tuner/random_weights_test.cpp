// tests/unit/tuner/random_weights_test.cpp: `tessera tune --random-weights` draws exactly the tensors a
// real checkpoint of the config holds (names, shapes), in bf16, the same for a seed, with the stated
// distribution, and a model loads from them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/backend/cpu/cpu_backend.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "tuner/random_weights.h"
#include "tuner/space.h"

namespace tessera::tuner {
namespace {

const std::string kFixtures = TESSERA_GOLDEN_FIXTURES;

float bf16_value(const std::byte* at) {
  uint16_t half;
  std::memcpy(&half, at, sizeof half);
  const uint32_t bits = static_cast<uint32_t>(half) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

TEST(RandomWeights, HoldTheCheckpointsTensorsInBf16) {
  for (const char* name : {"tiny-llama", "tiny-mistral"}) {
    const ModelFiles files = locate_model(kFixtures + "/" + name);
    const ModelConfig config = load_model_config(files);
    const WeightStore real = load_weights(files);
    const WeightStore drawn = random_llama_weights(config, 1);
    EXPECT_EQ(drawn.names(), real.names()) << name;
    for (const std::string& tensor : drawn.names()) {
      EXPECT_EQ(drawn.get(tensor).shape, real.get(tensor).shape) << tensor;
      EXPECT_EQ(drawn.get(tensor).dtype, DType::kBF16) << tensor;
      EXPECT_EQ(drawn.get(tensor).bytes.size(), static_cast<size_t>(drawn.get(tensor).numel()) * 2) << tensor;
    }
  }
}

TEST(RandomWeights, SameForASeedAndOtherForAnother) {
  const ModelConfig config = load_model_config(locate_model(kFixtures + "/tiny-llama"));
  const WeightStore a = random_llama_weights(config, 7), b = random_llama_weights(config, 7);
  const WeightStore c = random_llama_weights(config, 8);
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  ASSERT_EQ(a.get(q).bytes.size(), b.get(q).bytes.size());
  EXPECT_EQ(std::memcmp(a.get(q).bytes.data(), b.get(q).bytes.data(), a.get(q).bytes.size()), 0);
  EXPECT_NE(std::memcmp(a.get(q).bytes.data(), c.get(q).bytes.data(), a.get(q).bytes.size()), 0);
  // Two tensors of one shape are not copies of each other.
  const std::string k = "model.layers.1.self_attn.k_proj.weight", v = "model.layers.1.self_attn.v_proj.weight";
  EXPECT_NE(std::memcmp(a.get(k).bytes.data(), a.get(v).bytes.data(), a.get(k).bytes.size()), 0);
}

TEST(RandomWeights, MatricesAreUniformWithStd002AndNormsAreOne) {
  ModelConfig config = load_model_config(locate_model(kFixtures + "/tiny-llama"));
  config.num_layers = 1;
  const WeightStore w = random_llama_weights(config, 3);
  double sum = 0, sum_sq = 0, top = 0;
  int64_t n = 0;
  for (const std::string& name : w.names()) {
    const WeightView& view = w.get(name);
    for (int64_t i = 0; i < view.numel(); ++i) {
      const float x = bf16_value(view.bytes.data() + 2 * i);
      if (view.shape.size() == 1) {
        ASSERT_EQ(x, 1.0f) << name << " [" << i << "]";
        continue;
      }
      sum += x, sum_sq += static_cast<double>(x) * x, top = std::max(top, std::fabs(static_cast<double>(x)));
      ++n;
    }
  }
  ASSERT_GT(n, 30000);
  EXPECT_NEAR(sum / n, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 0.02, 0.001);
  EXPECT_LE(top, 0.0347);
  EXPECT_GT(top, 0.034);
}

TEST(RandomWeights, AModelLoadsFromThemAndOtherArchitecturesAreRefused) {
  const ModelConfig config = load_model_config(locate_model(kFixtures + "/tiny-llama"));
  const WeightStore w = random_llama_weights(config, 1);
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  EXPECT_NE(make_causal_lm(config, w, backend, GraphOptions{}), nullptr);
  const ModelConfig bert = load_model_config(locate_model(kFixtures + "/tiny-bert"));
  try {
    (void)random_llama_weights(bert, 1);
    FAIL() << "a BERT config was accepted";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Llama-family decoders only"));
  }
}

// The shipped 7B shape is the real Llama-2-7b-hf config (so the timings are a 7B model's), and its
// space parses.
TEST(RandomWeights, TheShipped7bShapeAndItsSpace) {
  const std::string dir = TESSERA_TUNE_CONFIGS;
  const ModelConfig c = load_model_config(locate_model(dir + "/llama2-7b-shape"));
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  const TuneSpace space = load_space(dir + "/gpu-7b-shape.yaml");
  EXPECT_EQ(space.backend, "cuda");
  EXPECT_EQ(space.weight_formats, (std::vector<std::string>{"bf16", "int8", "fp8_e4m3", "int4_g128"}));
  EXPECT_EQ(space.cuda_graphs, (std::vector<bool>{true}));
  EXPECT_EQ(space.gate_up, (std::vector<std::string>{"fused", "epilogue"}));
  EXPECT_EQ(space.rope_kv_write, (std::vector<bool>{true}));
  EXPECT_EQ(space.decode_split_min_tokens, (std::vector<int>{64, 128}));
  EXPECT_EQ(space.kv_dtypes, (std::vector<std::string>{"bf16", "fp8_e4m3"}));
  EXPECT_EQ(space.size(), 32);
  EXPECT_EQ(load_space(dir + "/gpu-smollm2.yaml").backend, "cuda");
}

}  // namespace
}  // namespace tessera::tuner
