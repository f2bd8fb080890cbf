// tests/unit/scheduler/tensor_parallel_test.cpp: a model sharded over two ranks of the CPU backend
// (HostCollective: the same graph, shards and executors as on GPUs, with a host all-reduce) gives
// the logits of the whole model on one rank (its lm_head split by vocabulary or replicated), for
// each mask policy, through chunked prefill and paged decode; the serving engine on two ranks
// streams what it streams on one, and a cancel or a deadline frees every block; a model whose heads
// do not split is refused naming them; an aborted group fails the step instead of hanging, as does
// a rank that fails mid-step; HostCollective's all-gather; and the weight slices a rank loads.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/follower_ranks.h"
#include "engine/generation.h"
#include "engine/scheduler/engine_loop.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "kernels/backend/host_collective.h"
#include "models/llama.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tensor_shard.h"
#include "tests/error_of.h"
#include "tests/unit/scheduler/engine_test_util.h"
#include "tests/unit/scheduler/letter_tokenizer.h"

namespace tessera {
namespace {

std::string fixture(const char* name) { return std::string(TESSERA_GOLDEN_FIXTURES) + "/" + name; }

// A fixture loaded on `ranks` CPU backends joined into one group (one backend, in none, for 1).
struct ShardedFixture {
  // follower_fails_at > 0: rank 1's forward throws at that call (test::FaultyLm::failing_at_call).
  ShardedFixture(const char* name, int32_t ranks, const GraphOptions& options = {}, int follower_fails_at = 0)
      : group(std::make_shared<HostCollective>(ranks)) {
    const ModelFiles files = locate_model(fixture(name));
    config = load_model_config(files);
    const WeightStore weights = load_weights(files);
    for (int32_t r = 0; r < ranks; ++r) {
      auto backend = std::make_unique<CpuBackend>(1);
      if (ranks > 1) backend->join_group(group, r);
      backends.push_back(std::move(backend));
    }
    model = ShardedModel::load(backends, [&](Backend& rank) {
      std::unique_ptr<CausalLm> lm = make_causal_lm(config, weights, rank, options);
      if (rank.tensor_parallel_rank() != 1 || follower_fails_at == 0) return lm;
      return test::FaultyLm::failing_at_call(std::move(lm), follower_fails_at);
    });
  }
  Generator generator(GeneratorConfig gc = {}) {
    return Generator(model.first(), *backends.front(), gc, model.followers);
  }
  std::shared_ptr<HostCollective> group;
  ModelConfig config;
  std::vector<std::unique_ptr<Backend>> backends;
  ShardedModel model;
};

float max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size());
    for (size_t j = 0; j < a[i].size() && j < b[i].size(); ++j) m = std::max(m, std::abs(a[i][j] - b[i][j]));
  }
  return m;
}

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

TEST(TensorParallel, TwoRanksGiveTheWholeModelsLogits) {
  ShardedFixture one("tiny-llama", 1), two("tiny-llama", 2);
  GeneratorConfig gc;
  gc.block_size = 4;
  Generator g1 = one.generator(gc), g2 = two.generator(gc);
  std::vector<int32_t> prompt(13);
  std::iota(prompt.begin(), prompt.end(), 5);
  // Each policy's steps: causal and sliding window run the prompt in chunks of 8 and 5 (the second
  // reads the first's paged K/V), then decode 6 tokens; document packing runs its prompt whole.
  struct Case {
    const char* name;
    MaskPolicy policy;
    bool decodes;
  };
  const std::vector<Case> cases = {{"causal", MaskPolicy::causal(), true},
                                   {"sliding window 5, 2 sinks", MaskPolicy::sliding_window(5, 2), true},
                                   {"segments 6 + 7, shared prefix 3", MaskPolicy::segments({6, 7}, 3), false}};
  SeqId id = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::span<const int32_t>> steps = {std::span(prompt)};
    if (c.decodes) steps = {std::span(prompt).first(8), std::span(prompt).subspan(8)};
    std::vector<int32_t> next(1);
    const int total = c.decodes ? 8 : 1;
    for (int step = 0; step < total; ++step) {
      const size_t s = static_cast<size_t>(step);
      const std::span<const int32_t> tokens = s < steps.size() ? steps[s] : std::span<const int32_t>(next);
      const Generator::SequenceInput in{id, tokens, &c.policy};
      const auto a = g1.step(std::span(&in, 1));
      const auto b = g2.step(std::span(&in, 1));
      EXPECT_LT(max_abs_diff(a, b), 1e-4f) << "step " << step;
      EXPECT_EQ(argmax(a[0]), argmax(b[0])) << "step " << step;
      next[0] = argmax(a[0]);
    }
    g1.release(id);
    g2.release(id);
    ++id;
  }
}

