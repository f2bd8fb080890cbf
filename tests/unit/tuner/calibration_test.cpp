// tests/unit/tuner/calibration_test.cpp: the tuner's side of the int4_g128 calibration sidecar:
// apply_weight_format (what tune measures and serve / info load) takes the sidecar for int4_g128
// only, and the records say where int4_g128 weights came from (candidates.jsonl, profile.yaml).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "models/calibrated_weights.h"
#include "models/model_files.h"
#include "tests/unit/weights/calibration_files.h"
#include "tuner/measure.h"
#include "tuner/profile.h"
#include "tuner/report.h"

namespace tessera::tuner {
namespace {

constexpr const char* kQ = "model.layers.0.self_attn.q_proj.weight";
constexpr const char* kDown = "model.layers.0.mlp.down_proj.weight";

Candidate with_format(const std::string& weight_format) {
  Candidate c;
  c.weight_format = weight_format;
  c.kv_dtype = "bf16";
  return c;
}

// A cuda profile of the tiny model that chose int4_g128, with `measured` as the tune wrote it.
Profile int4_profile(nlohmann::json measured) {
  Profile p;
  p.path = "profile.yaml";
  p.model_name = "tiny";
  p.model_sha256 = std::string(64, 'a');
  p.architecture = "llama";
  p.device = "cuda: NVIDIA H100 80GB HBM3";
  p.backend = "cuda";
  p.choice = with_format("int4_g128");
  p.measured = std::move(measured);
  return p;
}

TEST(Calibration, ApplyWeightFormatTakesTheSidecarForInt4G128Only) {
  test::TempDir dir("tune-calib");
  const std::filesystem::path model = test::write_tiny_model(dir.path());
  const std::filesystem::path sidecar = test::write_sidecar(model, {.tensors = test::default_latents()});
  const ModelFiles files = locate_model(model.string());

  const WeightStore int4 = apply_weight_format(files, load_weights(files), with_format("int4_g128"));
  EXPECT_EQ(int4.get(kDown).source_file, sidecar.string());
  EXPECT_EQ(int4.to_f32(kDown)[5], test::latent_value(5, 100.0f));
  EXPECT_EQ(int4.get(kQ).dtype, DType::kBF16);  // as the sidecar stores it: the backend quantizes at load

  // The other GPU formats keep the model's weights: int8 and fp8_e4m3 as they are (the backend
  // quantizes them), bf16 converted on the host (5005 rounds to 4992, bf16's step there being 32).
  for (const char* format : {"int8", "fp8_e4m3"}) {
    const WeightStore other = apply_weight_format(files, load_weights(files), with_format(format));
    EXPECT_EQ(other.get(kDown).source_file, model.string()) << format;
    EXPECT_EQ(other.to_f32(kDown)[5], 5005.0f) << format;
  }
  const WeightStore bf16 = apply_weight_format(files, load_weights(files), with_format("bf16"));
  EXPECT_EQ(bf16.get(kDown).source_file, model.string());
  EXPECT_EQ(bf16.to_f32(kDown)[5], 4992.0f);
  // So do the CPU formats ("gguf": the file's own).
  EXPECT_EQ(apply_weight_format(files, load_weights(files), with_format("gguf")).to_f32(kDown)[5], 5005.0f);
}

TEST(Calibration, Int4RecordsSayWhereTheirWeightsCameFrom) {
  Measurement m;
  m.candidate = with_format("int4_g128");
  m.settings = "{}";
  m.weights_source = "calibrated: test: 200 steps of STE on wiki.utf8";
  const nlohmann::json j = m.to_json();
  EXPECT_EQ(j.at("weights_source"), "calibrated: test: 200 steps of STE on wiki.utf8");
  EXPECT_EQ(Measurement::from_json(j).weights_source, m.weights_source);
  // Other formats' records have no such field, and records from before it read back as empty.
  m.weights_source.clear();
  EXPECT_FALSE(m.to_json().contains("weights_source"));
  EXPECT_EQ(Measurement::from_json(m.to_json()).weights_source, "");

  // The profile's measured block carries it through YAML (a string with ": " in it).
  const Profile p =
      int4_profile({{"weights_source", "calibrated: test: 200 steps of STE on wiki.utf8"}, {"weights_mb", 1.5}});
  const Profile back = parse_profile(profile_yaml(p), "profile.yaml");
  EXPECT_EQ(back.measured.at("weights_source"), "calibrated: test: 200 steps of STE on wiki.utf8");
}

TEST(Calibration, ReportAndTableSayWhereInt4WeightsCameFrom) {
  const auto measured = [](const std::string& format, double perplexity, const std::string& source) {
    Measurement m;
    m.candidate = with_format(format);
    m.prefill = {{.size = 128, .median_ms = 1.0, .min_ms = 0.9, .max_ms = 1.1}};
    m.decode = {{.size = 1, .median_ms = format == "bf16" ? 0.5 : 0.4, .min_ms = 0.4, .max_ms = 0.6}};
    m.perplexity = perplexity;
    m.weight_bytes = 1 << 20;
    m.weights_source = source;
    return m;
  };
  ReportInput in;
  in.model = "tiny";
  in.measurements = {measured("bf16", 10.0, ""), measured("int4_g128", 10.4, "calibrated: 400 steps")};
  in.front = {0, 1};
  in.chosen = 1;
  EXPECT_THAT(report_markdown(in), testing::HasSubstr("\n- int4_g128 weights: calibrated: 400 steps\n"));
  EXPECT_THAT(report_html(in), testing::HasSubstr("<br>int4_g128 weights: calibrated: 400 steps</p>"));
  // Without int4_g128 candidates there is nothing to say.
  in.measurements.pop_back();
  in.front = {0};
  in.chosen = 0;
  EXPECT_THAT(report_markdown(in), testing::Not(testing::HasSubstr("int4_g128 weights")));
  EXPECT_THAT(report_html(in), testing::Not(testing::HasSubstr("int4_g128 weights")));
}

// A profile measured int4_g128 with some weights; serving it with others (a sidecar added, removed or
// remade since the tune) is refused unless forced, like a profile for another model.
TEST(Calibration, AnInt4ProfileIsBoundToItsWeightsSource) {
  Profile p = int4_profile({{"weights_source", "calibrated: 400 steps"}});
  const auto check = [&](const std::string& source, bool force) {
    return check_profile(p, p.model_sha256, p.device, "cuda", source, force);
  };
  EXPECT_TRUE(check("calibrated: 400 steps", false).empty());
  EXPECT_THAT([&] { check("round-to-nearest", false); },
              testing::ThrowsMessage<Error>(testing::HasSubstr(
                  "its int4_g128 weights were 'calibrated: 400 steps', and the model's are now 'round-to-nearest'")));
  EXPECT_EQ(check("calibrated: 800 steps", true).size(), 1u);
  // Other formats do not depend on the sidecar; older profiles did not record the source.
  p.choice = with_format("int8");
  EXPECT_TRUE(check("round-to-nearest", false).empty());
  p.choice = with_format("int4_g128");
  p.measured = nlohmann::json::object();
  EXPECT_TRUE(check("round-to-nearest", false).empty());
}

// Only an int4_g128 choice looks at the sidecar: a stale one (made for another model file) beside the
// model stops that choice, naming why, and never an int8 or bf16 profile.
TEST(Calibration, OnlyAnInt4ChoiceOpensTheSidecarForTheProfileCheck) {
  test::TempDir dir("tune-calib-stale");
  const std::filesystem::path model = test::write_tiny_model(dir.path());
  test::write_sidecar(model, {.source_sha256 = std::string(64, 'f'), .tensors = test::default_latents()});
  const ModelFiles files = locate_model(model.string());
  EXPECT_EQ(current_int4_weights_source(with_format("int8"), files), "");
  EXPECT_EQ(current_int4_weights_source(with_format("bf16"), files), "");
  EXPECT_THAT([&] { current_int4_weights_source(with_format("int4_g128"), files); },
              testing::ThrowsMessage<Error>(testing::HasSubstr("calibrated for a different model file")));
}

}  // namespace
}  // namespace tessera::tuner
