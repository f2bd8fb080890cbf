// tests/unit/weights/calibrated_weights_test.cpp: the int4_g128 calibration sidecar
// (models/calibrated_weights.h): which tensors it replaces and with what values, when it is ignored,
// and each refusal naming the file and the key or tensor; and the sha256 it is bound by.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "models/calibrated_weights.h"
#include "models/model_files.h"
#include "models/sha256.h"
#include "tests/unit/weights/calibration_files.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr const char* kQ = "model.layers.0.self_attn.q_proj.weight";
constexpr const char* kK = "model.layers.0.self_attn.k_proj.weight";
constexpr const char* kDown = "model.layers.0.mlp.down_proj.weight";
constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr int64_t kCols = static_cast<int64_t>(test::kCalibHidden);

std::string overlay_refusal(const ModelFiles& files) {
  try {
    overlay_calibrated_weights(files, load_weights(files), ScalarType::kInt4G128);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Sha256, MatchesTheStandardVectorsOverPrefixAndFiles) {
  test::TempDir dir("sha");
  test::write_text(dir.path() / "bc", "bc");
  test::write_text(dir.path() / "empty", "");
  // sha256("abc") and sha256(""), FIPS 180-2.
  EXPECT_EQ(sha256_hex("a", {(dir.path() / "bc").string()}),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("", {(dir.path() / "empty").string()}),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_THROW(sha256_hex("", {(dir.path() / "absent").string()}), Error);
}

TEST(CalibratedWeights, TheSidecarSitsBesideTheModelUnderItsStem) {
  EXPECT_EQ(calibration_sidecar_path("/m/smollm2.Q8_0.gguf"), "/m/smollm2.Q8_0.int4_g128.gguf");
  EXPECT_EQ(calibration_sidecar_path("/m/tiny.GGUF"), "/m/tiny.int4_g128.gguf");
  EXPECT_TRUE(is_calibration_sidecar("/m/tiny.int4_g128.gguf"));
  EXPECT_TRUE(is_calibration_sidecar("/m/TINY.INT4_G128.GGUF"));
  EXPECT_FALSE(is_calibration_sidecar("/m/tiny.gguf"));
  EXPECT_FALSE(is_calibration_sidecar("/m/int4_g128.gguf.bak"));
}

TEST(CalibratedWeights, Int4OverlaysTheSidecarsLinearsAndKeepsTheRest) {
  test::TempDir dir("calib");
  const fs::path model = test::write_tiny_model(dir.path());
  const fs::path sidecar = test::write_sidecar(model, {.tensors = test::default_latents()});
  const ModelFiles files = locate_model(model.string());
  EXPECT_EQ(model_sha256(files), sha256_hex("", {model.string()}));

  const WeightStore own = load_weights(files);
  const WeightStore out = overlay_calibrated_weights(files, load_weights(files), ScalarType::kInt4G128);
  EXPECT_EQ(out.names(), own.names());

  // attn_q: the sidecar's, its rows un-permuted as the model's are: HF row h*16 + j*8 + i is GGUF row
  // h*16 + 2i + j (row 1 <- 2, row 8 <- 1, row 16 <- 16).
  EXPECT_EQ(out.get(kQ).source_file, sidecar.string());
  EXPECT_EQ(out.get(kQ).dtype, DType::kBF16);
  const std::vector<float> q = out.to_f32(kQ);
  for (int64_t c = 0; c < kCols; ++c) {
    EXPECT_EQ(q[1 * kCols + c], test::latent_value(2 * kCols + c)) << "column " << c;
    EXPECT_EQ(q[8 * kCols + c], test::latent_value(1 * kCols + c)) << "column " << c;
    EXPECT_EQ(q[16 * kCols + c], test::latent_value(16 * kCols + c)) << "column " << c;
  }
  // ffn_down: the sidecar's, as stored.
  EXPECT_EQ(out.get(kDown).source_file, sidecar.string());
  const std::vector<float> down = out.to_f32(kDown);
  for (size_t i = 0; i < down.size(); ++i) ASSERT_EQ(down[i], test::latent_value(i, 100.0f)) << "element " << i;

  // attn_k (a linear the sidecar leaves out), the embedding and the norm: the model's.
  EXPECT_EQ(out.get(kK).source_file, model.string());
  EXPECT_EQ(out.to_f32(kK), own.to_f32(kK));
  EXPECT_EQ(out.to_f32(kK)[0], 3000.0f);  // HF row 0 is GGUF row 0
  const std::vector<float> embed = out.to_f32(kEmbed);
  for (size_t i = 0; i < embed.size(); ++i) ASSERT_EQ(embed[i], 100.0f + static_cast<float>(i));
  EXPECT_EQ(out.to_f32("model.layers.0.input_layernorm.weight")[31], 231.0f);
}

TEST(CalibratedWeights, WithoutASidecarNothingChanges) {
  test::TempDir dir("calib-none");
  const fs::path model = test::write_tiny_model(dir.path());
  const ModelFiles files = locate_model(model.string());
  EXPECT_FALSE(open_calibration_sidecar(files).has_value());
  EXPECT_EQ(int4_weights_source(open_calibration_sidecar(files)), "round-to-nearest");
  const WeightStore out = overlay_calibrated_weights(files, load_weights(files), ScalarType::kInt4G128);
  EXPECT_EQ(out.names(), load_weights(files).names());
  EXPECT_EQ(out.get(kQ).source_file, model.string());
  EXPECT_EQ(out.get(kQ).dtype, DType::kF32);
  EXPECT_EQ(out.to_f32(kDown)[7], 5007.0f);
}

TEST(CalibratedWeights, SafetensorsModelsHaveNoSidecar) {
  test::TempDir dir("calib-hf");
  test::write_text(dir.path() / "config.json", R"({"architectures": ["LlamaForCausalLM"]})");
  test::write_file(dir.path() / "model.safetensors",
                   test::build_safetensors({{kQ, "F32", {2, 32}, test::Bytes(2 * 32 * 4)}}));
  // A stray file with a sidecar's name is no sidecar of an HF folder.
  test::write_file(dir.path() / "model.int4_g128.gguf", test::Bytes(8));
  const ModelFiles files = locate_model(dir.path().string());
  ASSERT_EQ(files.format, ModelFormat::kHfSafetensors);
  EXPECT_FALSE(open_calibration_sidecar(files).has_value());
  const WeightStore out = overlay_calibrated_weights(files, load_weights(files), ScalarType::kInt4G128);
  EXPECT_EQ(out.get(kQ).source_file, (dir.path() / "model.safetensors").string());
}

TEST(CalibratedWeights, OtherFormatsIgnoreTheSidecar) {
  test::TempDir dir("calib-other");
  const fs::path model = test::write_tiny_model(dir.path());
  // Made for another file: int4_g128 refuses it, every other format never opens it.
  test::write_sidecar(model, {.source_sha256 = std::string(64, 'b'), .tensors = test::default_latents()});
  const ModelFiles files = locate_model(model.string());
  EXPECT_THAT(overlay_refusal(files), HasSubstr("calibrated for a different model file"));
  for (ScalarType format : {ScalarType::kBF16, ScalarType::kF16, ScalarType::kF32, ScalarType::kInt8PerRow,
                            ScalarType::kFp8E4M3PerRow, ScalarType::kQ4_0}) {
    const WeightStore out = overlay_calibrated_weights(files, load_weights(files), format);
    EXPECT_EQ(out.get(kQ).source_file, model.string()) << scalar_type_name(format);
    EXPECT_EQ(out.to_f32(kDown)[7], 5007.0f) << scalar_type_name(format);
  }
}

TEST(CalibratedWeights, ASidecarForAnotherModelFileIsRefused) {
  test::TempDir dir("calib-sha");
  const fs::path model = test::write_tiny_model(dir.path());
  const fs::path sidecar =
      test::write_sidecar(model, {.source_sha256 = std::string(64, 'B'), .tensors = test::default_latents()});
  const ModelFiles files = locate_model(model.string());
  const std::string message = overlay_refusal(files);
  EXPECT_THAT(message, HasSubstr(sidecar.string() + ": calibrated for a different model file"));
  EXPECT_THAT(message, HasSubstr("tessera.calibration.source_sha256 is bbbbbbbbbbbbbbbb..."));
  EXPECT_THAT(message, HasSubstr(model.string() + " has sha256 " + model_sha256(files).substr(0, 16) + "..."));
  EXPECT_THAT(message, HasSubstr("re-run the calibration for this model file, or remove " + sidecar.string()));
  EXPECT_THROW(open_calibration_sidecar(files), Error);
}

TEST(CalibratedWeights, ASidecarForAnotherFormatIsRefusedNamingTheKey) {
  test::TempDir dir("calib-format");
  const fs::path model = test::write_tiny_model(dir.path());
  const fs::path sidecar = test::write_sidecar(model, {.format = "int8", .tensors = test::default_latents()});
  EXPECT_THAT(overlay_refusal(locate_model(model.string())),
              HasSubstr(sidecar.string() + ": metadata key 'tessera.calibration.format' is 'int8', expected 'int4_g128'"));
}

TEST(CalibratedWeights, AShapeOtherThanTheModelsIsRefusedNamingTheTensor) {
  test::TempDir dir("calib-shape");
  const fs::path model = test::write_tiny_model(dir.path());
  const fs::path sidecar =
      test::write_sidecar(model, {.tensors = {test::latent("blk.0.ffn_down.weight", {test::kCalibHidden, 16})}});
  EXPECT_THAT(overlay_refusal(locate_model(model.string())),
              HasSubstr(sidecar.string() + ": tensor 'blk.0.ffn_down.weight' has shape [16, 32], and the model's (" +
                        model.string() + ") [32, 32]"));
}

TEST(CalibratedWeights, OnlyTheModelsLayerLinearsInFloatAreTaken) {
  test::TempDir dir("calib-tensors");
  const fs::path model = test::write_tiny_model(dir.path());
  const ModelFiles files = locate_model(model.string());
  const auto refusal_with = [&](test::GgufBuilder::Tensor tensor) {
    test::write_sidecar(model, {.tensors = {std::move(tensor)}});
    return overlay_refusal(files);
  };
  EXPECT_THAT(refusal_with(test::latent("token_embd.weight", {test::kCalibHidden, test::kCalibVocab})),
              HasSubstr("tensor 'token_embd.weight' is not a layer linear weight"));
  EXPECT_THAT(refusal_with(test::latent("blk.0.attn_norm.weight", {test::kCalibHidden})),
              HasSubstr("tensor 'blk.0.attn_norm.weight' is not a layer linear weight"));
  EXPECT_THAT(refusal_with(test::latent("blk.1.ffn_down.weight", {test::kCalibHidden, test::kCalibHidden})),
              HasSubstr("tensor 'blk.1.ffn_down.weight' is not in the model " + model.string()));
  EXPECT_THAT(refusal_with({"blk.0.ffn_down.weight", {test::kCalibHidden, test::kCalibHidden}, test::kGgmlQ8_0,
                            test::Bytes(32 * 34)}),
              HasSubstr("tensor 'blk.0.ffn_down.weight' is Q8_0; latent weights are BF16, F16 or F32"));
  // F32 latents are taken as they are.
  const std::filesystem::path f32_sidecar =
      test::write_sidecar(model, {.tensors = {{"blk.0.ffn_down.weight", {test::kCalibHidden, test::kCalibHidden},
                                               test::kGgmlF32, test::counting_f32(32 * 32, -7.0f)}}});
  const WeightStore out = overlay_calibrated_weights(files, load_weights(files), ScalarType::kInt4G128);
  EXPECT_EQ(out.to_f32(kDown)[9], 2.0f);
  // The source names the sidecar by its own hash, so one remade with the same method text but other
  // weights is another source (a profile measured with the first is refused with the second).
  const std::string f32_source = int4_weights_source(open_calibration_sidecar(files));
  EXPECT_EQ(f32_source, "calibrated (sidecar sha256 " + sha256_hex("", {f32_sidecar.string()}).substr(0, 16) +
                            "): test: 200 steps of STE on wiki.utf8");
  const std::filesystem::path remade =
      test::write_sidecar(model, {.tensors = {{"blk.0.ffn_down.weight", {test::kCalibHidden, test::kCalibHidden},
                                               test::kGgmlF32, test::counting_f32(32 * 32, -6.0f)}}});
  // Hashes are remembered per path, size and modification time: make sure the rewrite's time differs.
  std::filesystem::last_write_time(remade, std::filesystem::last_write_time(remade) + std::chrono::seconds(1));
  EXPECT_NE(int4_weights_source(open_calibration_sidecar(files)), f32_source);
}

}  // namespace
}  // namespace tessera
