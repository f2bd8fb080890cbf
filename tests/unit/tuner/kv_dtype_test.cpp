// tests/unit/tuner/kv_dtype_test.cpp: the kv_dtype axis on the cuda backend: fp8_e4m3 is a choice
// the space accepts (with bf16 activations) and a profile carries to the server's cuda_kv_dtype; the
// cpu backend and f16 activations refuse it by field name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "tuner/profile.h"
#include "tuner/space.h"

namespace tessera::tuner {
namespace {

using ::testing::HasSubstr;

std::string refusal(const std::string& yaml) {
  try {
    parse_space(yaml, "space.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KvDtypeAxis, TheCudaSpaceTakesFp8E4m3BesideBf16) {
  const TuneSpace s = parse_space("backend: cuda\nweight_format: [bf16, int4_g128]\nkv_dtype: [bf16, fp8_e4m3]\n",
                                  "space.yaml");
  ASSERT_EQ(s.size(), 4);
  int fp8 = 0;
  for (int64_t i = 0; i < s.size(); ++i) {
    const Candidate c = s.at_index(i);
    if (c.kv_dtype != "fp8_e4m3") continue;
    ++fp8;
    EXPECT_THAT(c.key(), HasSubstr("/kv=fp8_e4m3/"));
    EXPECT_NO_THROW(check_choice_runs_on(c, "cuda", "space.yaml"));
  }
  EXPECT_EQ(fp8, 2);
}

TEST(KvDtypeAxis, RefusesFp8WhereItCannotRunNamingTheField) {
  EXPECT_THAT(refusal("backend: cpu\nkv_dtype: [f32, fp8_e4m3]\n"),
              HasSubstr("kv_dtype[1]: the cpu backend keeps its KV cache in f32"));
  EXPECT_THAT(refusal("backend: cuda\nweight_format: [bf16, f16]\nkv_dtype: [fp8_e4m3]\n"),
              HasSubstr("kv_dtype[0]: fp8_e4m3 needs bf16 activations, and weight_format f16 runs f16 ones"));
  EXPECT_THAT(refusal("backend: cuda\nkv_dtype: [fp8_e5m2]\n"),
              HasSubstr("kv_dtype[0]: the cuda backend keeps its KV cache in bf16, f16, fp8_e4m3, not 'fp8_e5m2'"));
  Candidate f16;
  f16.weight_format = "f16";
  f16.kv_dtype = "fp8_e4m3";
  EXPECT_THAT([&] { check_choice_runs_on(f16, "cuda", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("p.yaml: choice.kv_dtype: fp8_e4m3 needs bf16 activations")));
  Candidate cpu;
  cpu.kv_dtype = "fp8_e4m3";
  EXPECT_THAT([&] { check_choice_runs_on(cpu, "cpu", "p.yaml"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("p.yaml: choice.kv_dtype: the cpu backend keeps its KV cache")));
}

TEST(KvDtypeAxis, AProfileCarriesTheKvDtypeToTheServer) {
  Candidate c;
  c.weight_format = "fp8_e4m3";
  c.kv_dtype = "fp8_e4m3";
  c.cuda_graphs = true;
  EXPECT_NO_THROW(check_choice_runs_on(c, "cuda", "p.yaml"));
  const CudaWeightsChoice server = cuda_weights_choice(c);
  EXPECT_EQ(server.dtype, "bf16");
  EXPECT_EQ(server.cuda_weights, "fp8_e4m3");
  EXPECT_EQ(server.cuda_kv_dtype, "fp8_e4m3");
  c.kv_dtype = "bf16";
  EXPECT_EQ(cuda_weights_choice(c).cuda_kv_dtype, "native");

  Profile p;
  p.path = "profile.yaml";
  p.model_name = "smollm2-135m-instruct";
  p.model_sha256 = std::string(64, 'a');
  p.architecture = "llama";
  p.device = "cuda: NVIDIA H100 80GB HBM3";
  p.backend = "cuda";
  p.tessera_version = "0.1.0";
  p.tessera_commit = "0123456789abcdef0123456789abcdef01234567";
  p.created = "2026-11-26T08:00:00Z";
  p.space = "configs/tune/gpu-smollm2.yaml";
  p.policy = "fastest_decode_within_ppl_pct: 1";
  p.reason = "fastest decode of 64";
  p.measured = {{"perplexity", 19.5}};
  p.choice = c;
  p.choice.kv_dtype = "fp8_e4m3";
  const Profile q = parse_profile(profile_yaml(p), "profile.yaml");
  EXPECT_EQ(q.choice.kv_dtype, "fp8_e4m3");
  EXPECT_EQ(cuda_weights_choice(q.choice).cuda_kv_dtype, "fp8_e4m3");
}

TEST(KvDtypeAxis, TheShippedGpuSpaceTunesBothKvDtypes) {
  const std::string dir = TESSERA_TUNE_CONFIGS;
  std::ifstream in(dir + "/gpu-smollm2.yaml");
  ASSERT_TRUE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const TuneSpace s = parse_space(text, "gpu-smollm2.yaml");
  EXPECT_EQ(s.kv_dtypes, (std::vector<std::string>{"bf16", "fp8_e4m3"}));
  EXPECT_EQ(s.size(), 64);
}

}  // namespace
}  // namespace tessera::tuner
