// tests/gpu/test_attention_decode.cpp: paged decode attention against the CPU reference: block
// tables out of order, contexts shorter than a block and spanning many splits, GQA/MQA and groups
// wider than one CTA, sliding window with sinks, repeated calls (the split merge counters reset), one
// workspace shared by calls of every shape (as the backend shares it), and
// a call right behind kernels that rewrite q and each sequence's newest K/V row (the decode reads the
// older rows before its programmatic-launch wait, and must see these writes), and q read from fused
// QKV rows with out written to padded rows; and rows planned as one sequence each (a speculative
// verify's), the same bits as each row alone.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/norm/norm.h"
#include "reference.h"

namespace tessera::gpu_test {
namespace {

using kernels::MaskKind;
using kernels::MaskParams;
using kernels::cuda::DecodeArgs;

struct DecodeCase {
  DType dtype;
  int head_dim;
  int num_heads;
  int num_kv_heads;
  int block_size;
  std::vector<int32_t> context_lens;
  bool sliding = false;
  // q read from a fused [num_seqs, (H + 2 KV) * D] QKV buffer, out written with padded rows.
  bool fused_q = false;
};

// A decode workspace of at least `need`, counters zeroed.
class SplitWorkspace {
 public:
  explicit SplitWorkspace(kernels::cuda::DecodeWorkspaceNeed need)
      : partials_(need.partial_bytes + 16), counters_((static_cast<size_t>(need.counters) + 4) * sizeof(int)),
        need_(need) {
    EXPECT_EQ(cudaMemset(counters_.get(), 0, counters_.bytes()), cudaSuccess);
  }
  kernels::cuda::DecodeWorkspace view() {
    return {partials_.get(), partials_.bytes(), counters_.as<int>(), need_.counters};
  }

 private:
  DeviceBuffer partials_, counters_;
  kernels::cuda::DecodeWorkspaceNeed need_;
};

void run_decode(const DecodeCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int D = c.head_dim, H = c.num_heads, KV = c.num_kv_heads, BS = c.block_size;
  const int num_seqs = static_cast<int>(c.context_lens.size());
  const int max_ctx = *std::max_element(c.context_lens.begin(), c.context_lens.end());
  const int max_blocks = (max_ctx + BS - 1) / BS + 1;
  // Every sequence's blocks are drawn from one shuffled pool: tables out of order, never shared.
  const int num_blocks = num_seqs * max_blocks + 3;
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * max_blocks, -1);
  for (int s = 0, next = 0; s < num_seqs; ++s)
    for (int b = 0; b < (c.context_lens[s] + BS - 1) / BS; ++b) tables[static_cast<size_t>(s) * max_blocks + b] = pool[next++];

  const size_t cache_elems = static_cast<size_t>(num_blocks) * BS * KV * D;
  HostTensor q = HostTensor::random(c.dtype, static_cast<size_t>(num_seqs) * H * D, rng);
  HostTensor k = HostTensor::random(c.dtype, cache_elems, rng);
  HostTensor v = HostTensor::random(c.dtype, cache_elems, rng);
  // With fused_q the device q rows are the first H * D columns of QKV rows (the K and V columns hold
  // other values), and out rows are 8 elements wider than needed (the padding must stay untouched).
  const int64_t q_stride = c.fused_q ? static_cast<int64_t>(H + 2 * KV) * D : static_cast<int64_t>(H) * D;
  const int64_t out_stride = c.fused_q ? static_cast<int64_t>(H) * D + 8 : static_cast<int64_t>(H) * D;
  HostTensor q_dev = c.fused_q ? HostTensor::random(c.dtype, static_cast<size_t>(num_seqs) * q_stride, rng) : q;
  for (int s = 0; s < num_seqs; ++s)
    std::copy_n(q.bits.begin() + static_cast<int64_t>(s) * H * D, H * D, q_dev.bits.begin() + s * q_stride);

  std::vector<MaskParams> masks(num_seqs);
  if (c.sliding) {
    for (int s = 0; s < num_seqs; ++s) {
      masks[s].kind = MaskKind::kSlidingWindow;
      masks[s].window = 1 + (s * 37) % 300;  // from 1 to 300, some larger than the context
      masks[s].sinks = s % 3 == 0 ? 0 : 4;
    }
  }

