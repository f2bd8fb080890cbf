// tests/gpu/test_kv_cache.cpp: KV cache append and gather against host copies (bit-exact): K/V as
// views into a fused QKV buffer and with odd strides (the 2-byte path), skipped slots, evicted and
// out-of-range block-table entries, sequence lengths that are not block multiples; then chunked
// prefill over the paged cache (append the chunk, gather, prefill) against the CPU attention; and the
// rotating copy that moves a cached document's K/V to another position, against a host rotation; and
// RoPE fused into the append, bit-exact against rope_inplace then kv_cache_append.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/kv_cache/kv_cache.h"
#include "kernels/cuda/rope/rope.h"
#include "reference.h"

namespace tessera::gpu_test {
namespace {

using kernels::MaskParams;

struct AppendCase {
  DType dtype;
  int head_dim;
  int num_kv_heads;
  int block_size;
  bool fused;        // K and V are column slices of a [tokens, (H + 2 KV) * D] QKV buffer
  int stride_pad;    // separate K / V buffers with rows width + stride_pad apart (odd: 2-byte path)
};

void run_append(const AppendCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int D = c.head_dim, KV = c.num_kv_heads, H = 3 * KV, width = KV * D;
  const int tokens = 13, num_blocks = 7;
  const int64_t num_slots = static_cast<int64_t>(num_blocks) * c.block_size;
  const int64_t qkv_stride = static_cast<int64_t>(H + 2 * KV) * D;
  const int64_t stride = c.fused ? qkv_stride : width + c.stride_pad;
  HostTensor src_k = HostTensor::random(c.dtype, static_cast<size_t>(tokens) * stride, rng);
  HostTensor src_v = HostTensor::random(c.dtype, static_cast<size_t>(tokens) * stride, rng);
  HostTensor k_cache = HostTensor::random(c.dtype, static_cast<size_t>(num_slots) * width, rng);
  HostTensor v_cache = HostTensor::random(c.dtype, static_cast<size_t>(num_slots) * width, rng);

  // Distinct slots drawn from the whole cache, with a few padding / out-of-range entries.
  std::vector<int32_t> all(num_slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> slots(all.begin(), all.begin() + tokens);
  slots[2] = -1;
  slots[7] = static_cast<int32_t>(num_slots);
  slots[11] = -5;
  slots[12] = static_cast<int32_t>(num_slots - 1);
  if (std::count(slots.begin(), slots.begin() + 12, slots[12]) > 0) slots[12] = -1;

  DeviceBuffer d_k, d_v, d_kc, d_vc, d_slots;
  upload(d_k, src_k.bits);
  upload(d_v, src_v.bits);
  upload(d_kc, k_cache.bits);
  upload(d_vc, v_cache.bits);
  upload(d_slots, slots);
  // Fused: K at column H * D of the QKV row, V at (H + KV) * D (both in src_k's buffer).
  const uint16_t* k_ptr = c.fused ? d_k.as<uint16_t>() + H * D : d_k.as<uint16_t>();
  const uint16_t* v_ptr = c.fused ? d_k.as<uint16_t>() + (H + KV) * D : d_v.as<uint16_t>();
  ASSERT_EQ(kernels::cuda::kv_cache_append_unsupported(c.dtype, tokens, KV, D, stride, stride, num_slots), "");
  CUDA_OK(kernels::cuda::kv_cache_append(c.dtype, d_kc.get(), d_vc.get(), k_ptr, stride, v_ptr, stride,
                                         d_slots.as<int32_t>(), tokens, KV, D, num_slots, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> want_k = k_cache.bits, want_v = v_cache.bits;
  for (int t = 0; t < tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= num_slots) continue;
    for (int i = 0; i < width; ++i) {
      const size_t src = static_cast<size_t>(t) * stride + i;
      want_k[static_cast<size_t>(slots[t]) * width + i] = c.fused ? src_k.bits[src + H * D] : src_k.bits[src];
      want_v[static_cast<size_t>(slots[t]) * width + i] = c.fused ? src_k.bits[src + (H + KV) * D] : src_v.bits[src];
    }
  }
  const std::vector<uint16_t> got_k = download<uint16_t>(d_kc, want_k.size());
  const std::vector<uint16_t> got_v = download<uint16_t>(d_vc, want_v.size());
  for (size_t i = 0; i < want_k.size(); ++i) {
    ASSERT_EQ(got_k[i], want_k[i]) << "K slot " << i / width << " elem " << i % width << " " << name(c.dtype);
    ASSERT_EQ(got_v[i], want_v[i]) << "V slot " << i / width << " elem " << i % width << " " << name(c.dtype);
  }
}

class KvCacheParam : public ::testing::TestWithParam<std::tuple<DType, int, int>> {};

TEST_P(KvCacheParam, AppendFromFusedQkv) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim, block_size] = GetParam();
  run_append({dtype, head_dim, 2, block_size, true, 0}, 1 + head_dim + block_size);
  run_append({dtype, head_dim, 1, block_size, true, 0}, 2 + head_dim + block_size);  // MQA
}

TEST_P(KvCacheParam, AppendWithOddStrides) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim, block_size] = GetParam();
  run_append({dtype, head_dim, 3, block_size, false, 3}, 3 + head_dim + block_size);  // 2-byte path
  run_append({dtype, head_dim, 3, block_size, false, 8}, 4 + head_dim + block_size);  // padded, vector path
}

