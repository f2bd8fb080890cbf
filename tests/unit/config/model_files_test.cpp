// tests/unit/config/model_files_test.cpp: locate_model / load_model_config / load_weights on
// folders built here, and on the installed SmolLM2 and all-MiniLM-L6-v2 when present.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"
#include "models/model_files.h"
#include "models/weights/gguf.h"
#include "tests/unit/weights/calibration_files.h"
#include "tests/unit/weights/test_files.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// Points TESSERA_MODEL_DIR at `dir` for the lifetime of the object.
class ScopedModelDir {
 public:
  explicit ScopedModelDir(const std::string& dir) {
    if (const char* old = std::getenv("TESSERA_MODEL_DIR")) old_ = old;
    ::setenv("TESSERA_MODEL_DIR", dir.c_str(), 1);
  }
  ~ScopedModelDir() {
    if (old_) {
      ::setenv("TESSERA_MODEL_DIR", old_->c_str(), 1);
    } else {
      ::unsetenv("TESSERA_MODEL_DIR");
    }
  }

 private:
  std::optional<std::string> old_;
};

test::Bytes tiny_gguf() {
  test::GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_u32("llama.block_count", 1);
  b.add_u32("llama.context_length", 128);
  b.add_u32("llama.embedding_length", 32);
  b.add_u32("llama.feed_forward_length", 64);
  b.add_u32("llama.attention.head_count", 2);
  b.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  b.add_u32("llama.vocab_size", 4);
  b.add_tensor({"token_embd.weight", {32, 4}, test::kGgmlF32, test::Bytes(32 * 4 * 4)});
  return b.build();
}

TEST(LocateModel, FindsFoldersAndGgufFiles) {
  test::TempDir root("models");
  ScopedModelDir scoped(root.path().string());
  EXPECT_EQ(default_model_dir(), root.path().string());

  // A GGUF folder in the model dir, by name.
  std::filesystem::create_directories(root.path() / "tiny");
  test::write_file(root.path() / "tiny" / "tiny.Q8_0.gguf", tiny_gguf());
  ModelFiles files = locate_model("tiny");
  EXPECT_EQ(files.format, ModelFormat::kGguf);
  EXPECT_EQ(files.name, "tiny");
  EXPECT_EQ(files.gguf_path, (root.path() / "tiny" / "tiny.Q8_0.gguf").string());
  ASSERT_NE(files.gguf, nullptr);
  EXPECT_EQ(load_model_config(files).num_layers, 1);
  EXPECT_TRUE(load_weights(files).contains("model.embed_tokens.weight"));

  // The same by folder path and by file path.
  EXPECT_EQ(locate_model((root.path() / "tiny").string()).format, ModelFormat::kGguf);
  files = locate_model((root.path() / "tiny" / "tiny.Q8_0.gguf").string());
  EXPECT_EQ(files.dir, (root.path() / "tiny").string());

  // Two GGUF files: ambiguous, both listed.
  test::write_file(root.path() / "tiny" / "tiny.F16.gguf", tiny_gguf());
  try {
    locate_model("tiny");
    FAIL() << "ambiguous folder accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tiny.F16.gguf"));
    EXPECT_THAT(e.what(), HasSubstr("tiny.Q8_0.gguf"));
  }

  // An HF folder with config.json and model.safetensors.
  std::filesystem::create_directories(root.path() / "hf");
  test::write_text(root.path() / "hf" / "config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 4,
      "max_position_embeddings": 128})");
  test::write_file(root.path() / "hf" / "model.safetensors",
                   test::build_safetensors({{"model.embed_tokens.weight", "F32", {4, 32}, test::Bytes(4 * 32 * 4)}}));
  files = locate_model("hf");
  EXPECT_EQ(files.format, ModelFormat::kHfSafetensors);
  EXPECT_EQ(load_model_config(files).hidden_size, 32);
  EXPECT_EQ(load_weights(files).size(), 1u);

  // Nothing there: the message names the model, the model dir and what is available.
  try {
    locate_model("nope");
    FAIL() << "missing model located";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'nope'"));
    EXPECT_THAT(e.what(), HasSubstr(root.path().string()));
    EXPECT_THAT(e.what(), HasSubstr("hf"));
    EXPECT_THAT(e.what(), HasSubstr("TESSERA_MODEL_DIR"));
  }
  std::filesystem::create_directories(root.path() / "empty");
  EXPECT_THROW(locate_model("empty"), Error);
  test::write_text(root.path() / "notes.txt", "x");
  EXPECT_THROW(locate_model((root.path() / "notes.txt").string()), Error);
  EXPECT_THROW(locate_model(""), Error);
}

TEST(LocateModel, ACalibrationSidecarIsNeverTheModel) {
  test::TempDir root("models-sidecar");
  ScopedModelDir scoped(root.path().string());
  const std::filesystem::path dir = root.path() / "tiny";
  std::filesystem::create_directories(dir);

  // Only the sidecar: the folder has no model.
  test::write_file(dir / "tiny.int4_g128.gguf", test::tiny_model_gguf());
  try {
    locate_model("tiny");
    FAIL() << "a folder holding only a sidecar was located";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("has neither config.json nor a model .gguf file (calibration sidecars, "
                                    "*.int4_g128.gguf, are not models)"));
  }

  // The model and its sidecar: the folder is the model, by name and by path.
  const std::filesystem::path model = test::write_tiny_model(dir);
  test::write_sidecar(model, {.tensors = test::default_latents()});
  EXPECT_EQ(locate_model("tiny").gguf_path, model.string());
  EXPECT_EQ(locate_model(dir.string()).gguf_path, model.string());

  // The sidecar itself, by path or by name in the model dir: refused, naming the model it belongs to.
  test::write_file(root.path() / "loose.int4_g128.gguf", test::tiny_model_gguf());
  const std::pair<std::string, std::string> sidecars[] = {{(dir / "tiny.int4_g128.gguf").string(), "tiny.gguf"},
                                                          {"loose.int4_g128.gguf", "loose.gguf"}};
  for (const auto& [given, owner] : sidecars) {
    try {
      locate_model(given);
      FAIL() << given << " located as a model";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("model '" + given + "' is a calibration sidecar (int4_g128 latent weights for " +
                                      owner + "), not a model; pass " + owner + " or its folder"));
    }
  }
}

std::filesystem::path installed(const std::string& folder) {
  const std::filesystem::path p = std::filesystem::path(default_model_dir()) / folder;
  return std::filesystem::exists(p) ? p : std::filesystem::path();
}

TEST(RealModelConfig, SmolLM2) {
  if (installed("smollm2-135m-instruct").empty()) GTEST_SKIP() << "smollm2-135m-instruct not installed";
  const ModelConfig c = load_model_config(locate_model("smollm2-135m-instruct"));
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_NEAR(c.norm_eps, 1e-5, 1e-10);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c.pad_token_id, 2);
}

TEST(RealModelConfig, MiniLm) {
  if (installed("all-minilm-l6-v2").empty()) GTEST_SKIP() << "all-minilm-l6-v2 not installed";
  const ModelConfig c = load_model_config(locate_model("all-minilm-l6-v2"));
  EXPECT_EQ(c.arch, Architecture::kBert);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.hidden_size, 384);
  EXPECT_EQ(c.num_heads, 12);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.pooling, Pooling::kMean);
  EXPECT_TRUE(c.normalize_embeddings);
}

}  // namespace
}  // namespace tessera
