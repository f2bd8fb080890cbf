// tests/gpu/test_attention_generic.cpp: the generic (any head_dim) attention kernel against the CPU
// reference, with contiguous and paged keys (shuffled block tables, evicted blocks), every mask
// policy, q_len < kv_len (chunked prefill, decode rows), GQA, bf16 and fp16.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/attention_generic/attention_generic.h"
#include "reference.h"

namespace tessera::gpu_test {
namespace {

using kernels::MaskKind;
using kernels::MaskParams;
using kernels::cuda::GenericAttentionArgs;

struct Case {
  DType dtype;
  int head_dim;
  int num_heads;
  int num_kv_heads;
  bool paged;
  int block_size = 16;
};

void run_case(const Case& c, const std::vector<SeqSpec>& seqs, uint32_t seed) {
  std::mt19937 rng(seed);
  const int D = c.head_dim, H = c.num_heads, KV = c.num_kv_heads, B = c.block_size;
  const int S = static_cast<int>(seqs.size());
  std::vector<int32_t> cu_q{0}, cu_k{0}, kv_lens;
  int max_blocks = 1;
  for (const auto& s : seqs) {
    cu_q.push_back(cu_q.back() + s.q_len);
    cu_k.push_back(cu_k.back() + s.kv_len);
    kv_lens.push_back(s.kv_len);
    max_blocks = std::max(max_blocks, (s.kv_len + B - 1) / B);
  }
  const int total_q = cu_q.back(), total_k = cu_k.back();
  // Padded strides, so the kernel must honour them.
  const int64_t q_stride = static_cast<int64_t>(H) * D + 8, out_stride = static_cast<int64_t>(H) * D + 2;
  const int64_t k_stride = static_cast<int64_t>(KV) * D + 4, v_stride = static_cast<int64_t>(KV) * D + 6;
  HostTensor q = HostTensor::random(c.dtype, static_cast<size_t>(total_q) * q_stride, rng);
  HostTensor k = HostTensor::random(c.dtype, static_cast<size_t>(total_k) * k_stride, rng);
  HostTensor v = HostTensor::random(c.dtype, static_cast<size_t>(total_k) * v_stride, rng);

  // Device masks with device segment_ends; host masks with host pointers for the reference.
  std::vector<int32_t> all_ends;
  std::vector<size_t> end_offsets;
  for (const auto& s : seqs) {
    end_offsets.push_back(all_ends.size());
    all_ends.insert(all_ends.end(), s.segment_ends.begin(), s.segment_ends.end());
  }
  DeviceBuffer d_ends;
  upload(d_ends, all_ends.empty() ? std::vector<int32_t>{0} : all_ends);
  std::vector<MaskParams> host_masks, dev_masks;
  for (size_t i = 0; i < seqs.size(); ++i) {
    MaskParams hm = seqs[i].mask, dm = seqs[i].mask;
    hm.segment_ends = seqs[i].segment_ends.empty() ? nullptr : seqs[i].segment_ends.data();
    dm.segment_ends = seqs[i].segment_ends.empty() ? nullptr : d_ends.as<int32_t>() + end_offsets[i];
    host_masks.push_back(hm);
    dev_masks.push_back(dm);
  }

  // Paged: scatter the contiguous keys into a cache through a shuffled block table, plus a spare
  // block; evicted blocks get -1 (their keys must be masked out, so the reference never reads them).
  std::vector<int32_t> block_tables(static_cast<size_t>(S) * max_blocks, -1);
  HostTensor k_cache, v_cache;
  if (c.paged) {
    int num_blocks = 1;
    for (const auto& s : seqs) num_blocks += (s.kv_len + B - 1) / B;
    std::vector<int32_t> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const size_t block_elems = static_cast<size_t>(B) * KV * D;
    k_cache = HostTensor::random(c.dtype, num_blocks * block_elems, rng, 5.f, 6.f);  // garbage where unused
    v_cache = HostTensor::random(c.dtype, num_blocks * block_elems, rng, 5.f, 6.f);
    int next = 0;
    for (int s = 0; s < S; ++s) {
      const int blocks = (seqs[s].kv_len + B - 1) / B;
      for (int b = 0; b < blocks; ++b) {
        const bool evicted = b >= 1 && b <= seqs[s].evicted_blocks;
        const int32_t block = order[next++];
        block_tables[static_cast<size_t>(s) * max_blocks + b] = evicted ? -1 : block;
        if (evicted) continue;
        for (int slot = 0; slot < B && b * B + slot < seqs[s].kv_len; ++slot) {
          const size_t src_k = static_cast<size_t>(cu_k[s] + b * B + slot) * k_stride;
          const size_t src_v = static_cast<size_t>(cu_k[s] + b * B + slot) * v_stride;
          const size_t dst = (static_cast<size_t>(block) * B + slot) * KV * D;
          for (int e = 0; e < KV * D; ++e) {
            k_cache.bits[dst + e] = k.bits[src_k + e];
            v_cache.bits[dst + e] = v.bits[src_v + e];
          }
        }
      }
    }
    k_cache.refresh_values();
    v_cache.refresh_values();
  } else {
    for (const auto& s : seqs) ASSERT_EQ(s.evicted_blocks, 0);
  }

  DeviceBuffer d_q, d_k, d_v, d_out, d_cu_q, d_cu_k, d_kv_lens, d_tables, d_masks;
  upload(d_q, q.bits);
  upload(d_k, c.paged ? k_cache.bits : k.bits);
  upload(d_v, c.paged ? v_cache.bits : v.bits);
  upload(d_cu_q, cu_q);
  upload(d_cu_k, cu_k);
  upload(d_kv_lens, kv_lens);
  upload(d_tables, block_tables);
  upload(d_masks, dev_masks);
  const size_t out_elems = static_cast<size_t>(total_q) * out_stride;
  d_out.allocate(out_elems * 2);
  poison(d_out);

  GenericAttentionArgs args;
  args.out = d_out.get();
  args.q = d_q.get();
  args.k = d_k.get();
  args.v = d_v.get();
  if (c.paged) {
    args.block_tables = d_tables.as<int32_t>();
    args.max_blocks_per_seq = max_blocks;
    args.block_size = B;
    args.kv_lens = d_kv_lens.as<int32_t>();
  } else {
    args.k_row_stride = k_stride;
    args.v_row_stride = v_stride;
    args.cu_seqlens_k = d_cu_k.as<int32_t>();
  }
  args.cu_seqlens_q = d_cu_q.as<int32_t>();
  args.masks = d_masks.as<MaskParams>();
  args.num_seqs = S;
  args.total_q = total_q;
  args.num_heads = H;
  args.num_kv_heads = KV;
  args.head_dim = D;
  args.q_row_stride = q_stride;
  args.out_row_stride = out_stride;
  args.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
  ASSERT_EQ(kernels::cuda::generic_attention_unsupported(c.dtype, args), "");
  CUDA_OK(kernels::cuda::generic_attention(c.dtype, args, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  const std::vector<float> ref = reference_prefill(q.values, q_stride, k.values, k_stride, v.values, v_stride, cu_q,
                                                   cu_k, host_masks, H, KV, D, args.softmax_scale);
  const std::vector<float> out_all = to_floats(download<uint16_t>(d_out, out_elems), c.dtype);
  // Per sequence, so a failure names the policy; only the used columns of each padded row.
  for (int s = 0; s < S; ++s) {
    std::vector<float> o, r;
    for (int row = cu_q[s]; row < cu_q[s + 1]; ++row)
      for (int e = 0; e < H * D; ++e) {
        o.push_back(out_all[static_cast<size_t>(row) * out_stride + e]);
        r.push_back(ref[static_cast<size_t>(row) * H * D + e]);
      }
    EXPECT_LE(normalized_error(o, r), tolerance(c.dtype))
        << "seq " << s << " kind " << static_cast<int>(seqs[s].mask.kind) << " q_len " << seqs[s].q_len
        << " kv_len " << seqs[s].kv_len << " dtype " << name(c.dtype) << " head_dim " << D
        << (c.paged ? " paged" : " contiguous");
  }
}

std::vector<SeqSpec> prefill_batch() {
  return {
      causal(1, 1),
      causal(77, 77),
      bidirectional(40, 40),
      sliding(129, 129, 32, 0),
      sliding(150, 150, 20, 4),
      sliding(45, 45, 1000, 0),                 // window larger than the sequence
      segments(120, 120, 5, {6, 40, 41, 90}),   // single-token segment, tail after 90
      segments(33, 33, 0, {1, 2, 3, 33}),       // single-token segments, no tail, no prefix
      sliding(60, 60, 1, 3),                    // window 1: itself plus sinks
  };
}

// q_len < kv_len: chunked prefill and decode rows (q_len 1); windowed ones with evicted blocks.
std::vector<SeqSpec> chunked_batch() {
  return {
      causal(1, 1),   causal(1, 129),           causal(30, 170),         sliding(1, 200, 40, 4, 7),
      sliding(25, 300, 50, 3, 12), segments(20, 150, 10, {60, 110}), bidirectional(7, 53),
      segments(1, 97, 9, {50, 70}),  // decode row in the tail
  };
}

class GenericAttention : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(GenericAttention, ContiguousMixedPolicies) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  run_case({dtype, head_dim, 6, 2, false}, prefill_batch(), 11 + head_dim);
}

TEST_P(GenericAttention, ContiguousChunked) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  std::vector<SeqSpec> seqs = chunked_batch();
  for (auto& s : seqs) s.evicted_blocks = 0;
  run_case({dtype, head_dim, 4, 1, false}, seqs, 23 + head_dim);
}

TEST_P(GenericAttention, PagedMixedPolicies) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  run_case({dtype, head_dim, 6, 3, true}, prefill_batch(), 37 + head_dim);
}

TEST_P(GenericAttention, PagedChunkedWithEviction) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  run_case({dtype, head_dim, 8, 2, true}, chunked_batch(), 41 + head_dim);
}