  DeviceBuffer d_q, d_k, d_v, d_tables, d_lens, d_masks, d_out;
  upload(d_q, q_dev.bits);
  upload(d_k, k.bits);
  upload(d_v, v.bits);
  upload(d_tables, tables);
  upload(d_lens, c.context_lens);
  upload(d_masks, masks);
  const size_t out_elems = static_cast<size_t>(num_seqs) * out_stride;
  d_out.allocate(out_elems * 2);

  DecodeArgs args;
  args.out = d_out.get();
  args.q = d_q.get();
  args.k_cache = d_k.get();
  args.v_cache = d_v.get();
  args.block_tables = d_tables.as<int32_t>();
  args.context_lens = d_lens.as<int32_t>();
  args.masks = c.sliding ? d_masks.as<MaskParams>() : nullptr;
  args.num_seqs = num_seqs;
  args.num_heads = H;
  args.num_kv_heads = KV;
  args.head_dim = D;
  args.block_size = BS;
  args.max_blocks_per_seq = max_blocks;
  args.max_context_len = max_ctx;
  args.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
  if (c.fused_q) {
    args.q_row_stride = q_stride;
    args.out_row_stride = out_stride;
  }
  ASSERT_EQ(kernels::cuda::decode_unsupported(c.dtype, args), "");
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  SplitWorkspace ws(kernels::cuda::decode_workspace_need(args, sms));

  const std::vector<float> ref = reference_decode(q.values, k.values, v.values, tables, c.context_lens,
                                                  c.sliding ? &masks : nullptr, H, KV, D, BS, max_blocks,
                                                  args.softmax_scale);
  auto check = [&](const std::vector<float>& expected, const char* call) {
    const std::vector<uint16_t> out_bits = download<uint16_t>(d_out, out_elems);
    const std::vector<float> out = to_floats(out_bits, c.dtype);
    for (int s = 0; s < num_seqs; ++s) {
      const size_t b = static_cast<size_t>(s) * H * D, e = b + static_cast<size_t>(H) * D;
      const size_t ob = static_cast<size_t>(s) * out_stride;
      for (size_t i = ob + static_cast<size_t>(H) * D; i < ob + out_stride; ++i)
        EXPECT_EQ(out_bits[i], 0xFFFFu) << call << " call, seq " << s << ": out row padding written";
      const double err = normalized_error(std::vector<float>(out.begin() + ob, out.begin() + ob + H * D),
                                          std::vector<float>(expected.begin() + b, expected.begin() + e));
      EXPECT_LE(err, tolerance(c.dtype)) << call << " call, seq " << s << " ctx " << c.context_lens[s] << " dtype "
                                         << name(c.dtype) << " head_dim " << D << " block " << BS;
    }
  };
  for (const char* call : {"first", "second"}) {  // the second checks that the merge counters came back to 0
    poison(d_out);
    CUDA_OK(kernels::cuda::decode_attention(c.dtype, args, ws.view(), sms, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    check(ref, call);
  }

  // Chained: in-place RMSNorms (launched with PDL) rewrite q, then each sequence's newest K and V
  // rows, and the decode follows on the same stream with no host sync; the last sequence's V row is
  // written by the kernel just before it. The weight of 8 makes the newest key's score dominate or
  // vanish in about half of the heads, so a stale read of that row shows.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int kv_row = KV * D;
  DeviceBuffer d_weight;
  upload(d_weight, std::vector<uint16_t>(static_cast<size_t>(std::max(kv_row, D)), to_bits(8.f, c.dtype)));
  poison(d_out);
  if (c.fused_q) {
    for (int s = 0; s < num_seqs; ++s) {
      void* p = d_q.as<uint16_t>() + s * q_stride;
      CUDA_OK(kernels::cuda::rmsnorm(c.dtype, p, p, d_weight.get(), H, D, D, D, 1e-6f, stream));
    }
  } else {
    CUDA_OK(kernels::cuda::rmsnorm(c.dtype, d_q.get(), d_q.get(), d_weight.get(), num_seqs * H, D, D, D, 1e-6f, stream));
  }
  for (int s = 0; s < num_seqs; ++s) {
    const int pos = c.context_lens[s] - 1;
    if (pos < 0) continue;
    const int64_t row = static_cast<int64_t>(tables[static_cast<size_t>(s) * max_blocks + pos / BS]) * BS + pos % BS;
    for (DeviceBuffer* cache : {&d_k, &d_v}) {
      void* p = static_cast<uint16_t*>(cache->get()) + row * kv_row;
      CUDA_OK(kernels::cuda::rmsnorm(c.dtype, p, p, d_weight.get(), 1, kv_row, kv_row, kv_row, 1e-6f, stream));
    }
  }
  CUDA_OK(kernels::cuda::decode_attention(c.dtype, args, ws.view(), sms, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaStreamDestroy(stream));
  q_dev.bits = download<uint16_t>(d_q, q_dev.size());
  for (int s = 0; s < num_seqs; ++s)
    std::copy_n(q_dev.bits.begin() + s * q_stride, H * D, q.bits.begin() + static_cast<int64_t>(s) * H * D);
  k.bits = download<uint16_t>(d_k, k.size());
  v.bits = download<uint16_t>(d_v, v.size());
  q.refresh_values();
  k.refresh_values();
  v.refresh_values();
  const std::vector<float> chained_ref = reference_decode(q.values, k.values, v.values, tables, c.context_lens,
                                                          c.sliding ? &masks : nullptr, H, KV, D, BS, max_blocks,
                                                          args.softmax_scale);
  check(chained_ref, "chained");
}

class DecodeParam : public ::testing::TestWithParam<std::tuple<DType, int, int>> {};

TEST_P(DecodeParam, GqaMixedContexts) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim, block_size] = GetParam();
  run_decode({dtype, head_dim, 8, 2, block_size, {1, 15, 16, 17, 100, 1000, 5000, 33}}, 11 + head_dim + block_size);
}

TEST_P(DecodeParam, SlidingWindowWithSinks) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim, block_size] = GetParam();
  run_decode({dtype, head_dim, 4, 4, block_size, {3, 64, 250, 777, 2049, 9, 400}, true}, 21 + head_dim);
}