// Block tables drawn from a shuffled pool; `evict` marks one block per sequence (when it has two or
// more) as -1 and `oob` one as num_blocks.
struct GatherSetup {
  int num_blocks = 0, max_blocks = 0;
  std::vector<int32_t> tables, cu;
};

GatherSetup make_tables(const std::vector<int>& lens, int block_size, std::mt19937& rng, bool damage) {
  GatherSetup g;
  g.max_blocks = 1;
  for (int len : lens) g.max_blocks = std::max(g.max_blocks, (len + block_size - 1) / block_size);
  const int num_seqs = static_cast<int>(lens.size());
  g.num_blocks = num_seqs * g.max_blocks + 2;
  std::vector<int32_t> pool(g.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  g.tables.assign(static_cast<size_t>(num_seqs) * g.max_blocks, -1);
  g.cu = {0};
  for (int s = 0, next = 0; s < num_seqs; ++s) {
    const int nb = (lens[s] + block_size - 1) / block_size;
    for (int b = 0; b < nb; ++b) g.tables[static_cast<size_t>(s) * g.max_blocks + b] = pool[next++];
    if (damage && nb >= 2) g.tables[static_cast<size_t>(s) * g.max_blocks + (s % 2 == 0 ? 0 : nb - 1)] = -1;
    if (damage && nb >= 3) g.tables[static_cast<size_t>(s) * g.max_blocks + 1] = g.num_blocks;
    g.cu.push_back(g.cu.back() + lens[s]);
  }
  return g;
}

// Host gather: the rows kv_cache_gather should write (zeros where the table has no valid block).
std::vector<uint16_t> host_gather(const std::vector<uint16_t>& cache, const GatherSetup& g, int total_k,
                                  int block_size, int width) {
  std::vector<uint16_t> out(static_cast<size_t>(total_k) * width, 0);
  for (size_t s = 0; s + 1 < g.cu.size(); ++s)
    for (int pos = 0; pos < g.cu[s + 1] - g.cu[s]; ++pos) {
      const int32_t b = g.tables[s * g.max_blocks + pos / block_size];
      if (b < 0 || b >= g.num_blocks) continue;
      const size_t src = (static_cast<size_t>(b) * block_size + pos % block_size) * width;
      std::copy_n(cache.begin() + static_cast<int64_t>(src), width,
                  out.begin() + static_cast<int64_t>(g.cu[s] + pos) * width);
    }
  return out;
}

TEST_P(KvCacheParam, GatherWithEvictedBlocks) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, head_dim, block_size] = GetParam();
  for (int KV : {2, 3}) {
    for (bool damage : {false, true}) {
      std::mt19937 rng(head_dim + block_size + KV + damage);
      const std::vector<int> lens{17, 1, 0, 50, 33, 2 * block_size};
      const GatherSetup g = make_tables(lens, block_size, rng, damage);
      const int width = KV * head_dim;
      const int covered = g.cu.back(), total_k = covered + 3;  // three rows past the batch: zeros
      const size_t cache_elems = static_cast<size_t>(g.num_blocks) * block_size * width;
      HostTensor k_cache = HostTensor::random(dtype, cache_elems, rng);
      HostTensor v_cache = HostTensor::random(dtype, cache_elems, rng);
      DeviceBuffer d_kc, d_vc, d_tables, d_cu, d_k(static_cast<size_t>(total_k) * width * 2 + 16),
          d_v(static_cast<size_t>(total_k) * width * 2 + 16);
      upload(d_kc, k_cache.bits);
      upload(d_vc, v_cache.bits);
      upload(d_tables, g.tables);
      upload(d_cu, g.cu);
      poison(d_k);
      poison(d_v);
      const int num_seqs = static_cast<int>(lens.size());
      ASSERT_EQ(kernels::cuda::kv_cache_gather_unsupported(dtype, g.max_blocks, num_seqs, total_k, block_size, KV,
                                                           head_dim, g.num_blocks),
                "");
      CUDA_OK(kernels::cuda::kv_cache_gather(dtype, d_k.get(), d_v.get(), d_kc.get(), d_vc.get(),
                                             d_tables.as<int32_t>(), g.max_blocks, d_cu.as<int32_t>(), num_seqs,
                                             total_k, block_size, KV, head_dim, g.num_blocks, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> want_k = host_gather(k_cache.bits, g, total_k, block_size, width);
      const std::vector<uint16_t> want_v = host_gather(v_cache.bits, g, total_k, block_size, width);
      const std::vector<uint16_t> got_k = download<uint16_t>(d_k, want_k.size());
      const std::vector<uint16_t> got_v = download<uint16_t>(d_v, want_v.size());
      for (size_t i = 0; i < want_k.size(); ++i) {
        ASSERT_EQ(got_k[i], want_k[i]) << "K row " << i / width << " elem " << i % width << " KV " << KV
                                       << " damage " << damage;
        ASSERT_EQ(got_v[i], want_v[i]) << "V row " << i / width << " elem " << i % width << " KV " << KV
                                       << " damage " << damage;
      }
    }
  }
}

// Chunked prefill over the paged cache: each sequence has `cached` tokens in the cache already and
// a chunk of `chunk` new tokens in a fused QKV buffer. The chunk's K/V are appended, the whole
// context gathered, and the prefill kernel runs on the chunk's queries (bottom-right aligned).
TEST_P(KvCacheParam, ChunkedPrefillOverPagedCache) {
  TESSERA_REQUIRE_GPU();
  const auto [dtype, D, BS] = GetParam();
  std::mt19937 rng(D * 7 + BS);
  const int H = 6, KV = 2, width = KV * D;
  const std::vector<int> cached{37, 0, 16, 90}, chunk{5, 23, 1, 64};
  const int num_seqs = static_cast<int>(cached.size());
  std::vector<int> lens(num_seqs);
  std::vector<int32_t> cu_q{0};
  int max_q = 0;
  for (int s = 0; s < num_seqs; ++s) {
    lens[s] = cached[s] + chunk[s];
    cu_q.push_back(cu_q.back() + chunk[s]);
    max_q = std::max(max_q, chunk[s]);
  }
  const GatherSetup g = make_tables(lens, BS, rng, false);
  const int total_q = cu_q.back(), total_k = g.cu.back();
  const size_t cache_elems = static_cast<size_t>(g.num_blocks) * BS * width;
  HostTensor k_cache = HostTensor::random(dtype, cache_elems, rng);
  HostTensor v_cache = HostTensor::random(dtype, cache_elems, rng);
  const int64_t qkv_stride = static_cast<int64_t>(H + 2 * KV) * D;
  HostTensor qkv = HostTensor::random(dtype, static_cast<size_t>(total_q) * qkv_stride, rng);
  std::vector<int32_t> slots(total_q);
  for (int s = 0; s < num_seqs; ++s)
    for (int i = 0; i < chunk[s]; ++i) {
      const int pos = cached[s] + i;
      slots[cu_q[s] + i] = g.tables[static_cast<size_t>(s) * g.max_blocks + pos / BS] * BS + pos % BS;
    }

  DeviceBuffer d_kc, d_vc, d_qkv, d_slots, d_tables, d_cu_k, d_cu_q, d_masks;
  upload(d_kc, k_cache.bits);
  upload(d_vc, v_cache.bits);
  upload(d_qkv, qkv.bits);
  upload(d_slots, slots);
  upload(d_tables, g.tables);
  upload(d_cu_k, g.cu);
  upload(d_cu_q, cu_q);
  const std::vector<MaskParams> masks(num_seqs);  // causal
  upload(d_masks, masks);
  DeviceBuffer d_k(static_cast<size_t>(total_k) * width * 2 + 16), d_v(static_cast<size_t>(total_k) * width * 2 + 16);
  DeviceBuffer d_out(static_cast<size_t>(total_q) * H * D * 2 + 16);
  poison(d_out);
  const uint16_t* qkv_dev = d_qkv.as<uint16_t>();
  CUDA_OK(kernels::cuda::kv_cache_append(dtype, d_kc.get(), d_vc.get(), qkv_dev + H * D, qkv_stride,
                                         qkv_dev + (H + KV) * D, qkv_stride, d_slots.as<int32_t>(), total_q, KV, D,
                                         static_cast<int64_t>(g.num_blocks) * BS, nullptr));
  CUDA_OK(kernels::cuda::kv_cache_gather(dtype, d_k.get(), d_v.get(), d_kc.get(), d_vc.get(), d_tables.as<int32_t>(),
                                         g.max_blocks, d_cu_k.as<int32_t>(), num_seqs, total_k, BS, KV, D,
                                         g.num_blocks, nullptr));
  kernels::cuda::PrefillArgs args;
  args.out = d_out.get();
  args.q = qkv_dev;
  args.k = d_k.get();
  args.v = d_v.get();
  args.cu_seqlens_q = d_cu_q.as<int32_t>();
  args.cu_seqlens_k = d_cu_k.as<int32_t>();
  args.masks = d_masks.as<MaskParams>();
  args.num_seqs = num_seqs;
  args.max_seqlen_q = max_q;
  args.total_q = total_q;
  args.total_k = total_k;
  args.num_heads = H;
  args.num_kv_heads = KV;
  args.head_dim = D;
  args.q_row_stride = qkv_stride;
  args.k_row_stride = args.v_row_stride = width;
  args.out_row_stride = H * D;
  args.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
  ASSERT_EQ(kernels::cuda::prefill_unsupported(dtype, args), "");
  CUDA_OK(kernels::cuda::prefill_attention(dtype, args, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  // Reference: the cache after the append on the host, gathered into contiguous K/V.
  std::vector<float> kc = k_cache.values, vc = v_cache.values;
  for (int t = 0; t < total_q; ++t)
    for (int i = 0; i < width; ++i) {
      kc[static_cast<size_t>(slots[t]) * width + i] = qkv.values[t * qkv_stride + H * D + i];
      vc[static_cast<size_t>(slots[t]) * width + i] = qkv.values[t * qkv_stride + (H + KV) * D + i];
    }
  std::vector<float> k(static_cast<size_t>(total_k) * width), v(k.size());
  for (int s = 0; s < num_seqs; ++s)
    for (int pos = 0; pos < lens[s]; ++pos) {
      const size_t src = (static_cast<size_t>(g.tables[static_cast<size_t>(s) * g.max_blocks + pos / BS]) * BS +
                          pos % BS) * width;
      std::copy_n(kc.begin() + static_cast<int64_t>(src), width, k.begin() + static_cast<int64_t>(g.cu[s] + pos) * width);
      std::copy_n(vc.begin() + static_cast<int64_t>(src), width, v.begin() + static_cast<int64_t>(g.cu[s] + pos) * width);
    }
  const std::vector<float> ref = reference_prefill(qkv.values, qkv_stride, k, width, v, width, cu_q, g.cu, masks, H,
                                                   KV, D, args.softmax_scale);
  const std::vector<float> out = to_floats(download<uint16_t>(d_out, ref.size()), dtype);
  EXPECT_LE(normalized_error(out, ref), tolerance(dtype)) << name(dtype) << " head_dim " << D << " block " << BS;
}

INSTANTIATE_TEST_SUITE_P(DtypesHeadDimsBlocks, KvCacheParam,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP16), ::testing::Values(64, 128),
                                            ::testing::Values(16, 32)),
                         [](const auto& info) {
                           return std::string(name(std::get<0>(info.param))) + "_hd" +
                                  std::to_string(std::get<1>(info.param)) + "_bs" +
                                  std::to_string(std::get<2>(info.param));
                         });

// The rotating copy on awkward shapes (3 KV heads of 80, 1 of 6): V bit-exact, K within one rounding
// of the host's fp32 rotation of the same inputs (sincosf against std::cos/std::sin), rotation 0
// bit-exact, negative and large shifts, and every slot outside the copied rows left untouched.
TEST(KvCache, CopyRotateMovesRowsAndRotatesK) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (auto [KV, D] : {std::pair{3, 80}, std::pair{1, 6}, std::pair{2, 64}}) {
      std::mt19937 rng(static_cast<uint32_t>(KV * 1000 + D));
      const int width = KV * D, num_slots = 61, rows = 23;
      HostTensor k = HostTensor::random(dtype, static_cast<size_t>(num_slots) * width, rng, -2.f, 2.f);
      HostTensor v = HostTensor::random(dtype, static_cast<size_t>(num_slots) * width, rng, -2.f, 2.f);
      std::vector<int32_t> all(num_slots);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const std::vector<int32_t> src(all.begin(), all.begin() + rows), dst(all.begin() + rows, all.begin() + 2 * rows);
      std::vector<int32_t> shift(rows);
      for (int r = 0; r < rows; ++r) shift[r] = r % 5 == 0 ? 0 : static_cast<int32_t>(rng() % 4001) - 2000;
      std::vector<float> inv_freq(D / 2);
      for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / D);

      DeviceBuffer d_k, d_v, d_src, d_dst, d_shift, d_freq;
      upload(d_k, k.bits);
      upload(d_v, v.bits);
      upload(d_src, src);
      upload(d_dst, dst);
      upload(d_shift, shift);
      upload(d_freq, inv_freq);
      ASSERT_EQ(kernels::cuda::kv_cache_copy_rotate_unsupported(dtype, rows, KV, D), "");
      CUDA_OK(kernels::cuda::kv_cache_copy_rotate(dtype, d_k.get(), d_v.get(), d_src.as<int32_t>(),
                                                  d_dst.as<int32_t>(), d_shift.as<int32_t>(), rows, KV, D,
                                                  d_freq.as<float>(), nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got_k = download<uint16_t>(d_k, k.size());
      const std::vector<uint16_t> got_v = download<uint16_t>(d_v, v.size());
      std::vector<bool> written(num_slots, false);
      const float ulp = dtype == DType::kBF16 ? 1.f / 128 : 1.f / 1024;
      for (int r = 0; r < rows; ++r) {
        written[dst[r]] = true;
        for (int c = 0; c < width; ++c) {
          ASSERT_EQ(got_v[dst[r] * width + c], v.bits[src[r] * width + c]) << "V row " << r;
        }
        for (int h = 0; h < KV; ++h) {
          for (int i = 0; i < D / 2; ++i) {
            const size_t a = static_cast<size_t>(src[r]) * width + h * D + i, b = a + D / 2;
            const size_t out_a = static_cast<size_t>(dst[r]) * width + h * D + i, out_b = out_a + D / 2;
            if (shift[r] == 0) {
              EXPECT_EQ(got_k[out_a], k.bits[a]);
              EXPECT_EQ(got_k[out_b], k.bits[b]);
              continue;
            }
            const float angle = static_cast<float>(shift[r]) * inv_freq[i];
            const float want_a = k.values[a] * std::cos(angle) - k.values[b] * std::sin(angle);
            const float want_b = k.values[b] * std::cos(angle) + k.values[a] * std::sin(angle);
            EXPECT_NEAR(from_bits(got_k[out_a], dtype), want_a, ulp * (std::fabs(want_a) + 0.05f))
                << name(dtype) << " KV " << KV << " D " << D << " row " << r << " shift " << shift[r] << " i " << i;
            EXPECT_NEAR(from_bits(got_k[out_b], dtype), want_b, ulp * (std::fabs(want_b) + 0.05f));
          }
        }
      }
      for (int s = 0; s < num_slots; ++s) {
        if (written[s]) continue;
        for (int c = 0; c < width; ++c) {
          ASSERT_EQ(got_k[s * width + c], k.bits[s * width + c]) << "slot " << s << " was not a destination";
          ASSERT_EQ(got_v[s * width + c], v.bits[s * width + c]) << "slot " << s << " was not a destination";
        }
      }
    }
  }
  EXPECT_NE(kernels::cuda::kv_cache_copy_rotate_unsupported(DType::kBF16, 4, 2, 7), "");  // odd head_dim
}