INSTANTIATE_TEST_SUITE_P(DtypesAndHeadDims, GenericAttention,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP16),
                                            ::testing::Values(16, 80, 128)),
                         [](const auto& info) {
                           return std::string(name(std::get<0>(info.param))) + "_hd" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(GenericAttentionShapes, OddHeadDimsAndBlockSize) {
  TESSERA_REQUIRE_GPU();
  run_case({DType::kBF16, 8, 2, 1, true, 32}, {causal(5, 70), sliding(40, 100, 33, 2)}, 3);
  run_case({DType::kFP16, 96, 4, 4, false}, {causal(64, 64), segments(10, 80, 4, {30, 60})}, 4);
  run_case({DType::kBF16, 256, 2, 1, true}, {causal(3, 45), bidirectional(20, 20)}, 5);
  run_case({DType::kFP16, 40, 3, 1, false}, {causal(50, 50), sliding(9, 60, 16, 0)}, 6);
}

TEST(GenericAttentionShapes, NoVisibleKeyGivesZero) {
  TESSERA_REQUIRE_GPU();
  // window 0 and no sinks: nothing visible; q_len > kv_len: early queries sit before every key.
  run_case({DType::kBF16, 16, 2, 2, false}, {sliding(4, 10, 0, 0), causal(6, 3)}, 8);
}

TEST(GenericAttentionShapes, ReportsUnsupportedValuesByName) {
  TESSERA_REQUIRE_GPU();
  GenericAttentionArgs args;
  args.num_heads = 8;
  args.num_kv_heads = 2;
  args.head_dim = 7;
  args.q_row_stride = args.out_row_stride = 8 * 7;
  args.softmax_scale = 1.f;
  EXPECT_NE(kernels::cuda::generic_attention_unsupported(DType::kBF16, args).find("head_dim: 7"), std::string::npos);
  args.head_dim = 258;
  EXPECT_NE(kernels::cuda::generic_attention_unsupported(DType::kBF16, args).find("head_dim"), std::string::npos);
  args.head_dim = 80;
  args.num_kv_heads = 3;
  EXPECT_NE(kernels::cuda::generic_attention_unsupported(DType::kBF16, args).find("num_kv_heads"),
            std::string::npos);
  EXPECT_EQ(kernels::cuda::generic_attention(DType::kBF16, args, nullptr), cudaErrorInvalidValue);
  args.num_kv_heads = 2;
  args.q_row_stride = args.out_row_stride = 8 * 80;
  EXPECT_EQ(kernels::cuda::generic_attention_unsupported(DType::kBF16, args), "");  // total_q == 0: nothing to read
}

}  // namespace
}  // namespace tessera::gpu_test