INSTANTIATE_TEST_SUITE_P(AllDtypesHeadDimsBlocks, DecodeParam,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP16),
                                            ::testing::Values(32, 64, 80, 96, 128, 256), ::testing::Values(16, 32)),
                         [](const auto& info) {
                           return std::string(name(std::get<0>(info.param))) + "_hd" +
                                  std::to_string(std::get<1>(info.param)) + "_bs" +
                                  std::to_string(std::get<2>(info.param));
                         });

// q as a view into fused QKV rows, out into padded rows; odd batch sizes and contexts off block
// boundaries, single- and multi-split.
TEST_P(DecodeParam, FusedQkvQueryAndStridedOut) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim, block_size] = GetParam();
  DecodeCase c{dtype, head_dim, 8, 2, block_size, {1, 17, 333, 2047, 50}};
  c.fused_q = true;
  run_decode(c, 31 + head_dim + block_size);
  DecodeCase sliding{dtype, head_dim, 12, 4, block_size, {7, 1500, 95}, true};
  sliding.fused_q = true;
  run_decode(sliding, 41 + head_dim);
}

TEST(DecodeAttention, MqaAndWideGroups) {
  TESSERA_REQUIRE_GPU();
  run_decode({DType::kBF16, 128, 8, 1, 16, {1, 300, 4100}}, 3);    // MQA
  run_decode({DType::kBF16, 64, 32, 2, 32, {70, 2000}}, 4);        // group of 16: two head tiles per KV head
  run_decode({DType::kFP16, 128, 32, 8, 16, {4096}}, 5);           // batch 1, many splits
  run_decode({DType::kBF16, 128, 12, 2, 16, {16384, 3}}, 7);      // group of 6: a partial head tile, long splits
  run_decode({DType::kFP16, 64, 24, 2, 16, {1000, 37}}, 9);        // group of 12: a full and a partial head tile
  run_decode({DType::kBF16, 128, 32, 8, 32, {16384}}, 8);          // batch 1, 16k: split count not a power of 2
}

// Head dims of rows that are not whole 128-byte lines, with groups wider than one CTA.
TEST(DecodeAttention, HeadDims80And96WideGroups) {
  TESSERA_REQUIRE_GPU();
  run_decode({DType::kBF16, 80, 32, 2, 16, {1, 17, 1000}}, 12);  // group of 16: two head tiles per KV head
  run_decode({DType::kFP16, 96, 12, 2, 32, {1000, 17, 1}}, 13);  // group of 6: a partial head tile
}

