// tests/gpu/test_attention_prefill.cpp: varlen prefill attention against the CPU reference, with
// mixed per-sequence policies, awkward lengths, GQA/MQA, chunked prefill and fused-QKV strides.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/attention/attention.h"
#include "reference.h"

namespace tessera::gpu_test {
namespace {

using kernels::MaskKind;
using kernels::MaskParams;
using kernels::cuda::PrefillArgs;
using kernels::cuda::PrefillKernel;

struct Case {
  DType dtype;
  int head_dim;
  int num_heads;
  int num_kv_heads;
  bool fused_qkv;  // Q, K, V as column slices of one [tokens, (H + 2 KV) * D] buffer
  PrefillKernel kernel = PrefillKernel::kAuto;
};

void run_case(const Case& c, std::vector<SeqSpec> seqs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> cu_q{0}, cu_k{0};
  int max_q = 0;
  for (auto& s : seqs) {
    cu_q.push_back(cu_q.back() + s.q_len);
    cu_k.push_back(cu_k.back() + s.kv_len);
    max_q = std::max(max_q, s.q_len);
  }
  const int total_q = cu_q.back(), total_k = cu_k.back();
  const int D = c.head_dim, H = c.num_heads, KV = c.num_kv_heads;
  // With fused QKV, the key rows live in the same buffer as the query rows, so both need total_k rows.
  int64_t q_stride = H * D, k_stride = KV * D, v_stride = KV * D;
  HostTensor q, k, v;
  if (c.fused_qkv) {
    ASSERT_EQ(total_q, total_k) << "fused QKV needs q_len == kv_len per sequence";
    q_stride = k_stride = v_stride = static_cast<int64_t>(H + 2 * KV) * D;
    q = HostTensor::random(c.dtype, static_cast<size_t>(total_q) * q_stride, rng);
  } else {
    q = HostTensor::random(c.dtype, static_cast<size_t>(total_q) * q_stride, rng);
    k = HostTensor::random(c.dtype, static_cast<size_t>(total_k) * k_stride, rng);
    v = HostTensor::random(c.dtype, static_cast<size_t>(total_k) * v_stride, rng);
  }

  // Device masks with device segment_ends; host masks with host pointers for the reference.
  std::vector<int32_t> all_ends;
  std::vector<size_t> end_offsets;
  for (auto& s : seqs) {
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

  DeviceBuffer d_q, d_k, d_v, d_out, d_cu_q, d_cu_k, d_masks;
  upload(d_q, q.bits);
  if (!c.fused_qkv) {
    upload(d_k, k.bits);
    upload(d_v, v.bits);
  }
  upload(d_cu_q, cu_q);
  upload(d_cu_k, cu_k);
  upload(d_masks, dev_masks);
  const size_t out_elems = static_cast<size_t>(total_q) * H * D;
  d_out.allocate(out_elems * 2);
  poison(d_out);

  PrefillArgs args;
  args.out = d_out.get();
  args.q = d_q.get();
  if (c.fused_qkv) {
    args.k = d_q.as<uint16_t>() + H * D;
    args.v = d_q.as<uint16_t>() + (H + KV) * D;
  } else {
    args.k = d_k.get();
    args.v = d_v.get();
  }
  args.cu_seqlens_q = d_cu_q.as<int32_t>();
  args.cu_seqlens_k = d_cu_k.as<int32_t>();
  args.masks = d_masks.as<MaskParams>();
  args.num_seqs = static_cast<int32_t>(seqs.size());
  args.max_seqlen_q = max_q;
  args.total_q = total_q;
  args.total_k = total_k;
  args.num_heads = H;
  args.num_kv_heads = KV;
  args.head_dim = D;
  args.q_row_stride = q_stride;
  args.k_row_stride = k_stride;
  args.v_row_stride = v_stride;
  args.out_row_stride = static_cast<int64_t>(H) * D;
  args.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
  // As the backend runs it: the Hopper kernel takes its tiles from the counters, which every call
  // must leave at 0 for the next.
  DeviceBuffer d_counters;
  upload(d_counters, std::vector<int32_t>{0, 0});
  args.tile_counters = d_counters.as<int32_t>();
  ASSERT_EQ(kernels::cuda::prefill_unsupported(c.dtype, args, c.kernel), "");
  CUDA_OK(kernels::cuda::prefill_attention(c.dtype, args, nullptr, c.kernel));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(download<int32_t>(d_counters, 2), (std::vector<int32_t>{0, 0}));

  const std::vector<float>& kv_src_k = c.fused_qkv ? q.values : k.values;
  const std::vector<float>& kv_src_v = c.fused_qkv ? q.values : v.values;
  const size_t k_off = c.fused_qkv ? static_cast<size_t>(H) * D : 0;
  const size_t v_off = c.fused_qkv ? static_cast<size_t>(H + KV) * D : 0;
  std::vector<float> k_view(kv_src_k.begin() + k_off, kv_src_k.end());
  std::vector<float> v_view(kv_src_v.begin() + v_off, kv_src_v.end());
  k_view.resize(k_view.size() + k_off);
  v_view.resize(v_view.size() + v_off);
  const std::vector<float> ref = reference_prefill(q.values, q_stride, k_view, k_stride, v_view, v_stride, cu_q, cu_k,
                                                   host_masks, H, KV, D, args.softmax_scale);
  const std::vector<float> out = to_floats(download<uint16_t>(d_out, out_elems), c.dtype);
  // Per sequence, so a failure names the policy.
  for (size_t s = 0; s < seqs.size(); ++s) {
    const size_t b = static_cast<size_t>(cu_q[s]) * H * D, e = static_cast<size_t>(cu_q[s + 1]) * H * D;
    std::vector<float> o(out.begin() + b, out.begin() + e), r(ref.begin() + b, ref.begin() + e);
    const double err = normalized_error(o, r);
    EXPECT_LE(err, tolerance(c.dtype)) << "seq " << s << " kind " << static_cast<int>(seqs[s].mask.kind)
                                       << " q_len " << seqs[s].q_len << " kv_len " << seqs[s].kv_len << " dtype "
                                       << name(c.dtype) << " head_dim " << D;
  }
}

// Many sequences in one batch, each with its own policy; lengths shorter than, equal to and just past
// a tile; single-token sequences and segments; a window larger than the sequence; sinks.
std::vector<SeqSpec> mixed_batch() {
  return {
      causal(1, 1),
      causal(77, 77),
      bidirectional(128, 128),
      sliding(129, 129, 32, 0),
      sliding(300, 300, 64, 4),
      sliding(45, 45, 1000, 0),                   // window larger than the sequence
      segments(200, 200, 5, {6, 70, 71, 150}),    // single-token segment, tail after 150
      segments(33, 33, 0, {1, 2, 3, 33}),         // single-token segments, no tail, no prefix
      causal(517, 517),
      bidirectional(3, 3),
      sliding(260, 260, 1, 3),                    // window 1: itself plus sinks
  };
}

class PrefillMixed : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(PrefillMixed, GqaMixedPolicies) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  run_case({dtype, head_dim, 8, 2, false}, mixed_batch(), 1234 + head_dim);
}

TEST_P(PrefillMixed, GqaMixedPoliciesMmaKernel) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  run_case({dtype, head_dim, 8, 2, false, PrefillKernel::kMmaSync}, mixed_batch(), 4321 + head_dim);
}

TEST_P(PrefillMixed, MqaChunkedPrefill) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  // q_len < kv_len: the queries are the last positions (chunked prefill, decode through prefill).
  run_case({dtype, head_dim, 4, 1, false},
           {causal(50, 300), causal(1, 129), sliding(70, 400, 100, 8), segments(40, 250, 10, {100, 180}),
            bidirectional(17, 90), sliding(128, 1000, 200, 0)},
           99 + head_dim);
}

