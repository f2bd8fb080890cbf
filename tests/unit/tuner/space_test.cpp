// tests/unit/tuner/space_test.cpp: the tuner's space file: what it accepts, and that every refusal
// names the field (unknown keys included).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tuner/space.h"

namespace tessera::tuner {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string refusal(const std::string& yaml) {
  try {
    parse_space(yaml, "space.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(TuneSpace, DefaultsAreOneCandidateAndTheStandardShapes) {
  const TuneSpace s = parse_space("backend: cpu\n", "space.yaml");
  EXPECT_EQ(s.size(), 1);
  EXPECT_EQ(s.measure.prefill_tokens, (std::vector<int>{128, 512, 2048}));
  EXPECT_EQ(s.measure.decode_batch, (std::vector<int>{1, 8, 32, 64}));
  EXPECT_EQ(s.policy.kind, Policy::Kind::kFastestDecodeWithinPplPct);
  EXPECT_EQ(s.all().front().key(), "gguf/kv=f32/arn=fused/qkv=fused/gu=fused/rope=separate/graphs=off/t0");
}

TEST(TuneSpace, EnumeratesTheProductOfItsAxes) {
  const TuneSpace s = parse_space(R"(
backend: cpu
weight_format: [gguf, q8_0, q4_0]
fusions: {add_rms_norm: [fused, separate], qkv: [fused, separate], gate_up: [fused, separate]}
kernels: {threads: [1, 2]}
measure: {prefill_tokens: [128], decode_batch: [1, 8], repeats: 3}
policy: {best_quality_within_memory_mb: 150}
)", "space.yaml");
  EXPECT_EQ(s.size(), 3 * 2 * 2 * 2 * 2);
  const std::vector<Candidate> all = s.all();
  ASSERT_EQ(all.size(), 48u);
  EXPECT_EQ(all.front().weight_format, "gguf");
  EXPECT_EQ(all.back().weight_format, "q4_0");
  EXPECT_FALSE(all.back().fuse_add_rms_norm);
  EXPECT_EQ(all.back().gate_up, "separate");
  EXPECT_EQ(all.back().threads, 2);
  std::vector<std::string> keys;
  for (const Candidate& c : all) keys.push_back(c.key());
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(std::unique(keys.begin(), keys.end()), keys.end()) << "keys are unique";
  EXPECT_EQ(s.policy.kind, Policy::Kind::kBestQualityWithinMemoryMb);
  EXPECT_DOUBLE_EQ(s.policy.value, 150.0);
}

TEST(TuneSpace, UnknownKeysAreRefusedByName) {
  EXPECT_THAT(refusal("backend: cpu\nweight_formats: [q8_0]\n"), HasSubstr("unknown key 'weight_formats'"));
  EXPECT_THAT(refusal("fusions: {qkv: [fused], rope_in_attention: [fused]}\n"),
              HasSubstr("unknown key 'fusions.rope_in_attention'"));
  EXPECT_THAT(refusal("measure: {decode_batches: [1]}\n"), HasSubstr("unknown key 'measure.decode_batches'"));
  EXPECT_THAT(refusal("policy: {fastest_decode: 1}\n"), HasSubstr("unknown key 'policy.fastest_decode'"));
}

TEST(TuneSpace, BadValuesAreRefusedNamingTheField) {
  EXPECT_THAT(refusal("backend: tpu\n"), HasSubstr("backend: expected cpu or cuda, got 'tpu'"));
  EXPECT_THAT(refusal("weight_format: [q8_0, q3_k]\n"), HasSubstr("weight_format[1]: unknown weight format 'q3_k'"));
  EXPECT_THAT(refusal("fusions: {qkv: [fused, both]}\n"), HasSubstr("fusions.qkv[1]: expected fused or separate, got 'both'"));
  EXPECT_THAT(refusal("measure: {decode_batch: [1, 0]}\n"), HasSubstr("measure.decode_batch[1]: expected 1.."));
  EXPECT_THAT(refusal("measure: {repeats: many}\n"), HasSubstr("measure.repeats: expected an integer, got 'many'"));
  EXPECT_THAT(refusal("weight_format: []\n"), HasSubstr("weight_format: the list is empty"));
  EXPECT_THAT(refusal("weight_format: [q8_0, q8_0]\n"), HasSubstr("weight_format[1]: 'q8_0' is listed twice"));
  EXPECT_THAT(refusal("search: {population: 6}\n"), HasSubstr("search.population: NSGA-II needs a multiple of 4"));
  EXPECT_THAT(refusal("policy: {fastest_decode_within_ppl_pct: 1, best_quality_within_memory_mb: 100}\n"),
              HasSubstr("give one policy, not 2"));
  EXPECT_THAT(refusal("fusions: [fused]\n"), HasSubstr("fusions: expected a mapping"));
}

TEST(TuneSpace, GpuOnlyChoicesAreRefusedOnTheCpuNamingTheField) {
  EXPECT_THAT(refusal("backend: cpu\nweight_format: [q8_0, fp8_e4m3]\n"),
              HasSubstr("weight_format[1]: fp8_e4m3 is a GPU weight format (backend: cuda)"));
  EXPECT_THAT(refusal("backend: cpu\nweight_format: [int4_g128]\n"), HasSubstr("weight_format[0]: int4_g128 is a GPU"));
  EXPECT_THAT(refusal("backend: cpu\nkv_dtype: [fp8_e4m3]\n"), HasSubstr("kv_dtype[0]: the cpu backend keeps its KV cache in f32"));
  EXPECT_THAT(refusal("backend: cpu\ncuda_graphs: [true, false]\n"), HasSubstr("cuda_graphs: true needs the cuda backend"));
  EXPECT_THAT(refusal("fusions: {rope_kv_write: [fused, separate]}\n"),
              HasSubstr("fusions.rope_kv_write: fused (RoPE applied while K is written to the cache) is a cuda backend "
                        "kernel; the cpu backend runs [separate]"));
  EXPECT_THAT(refusal("fusions: {gate_up: [epilogue]}\n"), HasSubstr("fusions.gate_up[0]: epilogue"));
  EXPECT_THAT(refusal("kernels: {activation_bits: [16, 4]}\n"), HasSubstr("kernels.activation_bits[1]: expected 8 or 16"));
  EXPECT_THAT(refusal("backend: cuda\nkernels: {activation_bits: [8]}\n"),
              HasSubstr("kernels.activation_bits: applies to the cpu backend"));
  const TuneSpace bits = parse_space("kernels: {activation_bits: [16, 8]}\n", "space.yaml");
  ASSERT_EQ(bits.size(), 2);
  EXPECT_EQ(bits.at_index(1).activation_bits, 8);
  EXPECT_EQ(bits.at_index(1).key(), "gguf/kv=f32/arn=fused/qkv=fused/gu=fused/rope=separate/graphs=off/t0/a8");
}

TEST(TuneSpace, TheGpuSchemaNamesGpuFormatsAndRefusesCpuOnes) {
  const TuneSpace s = parse_space("backend: cuda\nweight_format: [bf16, fp8_e4m3, int8, int4_g128]\n"
                                  "kv_dtype: [bf16]\ncuda_graphs: [true, false]\n"
                                  "fusions: {gate_up: [fused, epilogue], rope_kv_write: [separate, fused]}\n",
                                  "space.yaml");
  EXPECT_EQ(s.size(), 4 * 2 * 2 * 2);
  EXPECT_EQ(parse_space("backend: cuda\nkv_dtype: [bf16, fp8_e4m3]\n", "space.yaml").size(), 2);  // kv_dtype_test
  EXPECT_THAT(refusal("backend: cuda\nweight_format: [q4_0]\n"), HasSubstr("weight_format[0]: q4_0 is a CPU weight format"));
  // The cuda backend runs unfused graphs too (Backend::add, concat_columns).
  const TuneSpace unfused = parse_space("backend: cuda\nweight_format: [bf16]\nkv_dtype: [bf16]\nfusions: "
                                        "{add_rms_norm: [fused, separate], qkv: [separate], gate_up: [separate]}\n",
                                        "space.yaml");
  EXPECT_EQ(unfused.size(), 2);
  EXPECT_FALSE(unfused.at_index(1).fuse_add_rms_norm);
  EXPECT_FALSE(unfused.at_index(1).fuse_qkv);
}

TEST(TuneSpace, DecodeSplitIsACudaKernelChoice) {
  const TuneSpace s = parse_space("backend: cuda\nweight_format: [bf16, int4_g128]\nkv_dtype: [bf16]\n"
                                  "kernels: {decode_split_min_tokens: [64, 128]}\n",
                                  "space.yaml");
  ASSERT_EQ(s.size(), 4);
  EXPECT_EQ(s.at_index(0).decode_split_min_tokens, 64);
  EXPECT_EQ(s.at_index(1).decode_split_min_tokens, 128);
  EXPECT_THAT(s.at_index(0).key(), HasSubstr("/s64"));
  EXPECT_NE(s.at_index(0).key(), s.at_index(1).key());
  // Unset, the kernel's default: keys stay as they were, so earlier runs still resume.
  const TuneSpace plain = parse_space("backend: cuda\nweight_format: [bf16]\nkv_dtype: [bf16]\n", "space.yaml");
  EXPECT_EQ(plain.at_index(0).decode_split_min_tokens, 0);
  EXPECT_THAT(plain.at_index(0).key(), Not(HasSubstr("/s")));
  EXPECT_THAT(refusal("backend: cuda\nkernels: {decode_split_min_tokens: [64, 48]}\n"),
              HasSubstr("kernels.decode_split_min_tokens[1]: expected a multiple of 32 in [32, 1024]"));
  EXPECT_THAT(refusal("kernels: {decode_split_min_tokens: [64]}\n"),
              HasSubstr("decode_split_min_tokens: applies to the cuda backend's decode attention only"));
}

}  // namespace
}  // namespace tessera::tuner
