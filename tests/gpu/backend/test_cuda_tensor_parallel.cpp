// tests/gpu/backend/test_cuda_tensor_parallel.cpp: a model sharded over two GPUs (NCCL all-reduce)
// against the same weights on one: the tiny-llama fixture, a random hd128 Llama in every weight
// format and one at the 7B shape's widths; chunked prefill then paged decode, CUDA graphs on and off
// (a replayed step replays its all-reduces), steps of more rows than the one-shot all-reduce takes
// (NCCL) and of fewer, every mask policy; a batch against each of its sequences alone; and an
// aborted group, or a rank that fails mid-step, failing the step and the backend instead of
// hanging. Skips without two GPUs.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "engine/follower_ranks.h"
#include "engine/generation.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "tests/error_of.h"
#include "tests/gpu/backend/backend_test_util.h"
#include "tests/unit/scheduler/engine_test_util.h"

namespace tessera {
namespace {

using backend_test::rel_l2;

#define REQUIRE_TWO_GPUS()                                                                            \
  do {                                                                                                \
    if (::tessera::cuda_device_count() < 2) GTEST_SKIP() << "no CUDA GPU present: tensor parallelism needs 2"; \
  } while (0)

// A model on `ranks` GPUs (0, 1, ...), joined into one group when more than one.
struct GpuRanks {
  // follower_fails_at > 0: rank 1's forward throws at that call (test::FaultyLm::failing_at_call).
  GpuRanks(int ranks, const ModelConfig& config, const WeightStore& store, CudaBackendConfig backend_config,
           int follower_fails_at = 0) {
    std::vector<CudaBackend*> group;
    for (int r = 0; r < ranks; ++r) {
      backend_config.device = r;
      auto backend = std::make_unique<CudaBackend>(backend_config);
      group.push_back(backend.get());
      backends.push_back(std::move(backend));
    }
    if (ranks > 1) CudaBackend::form_group(group);
    model = ShardedModel::load(backends, [&](Backend& rank) {
      // The graph a model is served with (both CUDA fusions), on every rank.
      std::unique_ptr<CausalLm> lm = make_causal_lm(config, store, rank, default_graph_options(config, rank));
      if (rank.tensor_parallel_rank() != 1 || follower_fails_at == 0) return lm;
      return test::FaultyLm::failing_at_call(std::move(lm), follower_fails_at);
    });
  }
  Generator generator(GeneratorConfig gc = {}) { return Generator(model.first(), *backends.front(), gc, model.followers); }
  std::vector<std::unique_ptr<Backend>> backends;
  ShardedModel model;
};

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Each step's logits on a generator: a 150-token prompt in chunks of 130 (more rows than the
// one-shot all-reduce takes: NCCL) and 20 (one-shot; it reads the first chunk's paged K/V), then 8
// greedy decode steps (the second of a shape is captured with graphs on, later ones replay), the
// tokens picked from the first generator run (`picks`); every step under `policy`.
std::vector<std::vector<float>> run_steps(Generator& generator, std::span<const int32_t> prompt,
                                          std::vector<int32_t>& decoded, bool picks,
                                          const MaskPolicy& policy = MaskPolicy::causal()) {
  std::vector<std::vector<float>> steps;
  for (int step = 0; step < 10; ++step) {
    const std::span<const int32_t> tokens =
        step == 0 ? prompt.first(130)
        : step == 1 ? prompt.subspan(130)
                    : std::span<const int32_t>(decoded).subspan(static_cast<size_t>(step - 2), 1);
    const Generator::SequenceInput in{1, tokens, &policy};
    steps.push_back(generator.step(std::span(&in, 1))[0]);
    if (picks && step >= 1) decoded.push_back(argmax(steps.back()));
  }
  return steps;
}

// The model on two GPUs against one in the same format: within bf16 rounding for bf16 weights. A
// quantized format's scales are per row of each rank's shard (o_proj and down are split by columns),
// so two ranks quantize those differently from one: there, the two-GPU model must be as close to
// the one-GPU bf16 model as the one-GPU quantized model is.
void expect_two_ranks_match_one(const ModelConfig& config, const WeightStore& store, CudaBackendConfig bc) {
  GeneratorConfig gc;
  gc.block_size = 16;
  const std::vector<int32_t> prompt = backend_test::random_prompt(150, config.vocab_size, 5);
  std::vector<int32_t> decoded;
  CudaBackendConfig reference_config = bc;
  reference_config.linear_weights = ScalarType::kBF16;
  GpuRanks reference(1, config, store, reference_config);
  Generator g_reference = reference.generator(gc);
  const auto want = run_steps(g_reference, prompt, decoded, true);
  GpuRanks one(1, config, store, bc), two(2, config, store, bc);
  Generator g1 = one.generator(gc), g2 = two.generator(gc);
  const auto a = run_steps(g1, prompt, decoded, false);
  const auto b = run_steps(g2, prompt, decoded, false);
  const bool quantized = bc.linear_weights != ScalarType::kBF16;
  for (size_t step = 0; step < want.size(); ++step) {
    if (!quantized) {
      EXPECT_LT(rel_l2(b[step], a[step]), 3e-2) << "step " << step;
    } else {
      EXPECT_LT(rel_l2(b[step], want[step]), 1.5 * rel_l2(a[step], want[step]) + 1e-2) << "step " << step;
    }
  }
}

TEST(TensorParallelGpu, FixtureOnTwoGpusMatchesOne) {
  REQUIRE_TWO_GPUS();
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  const ModelConfig config = load_model_config(files);
  const WeightStore store = load_weights(files);
  for (const bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs on" : "graphs off");
    CudaBackendConfig bc;
    bc.cuda_graphs = graphs;
    expect_two_ranks_match_one(config, store, bc);
  }
}

// The policies besides causal: a sliding window with sinks narrower than the prompt through
// chunked prefill and decode; document packing with a shared prefix and a bidirectional prompt in
// one step each (they do not decode).
TEST(TensorParallelGpu, EveryMaskPolicyOnTwoGpusMatchesOne) {
  REQUIRE_TWO_GPUS();
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  const ModelConfig config = load_model_config(files);
  const WeightStore store = load_weights(files);
  GpuRanks one(1, config, store, CudaBackendConfig{}), two(2, config, store, CudaBackendConfig{});
  GeneratorConfig gc;
  gc.block_size = 16;
  const std::vector<int32_t> prompt = backend_test::random_prompt(150, config.vocab_size, 7);
  {
    SCOPED_TRACE("sliding window 48, 4 sinks");
    Generator g1 = one.generator(gc), g2 = two.generator(gc);
    std::vector<int32_t> decoded;
    const MaskPolicy window = MaskPolicy::sliding_window(48, 4);
    const auto a = run_steps(g1, prompt, decoded, true, window);
    const auto b = run_steps(g2, prompt, decoded, false, window);
    for (size_t step = 0; step < a.size(); ++step) EXPECT_LT(rel_l2(b[step], a[step]), 3e-2) << "step " << step;
  }
  const std::vector<std::pair<const char*, MaskPolicy>> whole = {
      {"segments 60 + 40, shared prefix 20", MaskPolicy::segments({60, 40}, 20)},
      {"bidirectional", MaskPolicy::bidirectional()}};
  for (const auto& [name, policy] : whole) {
    SCOPED_TRACE(name);
    Generator g1 = one.generator(gc), g2 = two.generator(gc);
    const std::span<const int32_t> tokens = std::span(prompt).first(120);
    const Generator::SequenceInput in{1, tokens, &policy};
    EXPECT_LT(rel_l2(g2.step(std::span(&in, 1))[0], g1.step(std::span(&in, 1))[0]), 3e-2);
  }
}

TEST(TensorParallelGpu, Hd128LlamaOnTwoGpusMatchesOneInEveryWeightFormat) {
  REQUIRE_TWO_GPUS();
  const backend_test::RandomModel model = backend_test::random_llama({.source = "random hd128",
                                                                      .hidden = 1024,
                                                                      .intermediate = 2816,
                                                                      .num_heads = 8,
                                                                      .num_kv_heads = 4,
                                                                      .head_dim = 128,
                                                                      .vocab = 1024});
  for (const ScalarType weights : {ScalarType::kBF16, ScalarType::kInt8PerRow, ScalarType::kFp8E4M3PerRow,
                                   ScalarType::kInt4G128}) {
    for (const bool graphs : {true, false}) {
      SCOPED_TRACE(std::string(scalar_type_name(weights)) + (graphs ? ", graphs on" : ", graphs off"));
      CudaBackendConfig bc;
      bc.linear_weights = weights;
      bc.cuda_graphs = graphs;
      expect_two_ranks_match_one(model.config, model.store, bc);
    }
  }
}

// The Llama-2-7B shape's widths (hidden 4096, 32 heads and KV heads, FFN 11008, vocabulary 32000:
// the lm_head splits by vocabulary), two of its 32 layers, bf16.
TEST(TensorParallelGpu, SevenBShapeOnTwoGpusMatchesOne) {
  REQUIRE_TWO_GPUS();
  const backend_test::RandomModel model = backend_test::random_llama({.source = "random llama2-7b widths",
                                                                      .hidden = 4096,
                                                                      .intermediate = 11008,
                                                                      .num_heads = 32,
                                                                      .num_kv_heads = 32,
                                                                      .head_dim = 128,
                                                                      .vocab = 32000});
  expect_two_ranks_match_one(model.config, model.store, CudaBackendConfig{});
}

TEST(TensorParallelGpu, ABatchGivesEachSequenceItsSoloLogits) {
  REQUIRE_TWO_GPUS();
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  const ModelConfig config = load_model_config(files);
  GpuRanks two(2, config, load_weights(files), CudaBackendConfig{});
  GeneratorConfig gc;
  gc.num_blocks = 160;
  Generator batched = two.generator(gc), solo = two.generator(gc);
  const MaskPolicy causal = MaskPolicy::causal();
  constexpr int kSeqs = 64;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSeqs; ++i) {
    prompts.push_back(backend_test::random_prompt(static_cast<size_t>(3 + i % 13), config.vocab_size, 100 + i));
  }
  std::vector<Generator::SequenceInput> batch;
  for (int i = 0; i < kSeqs; ++i) batch.push_back({static_cast<SeqId>(i + 1), prompts[static_cast<size_t>(i)], &causal});
  const auto together = batched.step(batch);
  for (int i = 0; i < kSeqs; ++i) {
    const auto alone = solo.step(std::span(&batch[static_cast<size_t>(i)], 1));
    EXPECT_LT(rel_l2(alone[0], together[static_cast<size_t>(i)]), 3e-2) << "sequence " << i;
  }
}

TEST(TensorParallelGpu, AnAbortedGroupFailsTheStepAndTheBackend) {
  REQUIRE_TWO_GPUS();
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  const ModelConfig config = load_model_config(files);
  GpuRanks two(2, config, load_weights(files), CudaBackendConfig{});
  Generator g = two.generator();
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<int32_t> prompt = {1, 2, 3};
  const Generator::SequenceInput in{1, prompt, &causal};
  g.step(std::span(&in, 1));
  two.backends[1]->abort_collectives();  // what a failing rank does for every rank
  two.backends[0]->abort_collectives();
  const std::vector<int32_t> next = {4};
  const Generator::SequenceInput again{1, next, &causal};
  EXPECT_THROW(g.step(std::span(&again, 1)), Error);
  EXPECT_FALSE(two.backends[0]->failure().empty());
}

// Rank 1 fails before its second forward (the first decode step) while rank 0 runs that step and
// waits for it in its first all-reduce: the step fails with rank 1's error and no rank hangs.
// (Replayed graphs call no forward, so the failure is injected where a forward still runs.)
TEST(TensorParallelGpu, ARankThatFailsMidStepEndsTheStepWithoutAHang) {
  REQUIRE_TWO_GPUS();
  const ModelFiles files = locate_model(std::string(TESSERA_GOLDEN_FIXTURES) + "/tiny-llama");
  const ModelConfig config = load_model_config(files);
  GpuRanks two(2, config, load_weights(files), CudaBackendConfig{}, /*follower_fails_at=*/2);
  Generator g = two.generator();
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  const Generator::SequenceInput first{1, prompt, &causal};
  std::vector<int32_t> next;
  EXPECT_EQ(error_of([&] { next = {argmax(g.step(std::span(&first, 1))[0])}; }), "");
  const Generator::SequenceInput second{1, next, &causal};
  const std::string error = error_of([&] { g.step(std::span(&second, 1)); });
  EXPECT_NE(error.find("injected failure in forward 2"), std::string::npos) << error;
  EXPECT_FALSE(two.backends[0]->failure().empty());
}

}  // namespace
}  // namespace tessera