TEST_P(PrefillMixed, FusedQkvStrides) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim] = GetParam();
  run_case({dtype, head_dim, 6, 3, true}, {causal(190, 190), sliding(257, 257, 50, 2), bidirectional(64, 64)},
           7 + head_dim);
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndHeadDims, PrefillMixed,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP16),
                                            ::testing::Values(32, 64, 128, 256)),
                         [](const auto& info) {
                           return std::string(name(std::get<0>(info.param))) + "_hd" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(PrefillAttention, MmaKernelExplicitlyOnLongCausal) {
  TESSERA_REQUIRE_GPU();
  run_case({DType::kBF16, 128, 4, 4, false, PrefillKernel::kMmaSync}, {causal(1000, 1000), sliding(700, 700, 256, 4)},
           5);
}

// head_dim 256 runs 64-key tiles on Hopper and 64-row query tiles on mma.sync: a long causal sequence
// one past a tile of both, and a window with sinks whose edge falls inside a tile.
TEST(PrefillAttention, HeadDim256LongSequencesOnBothKernels) {
  TESSERA_REQUIRE_GPU();
  for (const PrefillKernel kernel : {PrefillKernel::kAuto, PrefillKernel::kMmaSync}) {
    run_case({DType::kFP16, 256, 2, 1, false, kernel}, {causal(4097, 4097), sliding(1000, 1000, 65, 3)}, 256);
  }
}

// Several times more tiles than SMs, of every policy and of very different lengths, so that each
// persistent CTA runs many tiles back to back and switches policy between them; the shortest
// sequence comes last, so tiles of the longest are still running when it is taken.
TEST(PrefillAttention, PersistentCtasRunManyTilesOfMixedPolicies) {
  TESSERA_REQUIRE_GPU();
  for (const int head_dim : {64, 128, 256}) {
    run_case({DType::kBF16, head_dim, 16, 4, false},
             {causal(1000, 1000), segments(900, 900, 64, {100, 230, 231, 600}), sliding(700, 1200, 64, 4),
              bidirectional(300, 300), causal(5, 5)},
             31 + head_dim);
  }
}

TEST(PrefillAttention, ReportsUnsupportedValuesByName) {
  PrefillArgs args;
  args.head_dim = 96;
  args.num_heads = 8;
  args.num_kv_heads = 2;
  const std::string why = kernels::cuda::prefill_unsupported(DType::kBF16, args);
  EXPECT_NE(why.find("head_dim: 96"), std::string::npos) << why;
  args.head_dim = 64;
  args.num_kv_heads = 3;
  EXPECT_NE(kernels::cuda::prefill_unsupported(DType::kBF16, args).find("num_kv_heads"), std::string::npos);
  EXPECT_EQ(kernels::cuda::prefill_attention(DType::kBF16, args, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tessera::gpu_test
