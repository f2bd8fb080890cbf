// tests/unit/weights/calibration_files.h: a tiny llama GGUF model and int4_g128 calibration sidecars
// for it, written to a folder (models/calibrated_weights.h), for the overlay, folder-scan and tuner
// tests. Every value is known: model tensor t holds base(t) + i at element i (in GGUF order), a
// sidecar tensor -(i % 64) in BF16 (exact), so a test can tell which file a value came from.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "models/sha256.h"
#include "tests/unit/weights/test_files.h"

namespace tessera::test {

// 2 heads (and 2 KV heads) of 16: q/k rows un-permute within each head of 16 rows.
inline constexpr uint64_t kCalibHidden = 32;
inline constexpr uint64_t kCalibVocab = 4;
inline constexpr uint64_t kCalibHeadDim = 16;

inline void add_tiny_llama_metadata(GgufBuilder& b) {
  b.add_string("general.architecture", "llama");
  b.add_u32("llama.block_count", 1);
  b.add_u32("llama.context_length", 128);
  b.add_u32("llama.embedding_length", kCalibHidden);
  b.add_u32("llama.feed_forward_length", kCalibHidden);
  b.add_u32("llama.attention.head_count", 2);
  b.add_u32("llama.attention.head_count_kv", 2);
  b.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  b.add_u32("llama.vocab_size", kCalibVocab);
}

// Element i of the model's tensor is `base` + i.
inline Bytes counting_f32(uint64_t count, float base) {
  std::vector<float> v(count);
  for (uint64_t i = 0; i < count; ++i) v[i] = base + static_cast<float>(i);
  return to_bytes(v);
}

// Element i of a sidecar tensor is -(i % 64) + `offset` (small integers: exact in BF16).
inline float latent_value(uint64_t i, float offset = 0.0f) { return -static_cast<float>(i % 64) + offset; }
inline Bytes latent_bf16(uint64_t count, float offset = 0.0f) {
  std::vector<uint16_t> v(count);
  for (uint64_t i = 0; i < count; ++i) v[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(latent_value(i, offset)) >> 16);
  return to_bytes(v);
}

// The model's tensors: base value of each (F32). Layer linears attn_q, attn_k and ffn_down, and the
// embedding and a norm, which are not linears.
struct TinyTensor {
  const char* name;
  std::vector<uint64_t> dims;  // GGUF order
  float base;
};
inline const std::vector<TinyTensor>& tiny_model_tensors() {
  static const std::vector<TinyTensor> tensors = {
      {"token_embd.weight", {kCalibHidden, kCalibVocab}, 100.0f},
      {"blk.0.attn_norm.weight", {kCalibHidden}, 200.0f},
      {"blk.0.attn_q.weight", {kCalibHidden, kCalibHidden}, 1000.0f},
      {"blk.0.attn_k.weight", {kCalibHidden, kCalibHidden}, 3000.0f},
      {"blk.0.ffn_down.weight", {kCalibHidden, kCalibHidden}, 5000.0f},
  };
  return tensors;
}

inline Bytes tiny_model_gguf() {
  GgufBuilder b;
  add_tiny_llama_metadata(b);
  for (const TinyTensor& t : tiny_model_tensors()) {
    uint64_t count = 1;
    for (uint64_t d : t.dims) count *= d;
    b.add_tensor({t.name, t.dims, kGgmlF32, counting_f32(count, t.base)});
  }
  return b.build();
}

// A sidecar as the calibration tool writes it: the model's metadata, the three tessera keys, and
// `tensors` (BF16 latents unless a test passes others).
struct SidecarSpec {
  std::string format = "int4_g128";
  std::string source_sha256 = {};  // empty: the model file's sha256 (write_sidecar fills it in)
  std::string method = "test: 200 steps of STE on wiki.utf8";
  std::vector<GgufBuilder::Tensor> tensors = {};
};

inline GgufBuilder::Tensor latent(const std::string& name, std::vector<uint64_t> dims, float offset = 0.0f) {
  uint64_t count = 1;
  for (uint64_t d : dims) count *= d;
  return {name, std::move(dims), kGgmlBF16, latent_bf16(count, offset)};
}

inline Bytes sidecar_gguf(const SidecarSpec& spec) {
  GgufBuilder b;
  add_tiny_llama_metadata(b);
  b.add_string("tessera.calibration.format", spec.format);
  b.add_string("tessera.calibration.source_sha256", spec.source_sha256);
  b.add_string("tessera.calibration.method", spec.method);
  for (const GgufBuilder::Tensor& t : spec.tensors) b.add_tensor(t);
  return b.build();
}

// Latents for attn_q and ffn_down (attn_k keeps the model's).
inline std::vector<GgufBuilder::Tensor> default_latents() {
  return {latent("blk.0.attn_q.weight", {kCalibHidden, kCalibHidden}),
          latent("blk.0.ffn_down.weight", {kCalibHidden, kCalibHidden}, 100.0f)};
}

// <dir>/tiny.gguf; returns its path.
inline std::filesystem::path write_tiny_model(const std::filesystem::path& dir) {
  const std::filesystem::path model = dir / "tiny.gguf";
  write_file(model, tiny_model_gguf());
  return model;
}

// <dir>/tiny.int4_g128.gguf for the model at `model`: `spec`, with the model file's sha256 unless the
// spec names another.
inline std::filesystem::path write_sidecar(const std::filesystem::path& model, SidecarSpec spec) {
  if (spec.source_sha256.empty()) spec.source_sha256 = sha256_hex("", {model.string()});
  const std::filesystem::path sidecar = model.parent_path() / (model.stem().string() + ".int4_g128.gguf");
  write_file(sidecar, sidecar_gguf(spec));
  return sidecar;
}

}  // namespace tessera::test