TEST(TensorParallel, ABatchOfSequencesMatchesOneRank) {
  ShardedFixture one("tiny-llama", 1), two("tiny-llama", 2);
  Generator g1 = one.generator(), g2 = two.generator();
  const MaskPolicy causal = MaskPolicy::causal();
  std::vector<std::vector<int32_t>> prompts = {{3, 9, 27}, {1}, {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50}};
  std::vector<Generator::SequenceInput> batch;
  for (size_t i = 0; i < prompts.size(); ++i) batch.push_back({static_cast<SeqId>(i + 1), prompts[i], &causal});
  EXPECT_LT(max_abs_diff(g1.step(batch), g2.step(batch)), 1e-4f);
}

TEST(TensorParallel, AnLmHeadSplitByVocabularyGivesTheReplicatedOnesLogits) {
  GraphOptions replicated;
  replicated.split_lm_head = false;
  ShardedFixture split("tiny-llama", 2), whole("tiny-llama", 2, replicated);
  Generator gs = split.generator(), gw = whole.generator();
  const MaskPolicy causal = MaskPolicy::causal();
  std::vector<std::vector<int32_t>> prompts = {{3, 9, 27}, {1}, {40, 41, 42, 43, 44}};
  for (size_t rows : {size_t{1}, prompts.size()}) {  // one row gathers in place; several are joined by column
    std::vector<Generator::SequenceInput> batch;
    for (size_t i = 0; i < rows; ++i) batch.push_back({static_cast<SeqId>(10 * rows + i), prompts[i], &causal});
    const auto a = gs.step(batch), b = gw.step(batch);
    ASSERT_EQ(a.size(), rows);
    EXPECT_EQ(a[0].size(), static_cast<size_t>(split.config.vocab_size));
    EXPECT_LT(max_abs_diff(a, b), 1e-5f) << rows << " rows";
  }
}

TEST(TensorParallel, AVocabularyThatDoesNotSplitKeepsTheLmHeadWhole) {
  LlamaHyperParams hp;
  hp.vocab_size = 129;
  const TensorShard two{1, 2};
  EXPECT_FALSE(lm_head_shard(hp, GraphOptions{}, two).split());
  hp.vocab_size = 128;
  EXPECT_EQ(lm_head_shard(hp, GraphOptions{}, two).first(hp.vocab_size), 64);
  GraphOptions replicated;
  replicated.split_lm_head = false;
  EXPECT_FALSE(lm_head_shard(hp, replicated, two).split());
}

TEST(HostCollective, AllGatherStacksEveryRanksPartByRank) {
  HostCollective group(3);
  std::vector<std::vector<float>> whole(3, std::vector<float>(6, -1.0f));
  std::vector<std::thread> ranks;
  for (int32_t r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      const std::vector<float> part = {10.0f * r, 10.0f * r + 1};
      group.all_gather(r, part.data(), whole[static_cast<size_t>(r)].data(), 2);
    });
  }
  for (std::thread& t : ranks) t.join();
  const std::vector<float> expected = {0, 1, 10, 11, 20, 21};
  for (const auto& w : whole) EXPECT_EQ(w, expected);
}

// The serving engine over a fixture's shards: rank 0's model on the engine's backend, the others
// as ServedLm::other_ranks.
std::unique_ptr<EngineLoop> sharded_engine(ShardedFixture& f, test::RecordingObserver& observer) {
  EngineLoop::ServedLm lm;
  lm.name = "tiny";
  lm.config = f.config;
  lm.model = std::move(f.model.shards.front());
  for (size_t r = 1; r < f.model.shards.size(); ++r) {
    lm.other_ranks.push_back({std::move(f.model.shards[r]), f.backends[r].get()});
  }
  lm.tokenizer = std::make_shared<test::LetterTokenizer>(f.config.vocab_size);
  std::vector<EngineLoop::ServedLm> lms;
  lms.push_back(std::move(lm));
  EngineConfig config;
  config.kv_num_blocks = 128;
  auto engine = std::make_unique<EngineLoop>(config, *f.backends.front(), std::move(lms),
                                             std::vector<EngineLoop::ServedEncoder>{}, &observer);
  engine->start();
  return engine;
}

