// tests/unit/tuner/profile_test.cpp: profile.yaml round trip, strict reading, and the identity
// checks the server makes before applying one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tuner/profile.h"

namespace tessera::tuner {
namespace {

using ::testing::HasSubstr;

const std::string kSha(64, 'a');

Profile sample() {
  Profile p;
  p.path = "profile.yaml";
  p.model_name = "smollm2-135m-instruct";
  p.model_sha256 = kSha;
  p.architecture = "llama";
  p.device = "cpu: Test CPU";
  p.backend = "cpu";
  p.tessera_version = "0.1.0";
  p.tessera_commit = "0123456789abcdef0123456789abcdef01234567";
  p.created = "2026-11-24T03:00:00Z";
  p.space = "configs/tune/cpu-ci.yaml";
  p.policy = "fastest_decode_within_ppl_pct: 1";
  p.reason = "fastest decode of 3";
  p.choice.weight_format = "q8_0";
  p.choice.fuse_qkv = false;
  p.choice.threads = 2;
  p.measured = {{"perplexity", 19.5}, {"decode_ms", {{"batch_1", {{"median", 4.5}}}}}};
  return p;
}

std::string refusal(const std::string& yaml) {
  try {
    parse_profile(yaml, "p.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Profile, RoundTripsThroughYaml) {
  const Profile p = sample();
  const std::string text = profile_yaml(p);
  const Profile q = parse_profile(text, "profile.yaml");
  EXPECT_EQ(q.model_sha256, kSha);
  EXPECT_EQ(q.device, p.device);
  EXPECT_EQ(q.tessera_commit, p.tessera_commit);
  EXPECT_EQ(q.choice, p.choice);
  EXPECT_DOUBLE_EQ(q.measured.at("perplexity").get<double>(), 19.5);
  EXPECT_DOUBLE_EQ(q.measured.at("decode_ms").at("batch_1").at("median").get<double>(), 4.5);
  EXPECT_EQ(choice_graph_options(q.choice).describe(), "add_rms_norm=fused qkv=separate gate_up=fused");
}

TEST(Profile, UnknownKeysAndBadValuesAreRefusedByName) {
  std::string text = profile_yaml(sample());
  EXPECT_THAT(refusal(text + "extra: 1\n"), HasSubstr("unknown key 'extra'"));
  std::string bad = text;
  bad.replace(bad.find("qkv: separate"), 13, "qkv: sideways");
  EXPECT_THAT(refusal(bad), HasSubstr("choice.fusions.qkv: expected fused or separate, got 'sideways'"));
  bad = text;
  bad.replace(bad.find("weight_format: q8_0"), 19, "weight_format: fp8_e4m3");
  EXPECT_THAT(refusal(bad), HasSubstr("choice.weight_format: 'fp8_e4m3' is not a cpu weight format"));
  bad = text;
  bad.replace(bad.find("tessera_profile: 1"), 18, "tessera_profile: 2");
  EXPECT_THAT(refusal(bad), HasSubstr("tessera_profile: expected 1"));
}

TEST(Profile, AnotherModelOrDeviceIsRefusedUnlessForced) {
  const Profile p = sample();
  EXPECT_TRUE(check_profile(p, kSha, "cpu: Test CPU", "cpu", "round-to-nearest", false).empty());
  const std::string other(64, 'b');
  EXPECT_THAT([&] { check_profile(p, other, "cpu: Test CPU", "cpu", "round-to-nearest", false); },
              ::testing::ThrowsMessage<Error>(HasSubstr("it was tuned for model smollm2-135m-instruct with sha256 aaaa")));
  EXPECT_THAT([&] { check_profile(p, kSha, "cpu: Other CPU", "cpu", "round-to-nearest", false); },
              ::testing::ThrowsMessage<Error>(HasSubstr("pass --force")));
  const std::vector<std::string> forced = check_profile(p, other, "cpu: Other CPU", "cpu", "round-to-nearest", true);
  EXPECT_EQ(forced.size(), 2u);
  EXPECT_THAT([&] { check_profile(p, kSha, "cpu: Test CPU", "cuda", "round-to-nearest", true); },
              ::testing::ThrowsMessage<Error>(HasSubstr("backend cpu choices cannot run on the cuda backend")));
}

// A cuda profile is bound to the GPU's name: another GPU is refused naming both unless forced, and
// the cpu backend never runs it.
TEST(Profile, ACudaProfileIsBoundToItsGpu) {
  Profile p = sample();
  p.backend = "cuda";
  p.device = "cuda: NVIDIA H100 80GB HBM3";
  EXPECT_TRUE(check_profile(p, kSha, "cuda: NVIDIA H100 80GB HBM3", "cuda", "round-to-nearest", false).empty());
  EXPECT_THAT([&] { check_profile(p, kSha, "cuda: NVIDIA A100-SXM4-80GB", "cuda", "round-to-nearest", false); },
              ::testing::ThrowsMessage<Error>(HasSubstr("it was tuned on 'cuda: NVIDIA H100 80GB HBM3', and this "
                                                        "machine is 'cuda: NVIDIA A100-SXM4-80GB'")));
  EXPECT_EQ(check_profile(p, kSha, "cuda: NVIDIA A100-SXM4-80GB", "cuda", "round-to-nearest", true).size(), 1u);
  EXPECT_THAT([&] { check_profile(p, kSha, "cpu: Test CPU", "cpu", "round-to-nearest", true); },
              ::testing::ThrowsMessage<Error>(HasSubstr("backend cuda choices cannot run on the cpu backend")));
}

TEST(Profile, ChoicesTheCpuCannotRunAreRefused) {
  Candidate c;
  c.kv_dtype = "fp8_e4m3";
  EXPECT_THAT([&] { check_choice_runs_on(c, "cpu", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("p.yaml: choice.kv_dtype")));
  c = Candidate{};
  c.cuda_graphs = true;
  EXPECT_THAT([&] { check_choice_runs_on(c, "cpu", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("choice.cuda_graphs")));
  c = Candidate{};
  EXPECT_NO_THROW(check_choice_runs_on(c, "cpu", "p.yaml"));
  c.gate_up = "epilogue";
  EXPECT_THAT([&] { check_choice_runs_on(c, "cpu", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("choice.fusions.gate_up: epilogue is a cuda backend kernel")));
}

TEST(Profile, CudaChoicesMapToTheServersSettings) {
  Candidate c;
  c.weight_format = "int4_g128";
  c.kv_dtype = "bf16";
  c.cuda_graphs = true;
  c.gate_up = "epilogue";
  c.rope_in_kv_write = true;
  EXPECT_NO_THROW(check_choice_runs_on(c, "cuda", "p.yaml"));
  const CudaWeightsChoice weights = cuda_weights_choice(c);
  EXPECT_EQ(weights.dtype, "bf16");
  EXPECT_EQ(weights.cuda_weights, "int4_g128");
  const GraphOptions graph = choice_graph_options(c);
  EXPECT_TRUE(graph.fuse_gate_up && graph.gate_up_epilogue && graph.rope_in_kv_write);
  c.weight_format = "f16";
  EXPECT_EQ(cuda_weights_choice(c).dtype, "fp16");
  EXPECT_EQ(cuda_weights_choice(c).cuda_weights, "native");
  EXPECT_THAT([&] { check_choice_runs_on(c, "cuda", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("choice.kv_dtype: the cuda backend keeps its KV cache in the "
                                                        "activation dtype, f16")));
  c.weight_format = "q4_0";
  EXPECT_THAT([&] { check_choice_runs_on(c, "cuda", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("choice.weight_format: q4_0 is not a cuda weight format")));
  // The unfused graph runs on the cuda backend (its add and concat_columns).
  Candidate separate;
  separate.weight_format = "int8";
  separate.kv_dtype = "bf16";
  separate.fuse_add_rms_norm = false;
  separate.fuse_qkv = false;
  separate.gate_up = "separate";
  EXPECT_NO_THROW(check_choice_runs_on(separate, "cuda", "p.yaml"));
  const GraphOptions unfused = choice_graph_options(separate);
  EXPECT_FALSE(unfused.fuse_add_rms_norm || unfused.fuse_qkv || unfused.fuse_gate_up || unfused.gate_up_epilogue);
}

TEST(Profile, TheDecodeSplitChoiceRoundTripsAndIsCudaOnly) {
  Profile p = sample();
  p.backend = "cuda";
  p.choice.weight_format = "int4_g128";
  p.choice.kv_dtype = "bf16";
  p.choice.decode_split_min_tokens = 64;
  const std::string text = profile_yaml(p);
  EXPECT_THAT(text, HasSubstr("decode_split_min_tokens: 64"));
  const Profile q = parse_profile(text, "profile.yaml");
  EXPECT_EQ(q.choice.decode_split_min_tokens, 64);
  EXPECT_NO_THROW(check_choice_runs_on(q.choice, "cuda", "p.yaml"));
  Candidate cpu;
  cpu.decode_split_min_tokens = 64;
  EXPECT_THAT([&] { check_choice_runs_on(cpu, "cpu", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("choice.kernels.decode_split_min_tokens: applies to the cuda "
                                                        "backend's decode attention")));
}

}  // namespace
}  // namespace tessera::tuner
