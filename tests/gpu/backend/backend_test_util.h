// tests/gpu/backend/backend_test_util.h: what the CUDA backend tests share: the no-GPU skip, the
// normalized error of logits, seeded host weights, random Llamas and prompts, and a thrown error's
// text.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/backend/weight_view.h"
#include "models/config/model_config.h"
#include "models/weights/weight_store.h"
#include "tests/error_of.h"

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    if (::tessera::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU present";          \
  } while (0)

namespace tessera::backend_test {

// ‖got − want‖ / ‖want‖ in double; the sizes must agree.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// An f32 weight held on the host, viewable as a WeightStore entry.
struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  WeightView view() const {
    return {name, DType::kF32, shape, std::as_bytes(std::span<const float>(values)), "test"};
  }
};

inline HostTensor normal_tensor(std::string name, std::vector<int64_t> shape, float stddev, uint32_t seed) {
  HostTensor t{std::move(name), std::move(shape), {}};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  t.values.resize(static_cast<size_t>(n));
  for (float& v : t.values) v = normal(rng);
  return t;
}

// A Llama with seeded random weights: every linear of std 1/sqrt(k), so that a normed projection's
// outputs have unit RMS and each layer changes the residual stream about as much as a trained one
// does (a wrong linear shows in the logits); norm weights around 1; tied embeddings. Tensors are drawn
// in a fixed order from `seed` on, so a shape and seed always give the same weights.
struct RandomLlamaShape {
  std::string source;  // the ModelConfig's source, for messages
  int32_t num_layers = 2;
  int64_t hidden = 128;
  int64_t intermediate = 192;
  int32_t num_heads = 2;
  int32_t num_kv_heads = 1;
  int64_t head_dim = 64;
  int64_t vocab = 256;
  uint32_t seed = 100;
};

struct RandomModel {
  ModelConfig config;
  WeightStore store;
};

inline RandomModel random_llama(const RandomLlamaShape& s) {
  RandomModel r;
  ModelConfig& c = r.config;
  c.arch = Architecture::kLlama;
  c.source = s.source;
  c.num_layers = s.num_layers;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_heads = s.num_heads;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = 512;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  c.norm_eps = 1e-5;
  auto tensors = std::make_shared<std::vector<HostTensor>>();
  uint32_t seed = s.seed;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    const bool vector = shape.size() == 1;
    HostTensor t = normal_tensor(std::move(name), shape, vector ? 0.1f : 1.0f / std::sqrt(float(shape.back())), seed++);
    if (vector) {
      for (float& v : t.values) v += 1.0f;
    }
    tensors->push_back(std::move(t));
  };
  const int64_t h = s.hidden, q_rows = s.num_heads * s.head_dim, kv_rows = s.num_kv_heads * s.head_dim;
  add("model.embed_tokens.weight", {s.vocab, h});
  add("model.norm.weight", {h});
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {q_rows, h});
    add(p + "self_attn.k_proj.weight", {kv_rows, h});
    add(p + "self_attn.v_proj.weight", {kv_rows, h});
    add(p + "self_attn.o_proj.weight", {h, q_rows});
    add(p + "mlp.gate_proj.weight", {s.intermediate, h});
    add(p + "mlp.up_proj.weight", {s.intermediate, h});
    add(p + "mlp.down_proj.weight", {h, s.intermediate});
  }
  for (const HostTensor& t : *tensors) r.store.add(t.view());
  r.store.keep_alive(tensors);
  return r;
}

inline std::vector<int32_t> random_prompt(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

using tessera::error_of;

}  // namespace tessera::backend_test