GenerateRequest greedy(int i, int32_t max_tokens) {
  GenerateRequest r;
  r.model = "tiny";
  for (int t = 0; t < 3 + (i * 7) % 30; ++t) r.prompt.push_back(static_cast<int32_t>(3 + (i * 31 + t * 17) % 120));
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

TEST(TensorParallel, TheEngineOnTwoRanksStreamsWhatItStreamsOnOne) {
  ShardedFixture one("tiny-llama", 1), two("tiny-llama", 2);
  test::RecordingObserver observer_one, observer_two;
  auto engine_one = sharded_engine(one, observer_one);
  auto engine_two = sharded_engine(two, observer_two);
  constexpr int kRequests = 16;
  std::vector<std::shared_ptr<RequestStream>> a, b;
  for (int i = 0; i < kRequests; ++i) {
    a.push_back(engine_one->submit_generate(greedy(i, 4 + i % 9)).stream);
    b.push_back(engine_two->submit_generate(greedy(i, 4 + i % 9)).stream);
  }
  for (int i = 0; i < kRequests; ++i) {
    const test::Collected want = test::collect(*a[static_cast<size_t>(i)]);
    const test::Collected got = test::collect(*b[static_cast<size_t>(i)]);
    EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
  }
}

TEST(TensorParallel, CancelsAndDeadlinesOnTwoRanksFreeEveryBlock) {
  ShardedFixture two("tiny-llama", 2);
  test::RecordingObserver observer;
  observer.step_sleep_ms = 2;  // steps slow enough that the cancels and deadlines land mid-generation
  auto engine = sharded_engine(two, observer);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest r = greedy(i, 200);
    if (i % 2 == 1) r.deadline = Clock::now() + std::chrono::milliseconds(30);
    streams.push_back(engine->submit_generate(std::move(r)).stream);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (size_t i = 0; i < streams.size(); i += 2) streams[i]->cancel();
  for (size_t i = 0; i < streams.size(); ++i) {
    const test::Collected c = test::collect(*streams[i], std::chrono::seconds(10));
    EXPECT_EQ(c.final_event.finish_reason, i % 2 == 1 ? RequestFinishReason::kDeadline : RequestFinishReason::kCancelled)
        << "request " << i;
  }
  EXPECT_EQ(test::settled_stats(*engine).kv_blocks_used, 0);
}

TEST(TensorParallel, KvHeadsThatDoNotSplitAreRefusedByName) {
  // tiny-mistral has one KV head: it cannot be split over two ranks.
  try {
    ShardedFixture two("tiny-mistral", 2);
    FAIL() << "a model with 1 KV head loaded on 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(1)"), std::string::npos) << e.what();
  }
}

TEST(TensorParallel, AnAbortedGroupFailsTheStepInsteadOfHanging) {
  ShardedFixture two("tiny-llama", 2);
  Generator g = two.generator();
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<int32_t> prompt = {1, 2, 3};
  const Generator::SequenceInput in{1, prompt, &causal};
  EXPECT_TRUE(two.backends[0]->failure().empty());
  two.group->abort();  // as a failed rank does
  EXPECT_THROW(g.step(std::span(&in, 1)), Error);
  EXPECT_FALSE(two.backends[0]->failure().empty());  // so the serving engine stops
}

TEST(TensorParallel, ARankThatFailsMidStepEndsTheStepWithItsError) {
  // Rank 1 fails before its second forward while rank 0 waits for it in the first all-reduce.
  ShardedFixture two("tiny-llama", 2, GraphOptions{}, /*follower_fails_at=*/2);
  Generator g = two.generator();
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<int32_t> prompt = {1, 2, 3}, next = {4};
  const Generator::SequenceInput first{1, prompt, &causal}, second{1, next, &causal};
  EXPECT_EQ(error_of([&] { g.step(std::span(&first, 1)); }), "");
  const std::string error = error_of([&] { g.step(std::span(&second, 1)); });
  EXPECT_NE(error.find("injected failure in forward 2"), std::string::npos) << error;
  EXPECT_FALSE(two.backends[0]->failure().empty());
}

TEST(TensorShard, RowsAndColumnsOfAWeight) {
  // A [4, 64] Q8_0 weight: 2 blocks per row (34 bytes each), values = row * 100 + block.
  std::vector<std::byte> bytes(4 * 2 * 34);
  for (size_t r = 0; r < 4; ++r) {
    for (size_t b = 0; b < 2; ++b) bytes[(r * 2 + b) * 34 + 2] = static_cast<std::byte>(r * 100 + b);
  }
  WeightView w{"w", DType::kQ8_0, {4, 64}, bytes, "test"};
  const WeightView rows = weight_rows(w, 1, 2);
  EXPECT_EQ(rows.shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(rows.bytes.data(), bytes.data() + 2 * 34 * 1);
  std::vector<std::byte> storage;
  const WeightView cols = weight_columns(w, 32, 32, storage);
  EXPECT_EQ(cols.shape, (std::vector<int64_t>{4, 32}));
  ASSERT_EQ(cols.bytes.size(), 4u * 34);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(cols.bytes[r * 34 + 2], static_cast<std::byte>(r * 100 + 1));
  // Columns that cut a block in two are refused, naming the weight.
  EXPECT_THROW(weight_columns(w, 16, 32, storage), Error);
  EXPECT_THROW(weight_rows(w, 3, 2), Error);
}

}  // namespace
}  // namespace tessera