// SmolLM2's decode attention (9 query heads, 3 KV heads, head dim 64, blocks of 16) on the device:
// random bf16 q for `rows` sequences, a random K/V cache of `num_blocks`, the block tables given.
struct SmolLm2Decode {
  static constexpr int D = 64, H = 9, KV = 3, BS = 16;
  HostTensor q, k, v;
  std::vector<int32_t> tables;
  DeviceBuffer d_q, d_k, d_v, d_tables, d_lens, d_out;
  int sms = 0;

  SmolLm2Decode(std::mt19937& rng, int rows, int num_blocks, std::vector<int32_t> block_tables)
      : q(HostTensor::random(DType::kBF16, static_cast<size_t>(rows) * H * D, rng)),
        k(HostTensor::random(DType::kBF16, static_cast<size_t>(num_blocks) * BS * KV * D, rng)),
        v(HostTensor::random(DType::kBF16, static_cast<size_t>(num_blocks) * BS * KV * D, rng)),
        tables(std::move(block_tables)) {
    upload(d_q, q.bits);
    upload(d_k, k.bits);
    upload(d_v, v.bits);
    upload(d_tables, tables);
    d_out.allocate(static_cast<size_t>(rows) * H * D * 2);
    d_lens.allocate(rows * sizeof(int32_t));
    EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  }
  // Every field but num_seqs and max_context_len, over all rows from the first.
  DecodeArgs args(int max_blocks) {
    DecodeArgs a;
    a.out = d_out.get();
    a.q = d_q.get();
    a.k_cache = d_k.get();
    a.v_cache = d_v.get();
    a.block_tables = d_tables.as<int32_t>();
    a.context_lens = d_lens.as<int32_t>();
    a.num_heads = H;
    a.num_kv_heads = KV;
    a.head_dim = D;
    a.block_size = BS;
    a.max_blocks_per_seq = max_blocks;
    a.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
    return a;
  }
};

