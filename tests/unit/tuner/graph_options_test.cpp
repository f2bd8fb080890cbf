// tests/unit/tuner/graph_options_test.cpp: every fusion switch a profile can turn off computes the same
// logits as the fused graph (the tiny Llama fixture, fp32 and requantized Q8_0 weights), and the
// unfused graph really loads separate projections.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "common/error.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "kernels/backend/mask_policy.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/weights/requantize.h"

namespace tessera {
namespace {

std::vector<float> logits_of(const GraphOptions& options, std::optional<DType> format, std::string* groups = nullptr) {
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  const ModelConfig config = load_model_config(files);
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  WeightStore weights = load_weights(files);
  if (format) weights = requantize_weights(std::move(weights), *format);
  const std::unique_ptr<CausalLm> lm = make_causal_lm(config, weights, backend, options);
  if (groups != nullptr) {
    for (const auto& g : backend.weight_groups()) *groups += g.group + ":" + g.format + " ";
  }
  std::vector<int32_t> ids(13);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % 128);
  const MaskPolicy causal = MaskPolicy::causal();
  const AttentionPlan::Sequence seq{13, 13, &causal, {}};
  AttentionPlan plan = AttentionPlan::build(std::span(&seq, 1), 0);
  std::vector<int32_t> rows(13);
  std::iota(rows.begin(), rows.end(), 0);
  ForwardBatch batch;
  batch.token_ids = ids;
  batch.plan = &plan;
  return backend.download(lm->forward(batch, nullptr, rows));
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

TEST(GraphOptions, EveryUnfusedGraphMatchesTheFusedOne) {
  for (std::optional<DType> format : {std::optional<DType>{}, std::optional<DType>{DType::kQ8_0}}) {
    const std::vector<float> fused = logits_of(GraphOptions{}, format);
    for (int mask = 1; mask < 8; ++mask) {
      GraphOptions o;
      o.fuse_add_rms_norm = (mask & 1) == 0;
      o.fuse_qkv = (mask & 2) == 0;
      o.fuse_gate_up = (mask & 4) == 0;
      const std::vector<float> unfused = logits_of(o, format);
      ASSERT_EQ(unfused.size(), fused.size());
      // fp32: only summation order differs. Q8_0: the same weights, activations quantized per GEMM
      // input row either way, so again only rounding.
      EXPECT_LT(max_rel_diff(unfused, fused), 1e-4) << o.describe() << (format ? " q8_0" : " f32");
    }
  }
}

TEST(GraphOptions, SeparateProjectionsAreLoadedSeparately) {
  std::string fused_groups, separate_groups;
  logits_of(GraphOptions{}, DType::kQ8_0, &fused_groups);
  GraphOptions o;
  o.fuse_qkv = false;
  o.fuse_gate_up = false;
  logits_of(o, DType::kQ8_0, &separate_groups);
  EXPECT_NE(fused_groups.find("model.layers.{L}.qkv:q8_0"), std::string::npos) << fused_groups;
  EXPECT_EQ(separate_groups.find(".qkv:"), std::string::npos) << separate_groups;
  EXPECT_NE(separate_groups.find("model.layers.{L}.self_attn.q_proj.weight:q8_0"), std::string::npos) << separate_groups;
  EXPECT_NE(separate_groups.find("model.layers.{L}.mlp.gate_proj.weight:q8_0"), std::string::npos) << separate_groups;
  EXPECT_EQ(o.describe(), "add_rms_norm=fused qkv=separate gate_up=separate");
}

// The fusions beyond the default graph are GPU kernels: the CPU backend refuses each by the name of
// its tuner field before loading anything, and the epilogue needs the stacked gate-up weight.
TEST(GraphOptions, CpuRefusesTheGpuFusionsByName) {
  auto error_of = [](const GraphOptions& o) -> std::string {
    try {
      logits_of(o, std::nullopt);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  GraphOptions epilogue;
  epilogue.gate_up_epilogue = true;
  EXPECT_NE(error_of(epilogue).find("fusions.gate_up: epilogue (SiLU·mul in the gate-up GEMM) is not available on the "
                                    "cpu backend"),
            std::string::npos)
      << error_of(epilogue);
  GraphOptions rope;
  rope.rope_in_kv_write = true;
  EXPECT_NE(error_of(rope).find("fusions.rope_kv_write: fused (RoPE applied while K is written to the cache) is not "
                                "available on the cpu backend"),
            std::string::npos)
      << error_of(rope);
  GraphOptions unstacked = epilogue;
  unstacked.fuse_gate_up = false;
  EXPECT_NE(error_of(unstacked).find("fusions.gate_up: epilogue needs the gate and up projections stacked"),
            std::string::npos)
      << error_of(unstacked);
  GraphOptions both = epilogue;
  both.rope_in_kv_write = true;
  EXPECT_EQ(both.describe(), "add_rms_norm=fused qkv=fused gate_up=epilogue rope_kv_write=fused");
  EXPECT_EQ(GraphOptions{}.describe(), "add_rms_norm=fused qkv=fused gate_up=fused");
}

TEST(GraphOptions, AModelWithoutAProfileRunsTheFusionsItsBackendHas) {
  const ModelConfig llama = load_model_config(locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama"));
  CpuBackend backend(CpuBackendOptions{.num_threads = 1});
  EXPECT_EQ(default_graph_options(llama, backend).describe(), GraphOptions{}.describe());
}

}  // namespace
}  // namespace tessera
