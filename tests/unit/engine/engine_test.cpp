// tests/unit/engine/engine_test.cpp: MaskPolicy validation and lowering, the per-step
// AttentionPlan, and CpuBackend's boundary checks.
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "kernels/backend/attention_plan.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "kernels/backend/mask_policy.h"
#include "models/config/model_config.h"
#include "models/config/model_mask_policy.h"
#include "tests/error_of.h"

namespace tessera {
namespace {

TEST(MaskPolicy, ParallelPositionsNumberEverySegmentFromThePrefix) {
  // [prefix 0..1][segment 2..4][segment 5..6][tail 7..]: each segment restarts at 2, the tail goes
  // on after the longest segment (3 tokens).
  const MaskPolicy p = MaskPolicy::segments({3, 2}, 2, true);
  std::vector<int32_t> got;
  for (int32_t i = 0; i < 10; ++i) got.push_back(p.rope_position(i));
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3, 4, 2, 3, 5, 6, 7}));
  const MaskPolicy sequential = MaskPolicy::segments({3, 2}, 2);
  for (int32_t i = 0; i < 10; ++i) EXPECT_EQ(sequential.rope_position(i), i);
}

TEST(MaskPolicy, ValidationNarrowsWindowsAndFitsSegmentsToThePrompt) {
  ModelConfig llama;
  llama.arch = Architecture::kLlama;
  ModelConfig mistral;
  mistral.arch = Architecture::kMistral;
  mistral.sliding_window = 4096;
  ModelConfig bert;
  bert.arch = Architecture::kBert;
  EXPECT_EQ(default_mask_policy(llama).kind, MaskPolicy::Kind::kCausal);
  EXPECT_EQ(default_mask_policy(bert).kind, MaskPolicy::Kind::kBidirectional);
  EXPECT_EQ(default_mask_policy(mistral).window, 4096);
  EXPECT_NO_THROW(validate_mask_policy(MaskPolicy::sliding_window(1024, 4), mistral, 10));
  EXPECT_NE(error_of([&] { validate_mask_policy(MaskPolicy::sliding_window(8192), mistral, 10); }).find("widens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { validate_mask_policy(MaskPolicy::causal(), mistral, 10); }).find("would widen"), std::string::npos);
  EXPECT_NO_THROW(validate_mask_policy(MaskPolicy::sliding_window(8192), llama, 10));  // no trained window
  EXPECT_NO_THROW(validate_mask_policy(MaskPolicy::segments({3, 4}, 2), llama, 9));
  EXPECT_NE(error_of([&] { validate_mask_policy(MaskPolicy::segments({3, 4}, 2), llama, 8); }).find("exceeds the prompt"),
            std::string::npos);
  EXPECT_EQ(resolve_mask_policy(std::nullopt, mistral, 5).window, 4096);
}

TEST(MaskPolicy, LowersToKernelParams) {
  std::vector<int32_t> ends;
  const kernels::MaskParams m = MaskPolicy::segments({3, 4}, 2).lower(ends);
  EXPECT_EQ(m.kind, kernels::MaskKind::kSegments);
  EXPECT_EQ(ends, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(m.num_segments, 2);
  EXPECT_TRUE(m.visible(6, 1));   // segment 1 sees the prefix
  EXPECT_FALSE(m.visible(6, 3));  // ... but not segment 0
  EXPECT_TRUE(m.visible(9, 3));   // the tail sees everything
  const kernels::MaskParams w = MaskPolicy::sliding_window(4, 1).lower(ends);
  EXPECT_TRUE(w.visible(10, 7));
  EXPECT_FALSE(w.visible(10, 6));
  EXPECT_TRUE(w.visible(10, 0));  // sink
}

TEST(AttentionPlan, PagedPlanHasPositionsSlotsAndLastRows) {
  const MaskPolicy causal = MaskPolicy::causal();
  const MaskPolicy seg = MaskPolicy::segments({2, 2}, 1);
  const std::vector<int32_t> table_a{7, 3};        // 6 tokens in blocks of 4
  const std::vector<int32_t> table_b{-1, 5, 9};    // first block evicted; 1 new token at position 9
  const std::vector<AttentionPlan::Sequence> seqs{{6, 6, &seg, table_a}, {1, 10, &causal, table_b}};
  AttentionPlan plan = AttentionPlan::build(seqs, 4);
  EXPECT_TRUE(plan.paged());
  EXPECT_EQ(plan.total_q(), 7);
  EXPECT_EQ(plan.cu_seqlens_q(), (std::vector<int32_t>{0, 6, 7}));
  EXPECT_EQ(plan.positions(), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 9}));
  EXPECT_EQ(plan.slot_mapping(), (std::vector<int32_t>{28, 29, 30, 31, 12, 13, 37}));
  EXPECT_EQ(plan.max_blocks_per_seq(), 3);
  EXPECT_EQ(plan.block_tables(), (std::vector<int32_t>{7, 3, -1, -1, 5, 9}));
  EXPECT_EQ(plan.last_rows(), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(plan.masks()[0].num_segments, 2);
  EXPECT_EQ(plan.masks()[0].segment_ends[1], 5);
  // Moving the plan keeps its masks valid (they point into storage the plan owns).
  AttentionPlan moved = std::move(plan);
  EXPECT_EQ(moved.masks()[0].segment_ends[0], 3);
  // Parallel positions renumber the segments for RoPE only; slots and masks stay by index.
  const MaskPolicy parallel = MaskPolicy::segments({2, 2}, 1, true);
  const std::vector<AttentionPlan::Sequence> par_seqs{{6, 6, &parallel, table_a}};
  const AttentionPlan par_plan = AttentionPlan::build(par_seqs, 4);
  EXPECT_EQ(par_plan.positions(), (std::vector<int32_t>{0, 1, 2, 1, 2, 3}));
  EXPECT_EQ(par_plan.slot_mapping(), (std::vector<int32_t>{28, 29, 30, 31, 12, 13}));
}

TEST(AttentionPlan, CountsTheStepsKeysASingleQueryReads) {
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<int32_t> table{7, 3, 5};
  // A decode step: each sequence of one query reads only its own new key.
  const std::vector<AttentionPlan::Sequence> decode{{1, 6, &causal, table}, {1, 1, &causal, table}};
  EXPECT_EQ(AttentionPlan::build(decode, 4).step_keys_read(), 1);
  // A verify of three tokens as single queries over one table: the last reads all three.
  const std::vector<AttentionPlan::Sequence> verify{
      {1, 7, &causal, table}, {1, 8, &causal, table}, {1, 9, &causal, table}};
  EXPECT_EQ(AttentionPlan::build(verify, 4).step_keys_read(), 3);
  // A prompt chunk's keys belong to its own (multi-query) sequence: not counted.
  const std::vector<AttentionPlan::Sequence> chunk{{4, 9, &causal, table}};
  EXPECT_EQ(AttentionPlan::build(chunk, 4).step_keys_read(), 0);
}

TEST(AttentionPlan, TellsASingleRequestsRowsFromSeveralRequests) {
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<int32_t> table{7, 3, 5};
  const std::vector<int32_t> other{2, 4, 6};
  const std::vector<AttentionPlan::Sequence> lone{{1, 6, &causal, table}};
  EXPECT_TRUE(AttentionPlan::build(lone, 4).one_request());
  const std::vector<AttentionPlan::Sequence> verify{
      {1, 7, &causal, table}, {1, 8, &causal, table}, {1, 9, &causal, table}};
  EXPECT_TRUE(AttentionPlan::build(verify, 4).one_request());
  // Two requests decoding, and one decoding beside another's verify.
  const std::vector<AttentionPlan::Sequence> decodes{{1, 6, &causal, table}, {1, 3, &causal, other}};
  EXPECT_FALSE(AttentionPlan::build(decodes, 4).one_request());
  const std::vector<AttentionPlan::Sequence> mixed{
      {1, 3, &causal, other}, {1, 7, &causal, table}, {1, 8, &causal, table}};
  EXPECT_FALSE(AttentionPlan::build(mixed, 4).one_request());
  // A prompt chunk, and a plan without a KV cache.
  const std::vector<AttentionPlan::Sequence> chunk{{4, 9, &causal, table}};
  EXPECT_FALSE(AttentionPlan::build(chunk, 4).one_request());
  const std::vector<AttentionPlan::Sequence> unpaged{{1, 1, &causal, {}}};
  EXPECT_FALSE(AttentionPlan::build(unpaged, 0).one_request());
}

TEST(AttentionPlan, RejectsInconsistentSequences) {
  const MaskPolicy causal = MaskPolicy::causal();
  const std::vector<AttentionPlan::Sequence> cached{{1, 5, &causal, {}}};
  EXPECT_NE(error_of([&] { AttentionPlan::build(cached, 0); }).find("no KV cache"), std::string::npos);
  const std::vector<int32_t> short_table{1};
  const std::vector<AttentionPlan::Sequence> too_few{{1, 5, &causal, short_table}};
  EXPECT_NE(error_of([&] { AttentionPlan::build(too_few, 4); }).find("needs 2"), std::string::npos);
  const std::vector<int32_t> evicted{-1, -1};
  const std::vector<AttentionPlan::Sequence> write_evicted{{1, 5, &causal, evicted}};
  EXPECT_NE(error_of([&] { AttentionPlan::build(write_evicted, 4); }).find("evicted"), std::string::npos);
  const std::vector<AttentionPlan::Sequence> no_policy{{1, 1, nullptr, {}}};
  EXPECT_NE(error_of([&] { AttentionPlan::build(no_policy, 0); }).find("no mask policy"), std::string::npos);
}

TEST(CpuBackend, ChecksShapesNamingTensors) {
  CpuBackend backend(1);
  Tensor x = backend.empty({2, 3}, ScalarType::kF32, "x");
  Tensor w = backend.empty({4, 5}, ScalarType::kF32, "w_proj");
  Tensor y = backend.empty({2, 4}, ScalarType::kF32, "y");
  EXPECT_NE(error_of([&] { backend.linear(x, w, nullptr, y); }).find("x f32[2, 3] must be [rows, 5]"), std::string::npos);
  const std::vector<float> values{1, 2, 3, 4, 5, 6};
  Tensor up = backend.upload(values, {2, 3}, "up");
  EXPECT_EQ(backend.download(up), values);
  EXPECT_NE(error_of([&] { backend.upload(values, {4, 2}, "bad"); }).find("6 values for bad f32[4, 2]"), std::string::npos);
  Tensor ids = backend.upload(std::vector<int32_t>{0, 9}, {2}, "ids");
  Tensor table = backend.empty({4, 3}, ScalarType::kF32, "table");
  EXPECT_NE(error_of([&] { backend.embedding(ids, table, x, false); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { up.i32(); }).find("is not i32"), std::string::npos);
}

}  // namespace
}  // namespace tessera