TEST(KvCache, ReportsUnsupportedValuesByName) {
  EXPECT_NE(kernels::cuda::kv_cache_append_unsupported(DType::kBF16, 1, 2, 64, 64, 128, 16).find("k_row_stride"),
            std::string::npos);
  EXPECT_NE(kernels::cuda::kv_cache_append_unsupported(DType::kBF16, 1, 0, 64, 64, 64, 16).find("num_kv_heads"),
            std::string::npos);
  EXPECT_EQ(kernels::cuda::kv_cache_append_unsupported(DType::kFP16, 0, 2, 64, 128, 128, 0), "");
  EXPECT_NE(kernels::cuda::kv_cache_gather_unsupported(DType::kBF16, 4, 2, 10, 0, 2, 64, 8).find("block_size"),
            std::string::npos);
  EXPECT_NE(kernels::cuda::kv_cache_gather_unsupported(static_cast<DType>(7), 4, 2, 10, 16, 2, 64, 8).find("dtype"),
            std::string::npos);
}

// kv_cache_append_rope leaves q and the cache bit-identical to rope_inplace then kv_cache_append, on
// a fused QKV buffer: GQA and MQA, head_dim 16, 80 (not a multiple of the 32-thread block) and 256
// (pairs looped over the 128 threads), skipped slots, positions far apart; its k input is untouched.
TEST(KvCache, AppendRopeEqualsRopeThenAppend) {
  TESSERA_REQUIRE_GPU();
  namespace kc = kernels::cuda;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (const auto& [D, H, KV] : std::vector<std::tuple<int, int, int>>{{16, 4, 2}, {80, 3, 1}, {256, 2, 2}, {64, 32, 32}}) {
      std::mt19937 rng(static_cast<uint32_t>(D * 7 + H + KV));
      const int tokens = 11, num_slots = 40;
      const int64_t stride = static_cast<int64_t>(H + 2 * KV) * D;
      const int width = KV * D;
      HostTensor qkv = HostTensor::random(dtype, static_cast<size_t>(tokens) * stride, rng);
      HostTensor k_cache = HostTensor::random(dtype, static_cast<size_t>(num_slots) * width, rng);
      HostTensor v_cache = HostTensor::random(dtype, static_cast<size_t>(num_slots) * width, rng);
      std::vector<int32_t> slots(tokens), positions(tokens);
      for (int t = 0; t < tokens; ++t) {
        slots[t] = (t * 7 + 3) % num_slots;
        positions[t] = static_cast<int32_t>(rng() % 4000);
      }
      slots[4] = -1;
      slots[9] = num_slots;  // out of range: skipped
      std::vector<float> inv_freq(D / 2);
      for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
      DeviceBuffer d_inv, d_slots, d_pos;
      upload(d_inv, inv_freq);
      upload(d_slots, slots);
      upload(d_pos, positions);
      // Reference: rope_inplace on a copy of qkv, then kv_cache_append from it.
      DeviceBuffer ref_qkv, ref_kc, ref_vc, got_qkv, got_kc, got_vc;
      upload(ref_qkv, qkv.bits);
      upload(ref_kc, k_cache.bits);
      upload(ref_vc, v_cache.bits);
      upload(got_qkv, qkv.bits);
      upload(got_kc, k_cache.bits);
      upload(got_vc, v_cache.bits);
      uint16_t* rq = ref_qkv.as<uint16_t>();
      CUDA_OK(kc::rope_inplace(dtype, rq, rq + H * D, d_pos.as<int32_t>(), tokens, H, KV, D, stride, stride,
                               d_inv.as<float>(), nullptr));
      CUDA_OK(kc::kv_cache_append(dtype, ref_kc.get(), ref_vc.get(), rq + H * D, stride, rq + (H + KV) * D, stride,
                                  d_slots.as<int32_t>(), tokens, KV, D, num_slots, nullptr));
      uint16_t* gq = got_qkv.as<uint16_t>();
      ASSERT_EQ(kc::kv_cache_append_rope_unsupported(dtype, tokens, H, KV, D, stride, stride, stride, num_slots), "");
      CUDA_OK(kc::kv_cache_append_rope(dtype, got_kc.get(), got_vc.get(), gq, stride, gq + H * D, stride,
                                       gq + (H + KV) * D, stride, d_pos.as<int32_t>(), d_slots.as<int32_t>(), tokens,
                                       H, KV, D, num_slots, d_inv.as<float>(), nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what = std::string(name(dtype)) + " D " + std::to_string(D) + " H " + std::to_string(H) +
                               " KV " + std::to_string(KV);
      EXPECT_EQ(download<uint16_t>(got_kc, k_cache.bits.size()), download<uint16_t>(ref_kc, k_cache.bits.size())) << what;
      EXPECT_EQ(download<uint16_t>(got_vc, v_cache.bits.size()), download<uint16_t>(ref_vc, v_cache.bits.size())) << what;
      const std::vector<uint16_t> got = download<uint16_t>(got_qkv, qkv.bits.size());
      const std::vector<uint16_t> ref = download<uint16_t>(ref_qkv, qkv.bits.size());
      int q_diff = 0, k_changed = 0, rotated = 0;
      for (int t = 0; t < tokens; ++t)
        for (int64_t c = 0; c < stride; ++c) {
          const size_t i = static_cast<size_t>(t * stride + c);
          if (c < H * D) q_diff += got[i] != ref[i];                 // q: rotated as rope_inplace does
          if (c >= H * D) k_changed += got[i] != qkv.bits[i];        // k and v: read only
          if (c < H * D) rotated += got[i] != qkv.bits[i];
        }
      EXPECT_EQ(q_diff, 0) << what;
      EXPECT_EQ(k_changed, 0) << what;
      EXPECT_GT(rotated, tokens * H * D / 2) << what;
    }
  }
  EXPECT_NE(kc::kv_cache_append_rope_unsupported(DType::kBF16, 1, 2, 1, 15, 47, 47, 47, 8).find("head_dim must be even"),
            std::string::npos);
  EXPECT_NE(kc::kv_cache_append_rope_unsupported(DType::kBF16, 1, 2, 1, 16, 16, 64, 64, 8).find("q_row_stride must be"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::gpu_test