// One workspace serves calls of every shape, as the CUDA backend uses it: more splits, then fewer,
// then more sequences, then fewer, at the floors of 32 and 64 tokens a split. Each call against the
// reference. (With the counters laid out after the partials, the second call read the first one's
// partial values as merge counts and never merged.)
TEST(DecodeAttention, OneWorkspaceServesCallsOfEveryShape) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(77);
  using S = SmolLm2Decode;
  const int max_seqs = 3, max_ctx = 400;
  const int max_blocks = max_ctx / S::BS + 1;
  const int num_blocks = max_seqs * max_blocks;
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  SmolLm2Decode smol(rng, max_seqs, num_blocks, pool);  // tables [max_seqs, max_blocks], out of order
  const int sms = smol.sms;
  DecodeArgs args = smol.args(max_blocks);
  // Sized for the largest call, as the backend grows it; counters zeroed once.
  args.num_seqs = max_seqs;
  args.max_context_len = max_ctx;
  args.min_split_tokens = 32;
  SplitWorkspace ws(kernels::cuda::decode_workspace_need(args, sms));

  const std::vector<std::vector<int32_t>> calls{{300}, {70}, {400}, {129}, {40, 90, 200}, {65}, {65, 65, 65}, {300}};
  int calls_run = 0;
  for (int floor : {32, 64}) {
    for (const std::vector<int32_t>& lens : calls) {
      args.num_seqs = static_cast<int32_t>(lens.size());
      args.max_context_len = *std::max_element(lens.begin(), lens.end());
      args.min_split_tokens = floor;
      const kernels::cuda::DecodeWorkspaceNeed need = kernels::cuda::decode_workspace_need(args, sms);
      ASSERT_LE(need.counters, ws.view().counter_count);
      ASSERT_LE(need.partial_bytes, ws.view().partial_bytes);
      CUDA_OK(cudaMemcpy(smol.d_lens.get(), lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      poison(smol.d_out);
      CUDA_OK(kernels::cuda::decode_attention(DType::kBF16, args, ws.view(), sms, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const size_t elems = lens.size() * S::H * S::D;
      const std::vector<float> out = to_floats(download<uint16_t>(smol.d_out, elems), DType::kBF16);
      const std::vector<float> ref = reference_decode(
          std::vector<float>(smol.q.values.begin(), smol.q.values.begin() + static_cast<int64_t>(elems)),
          smol.k.values, smol.v.values, smol.tables, lens, nullptr, S::H, S::KV, S::D, S::BS, max_blocks,
          args.softmax_scale);
      EXPECT_LE(normalized_error(out, ref), tolerance(DType::kBF16))
          << "floor " << floor << ", call " << calls_run << " (" << lens.size() << " sequences, longest "
          << args.max_context_len << ")";
      ++calls_run;
    }
  }
  EXPECT_EQ(calls_run, 16);
}

// A speculative verify runs one sequence's k + 1 tokens as rows of one decode batch over one block
// table, contexts L + 1 .. L + k + 1. Planned as one sequence each, every row's output is the same
// bits as the row decoded alone, so that greedy speculation gives plain decoding's tokens.
TEST(DecodeAttention, SplitAsOneSequenceGivesEachRowTheBitsItHasAlone) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(91);
  using S = SmolLm2Decode;
  const int rows = 8, first_ctx = 301, bucket = 512;
  const int max_blocks = bucket / S::BS;
  std::vector<int32_t> table(max_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> tables;
  for (int r = 0; r < rows; ++r) tables.insert(tables.end(), table.begin(), table.end());  // one table, every row
  SmolLm2Decode smol(rng, rows, max_blocks, tables);
  std::vector<int32_t> lens(rows);
  std::iota(lens.begin(), lens.end(), first_ctx);
  CUDA_OK(cudaMemcpy(smol.d_lens.get(), lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  DecodeArgs args = smol.args(max_blocks);
  args.max_context_len = bucket;  // a captured step's, the same for the row alone and in the batch
  const size_t row_elems = static_cast<size_t>(S::H) * S::D;
  auto decode = [&](int first_row, int num_seqs, bool as_one, int step_keys) {
    args.q = static_cast<const uint16_t*>(smol.d_q.get()) + first_row * row_elems;
    args.out = static_cast<uint16_t*>(smol.d_out.get()) + first_row * row_elems;
    args.context_lens = smol.d_lens.as<int32_t>() + first_row;
    args.num_seqs = num_seqs;
    args.split_as_one_sequence = as_one;
    args.step_keys = step_keys;
    SplitWorkspace ws(kernels::cuda::decode_workspace_need(args, smol.sms));
    CUDA_OK(kernels::cuda::decode_attention(DType::kBF16, args, ws.view(), smol.sms, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
  };
  for (int r = 0; r < rows; ++r) decode(r, 1, false, 1);
  const std::vector<uint16_t> alone = download<uint16_t>(smol.d_out, rows * row_elems);
  poison(smol.d_out);
  decode(0, rows, true, rows);
  const std::vector<uint16_t> batched = download<uint16_t>(smol.d_out, rows * row_elems);
  for (int r = 0; r < rows; ++r) {
    EXPECT_TRUE(std::equal(alone.begin() + r * row_elems, alone.begin() + (r + 1) * row_elems,
                           batched.begin() + r * row_elems))
        << "row " << r << " (context " << lens[r] << ") differs from the row decoded alone";
  }
  const std::vector<float> ref = reference_decode(smol.q.values, smol.k.values, smol.v.values, tables, lens, nullptr,
                                                  S::H, S::KV, S::D, S::BS, max_blocks, args.softmax_scale);
  EXPECT_LE(normalized_error(to_floats(batched, DType::kBF16), ref), tolerance(DType::kBF16));
}

TEST(DecodeAttention, ReportsUnsupportedValuesByName) {
  DecodeArgs args;
  args.head_dim = 128;
  args.num_heads = 8;
  args.num_kv_heads = 2;
  args.block_size = 24;
  EXPECT_NE(kernels::cuda::decode_unsupported(DType::kBF16, args).find("block_size: 24"), std::string::npos);
  args.block_size = 16;
  args.head_dim = 72;
  EXPECT_NE(kernels::cuda::decode_unsupported(DType::kBF16, args).find("head_dim: 72"), std::string::npos);
  args.head_dim = 128;
  args.q_row_stride = 8 * 128 - 8;  // narrower than num_heads * head_dim
  EXPECT_NE(kernels::cuda::decode_unsupported(DType::kBF16, args).find("q_row_stride"), std::string::npos);
  args.q_row_stride = 12 * 128;
  args.out_row_stride = 8 * 128 + 3;  // not a multiple of 8
  EXPECT_NE(kernels::cuda::decode_unsupported(DType::kBF16, args).find("out_row_stride"), std::string::npos);
}

}  // namespace
}  // namespace tessera::gpu_test
