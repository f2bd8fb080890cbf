// tests/gpu/test_fp8_kv_cache.cpp: the fp8-e4m3 paged KV cache (bf16 activations). Every kernel that
// writes or reads the cache, with an e4m3 cache against
//  - the same kernel on a bf16 cache holding the e4m3-rounded values ("rounded"): the reads widen
//    e4m3 to bf16 exactly, so these agree to the last bit except where the decode's split plan
//    differs with the smaller shared-memory footprint (then within the output's bf16 rounding);
//    bound 2e-3 rel L2, about one bf16 rounding;
//  - the CPU reference on those rounded values: the usual bf16 attention tolerance (1.5e-2);
//  - the same kernel on the plain bf16 cache: e4m3 keeps 3 mantissa bits, so each cached value is off
//    by up to 2^-4 relative, RMS about 2.4% for values spread over binades (a one-token context, whose
//    output is one V row, measures 0.024). Attention turns V's noise, independent across tokens, into
//    output noise of about the same relative size; K's noise moves each score by ~2.4% of the
//    scores' spread, which is ~2.7 here (q in +-2, K in +-4: a peaky softmax), so ~0.065 in log
//    probability, another ~0.035 of the output. Together sqrt(0.024^2 + 0.035^2) ~ 0.042 expected
//    over many outputs (0.043-0.044 measured for the paged prefill on an H200). A decode sequence's
//    error is taken over its own H * D outputs only (128 at head_dim 32), and with scores this peaky
//    a few tokens carry each head, so it scatters more: 0.048-0.079 per batch's worst sequence
//    measured (0.079 at head_dim 32). Bound 0.1, about twice the expectation. A wrong byte order,
//    scale or layout gives O(1).
// The appends (plain and fused with RoPE) are checked bit for bit against the host's e4m3 rounding
// of the same bf16 values (saturating at +-448), the gather against the host's widening, and the
// rotating copy against a host rotation within one e4m3 step. Shapes: head_dim 32, 64, 80, 96 and
// 128, GQA 9 query heads on 3 KV heads (SmolLM2), 8 on 2, 12 on 4 and 32 on 8; contexts 1, 63, 64,
// 65, 127, 513 and 2049 (1, 17 and 1000 at head dims 80 and 96) across block boundaries in one
// decode batch, with the split floor at 32 (many splits) and the default; the newest K/V row of
// each sequence appended by the kernel just before the decode on one stream, as a decode step runs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention_generic/attention_generic.h"
#include "kernels/cuda/kv_cache/kv_cache.h"
#include "kernels/cuda/rope/rope.h"
#include "reference.h"

namespace tessera::gpu_test {
namespace {

namespace kc = kernels::cuda;
using kc::KvDType;
using kernels::MaskKind;
using kernels::MaskParams;

constexpr double kRoundedBound = 2e-3;   // fp8 cache vs bf16 cache of the same (rounded) values
constexpr double kPlainBound = 0.1;      // fp8 cache vs the unrounded bf16 cache
constexpr DType kBf16 = DType::kBF16;

// The bf16 bits of an e4m3 byte's value (exact).
uint16_t widen(uint8_t e4m3) { return to_bits(kc::from_e4m3_bits(e4m3), kBf16); }

// The block tables of a batch: every sequence's blocks from one shuffled pool (out of order).
struct Paging {
  int block_size = 16, max_blocks = 1, num_blocks = 0;
  std::vector<int32_t> tables, cu;  // cu: prefix sums of the lengths (token rows of the batch)
  int64_t slot(int s, int pos) const {
    return static_cast<int64_t>(tables[static_cast<size_t>(s) * max_blocks + pos / block_size]) * block_size +
           pos % block_size;
  }
};

Paging make_paging(const std::vector<int>& lens, int block_size, std::mt19937& rng) {
  Paging p;
  p.block_size = block_size;
  for (int len : lens) p.max_blocks = std::max(p.max_blocks, (len + block_size - 1) / block_size);
  p.num_blocks = static_cast<int>(lens.size()) * p.max_blocks + 2;
  std::vector<int32_t> pool(p.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.tables.assign(lens.size() * p.max_blocks, -1);
  p.cu = {0};
  for (size_t s = 0, next = 0; s < lens.size(); ++s) {
    for (int b = 0; b < (lens[s] + block_size - 1) / block_size; ++b) p.tables[s * p.max_blocks + b] = pool[next++];
    p.cu.push_back(p.cu.back() + lens[s]);
  }
  return p;
}

// K/V rows for every token of a batch in bf16, spread over e4m3's binades (|x| up to 4, a few tiny
// values in its subnormal range), plus what each cache should hold after they are appended.
struct Rows {
  HostTensor k, v;  // [total tokens, width]
};

Rows random_rows(size_t tokens, int width, std::mt19937& rng) {
  Rows r{HostTensor::random(kBf16, tokens * width, rng, -4.f, 4.f), HostTensor::random(kBf16, tokens * width, rng, -4.f, 4.f)};
  for (size_t i = 0; i < r.k.size(); i += 97) r.k.set(i, r.k.values[i] * 1e-3f);  // e4m3 subnormals
  for (size_t i = 5; i < r.v.size(); i += 89) r.v.set(i, r.v.values[i] * 1e-3f);
  return r;
}

// A cache's bytes as the host rounds them: e4m3 of each row at its slot (zero elsewhere), and the
// bf16 cache of the widened values.
struct HostCaches {
  std::vector<uint8_t> k8, v8;
  std::vector<uint16_t> k_rounded, v_rounded, k_plain, v_plain;
};

HostCaches host_caches(const Rows& rows, const Paging& p, const std::vector<int>& lens, int width) {
  const size_t n = static_cast<size_t>(p.num_blocks) * p.block_size * width;
  HostCaches h{std::vector<uint8_t>(n, 0), std::vector<uint8_t>(n, 0), std::vector<uint16_t>(n, 0),
               std::vector<uint16_t>(n, 0), std::vector<uint16_t>(n, 0), std::vector<uint16_t>(n, 0)};
  for (size_t s = 0; s < lens.size(); ++s)
    for (int pos = 0; pos < lens[s]; ++pos) {
      const size_t src = static_cast<size_t>(p.cu[s] + pos) * width;
      const size_t dst = static_cast<size_t>(p.slot(static_cast<int>(s), pos)) * width;
      for (int i = 0; i < width; ++i) {
        h.k8[dst + i] = kc::to_e4m3_bits(rows.k.values[src + i]);
        h.v8[dst + i] = kc::to_e4m3_bits(rows.v.values[src + i]);
        h.k_rounded[dst + i] = widen(h.k8[dst + i]);
        h.v_rounded[dst + i] = widen(h.v8[dst + i]);
        h.k_plain[dst + i] = rows.k.bits[src + i];
        h.v_plain[dst + i] = rows.v.bits[src + i];
      }
    }
  return h;
}

std::vector<float> values_of(const std::vector<uint16_t>& bits) { return to_floats(bits, kBf16); }

// ---------------------------------------------------------------- append, gather

// Appends through the 16-byte path (rows of a multiple of 8, aligned) and the 1-byte path (an odd
// row stride), with skipped and out-of-range slots and values past e4m3's range: the cache bytes
// equal the host's rounding (saturated to +-448, never NaN), the other slots keep what they held;
// then the gather widens them back exactly.
TEST(Fp8KvCache, AppendRoundsToE4m3AndGatherWidensExactly) {
  TESSERA_REQUIRE_GPU();
  for (const auto& [KV, D, pad] : std::vector<std::tuple<int, int, int>>{{3, 64, 0}, {2, 128, 8}, {1, 32, 3}, {3, 80, 1}}) {
    std::mt19937 rng(static_cast<uint32_t>(KV * 100 + D + pad));
    const int width = KV * D, tokens = 29, num_slots = 48;
    const int64_t stride = width + pad;
    HostTensor k = HostTensor::random(kBf16, static_cast<size_t>(tokens) * stride, rng, -4.f, 4.f);
    HostTensor v = HostTensor::random(kBf16, static_cast<size_t>(tokens) * stride, rng, -4.f, 4.f);
    k.set(3, 1000.f);   // past 448: saturates
    v.set(4, -9000.f);
    k.set(5, 1e-4f);    // below e4m3's smallest subnormal (2^-9): rounds to 0
    v.set(6, 3e-3f);    // subnormal
    std::vector<int32_t> slots(tokens);
    std::vector<int32_t> all(num_slots);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), tokens, slots.begin());
    slots[7] = -1;
    slots[11] = num_slots;  // out of range: skipped
    std::vector<uint8_t> k8(static_cast<size_t>(num_slots) * width), v8(k8.size());
    for (size_t i = 0; i < k8.size(); ++i) k8[i] = static_cast<uint8_t>(rng()), v8[i] = static_cast<uint8_t>(rng());
    DeviceBuffer d_k, d_v, d_kc, d_vc, d_slots;
    upload(d_k, k.bits);
    upload(d_v, v.bits);
    upload(d_kc, k8);
    upload(d_vc, v8);
    upload(d_slots, slots);
    ASSERT_EQ(kc::kv_cache_append_unsupported(kBf16, tokens, KV, D, stride, stride, num_slots, KvDType::kFp8E4M3), "");
    CUDA_OK(kc::kv_cache_append(kBf16, d_kc.get(), d_vc.get(), d_k.get(), stride, d_v.get(), stride,
                                d_slots.as<int32_t>(), tokens, KV, D, num_slots, nullptr, KvDType::kFp8E4M3));
    CUDA_OK(cudaDeviceSynchronize());
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0 || slots[t] >= num_slots) continue;
      for (int i = 0; i < width; ++i) {
        k8[static_cast<size_t>(slots[t]) * width + i] = kc::to_e4m3_bits(k.values[static_cast<size_t>(t) * stride + i]);
        v8[static_cast<size_t>(slots[t]) * width + i] = kc::to_e4m3_bits(v.values[static_cast<size_t>(t) * stride + i]);
      }
    }
    const std::string what = "KV " + std::to_string(KV) + " D " + std::to_string(D) + " pad " + std::to_string(pad);
    const std::vector<uint8_t> got_k = download<uint8_t>(d_kc, k8.size()), got_v = download<uint8_t>(d_vc, v8.size());
    EXPECT_EQ(got_k, k8) << what;
    EXPECT_EQ(got_v, v8) << what;
    EXPECT_EQ(kc::from_e4m3_bits(got_k[static_cast<size_t>(slots[0]) * width + 3]), 448.f) << what;
    EXPECT_EQ(kc::from_e4m3_bits(got_v[static_cast<size_t>(slots[0]) * width + 4]), -448.f) << what;

    // Gather every slot as one sequence of num_slots tokens over an identity block table (block 1).
    const std::vector<int32_t> table{0}, cu{0, num_slots};
    DeviceBuffer d_table, d_cu, d_ok(static_cast<size_t>(num_slots) * width * 2 + 16),
        d_ov(static_cast<size_t>(num_slots) * width * 2 + 16);
    upload(d_table, table);
    upload(d_cu, cu);
    ASSERT_EQ(kc::kv_cache_gather_unsupported(kBf16, 1, 1, num_slots, num_slots, KV, D, 1, KvDType::kFp8E4M3), "");
    CUDA_OK(kc::kv_cache_gather(kBf16, d_ok.get(), d_ov.get(), d_kc.get(), d_vc.get(), d_table.as<int32_t>(), 1,
                                d_cu.as<int32_t>(), 1, num_slots, num_slots, KV, D, 1, nullptr, KvDType::kFp8E4M3));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> want_k(k8.size()), want_v(v8.size());
    for (size_t i = 0; i < k8.size(); ++i) want_k[i] = widen(k8[i]), want_v[i] = widen(v8[i]);
    EXPECT_EQ(download<uint16_t>(d_ok, want_k.size()), want_k) << what;
    EXPECT_EQ(download<uint16_t>(d_ov, want_v.size()), want_v) << what;
  }
}

// RoPE fused into the append writes, into an e4m3 cache, exactly what rope_inplace then the fp8
// append write, and rotates q identically.
TEST(Fp8KvCache, AppendRopeEqualsRopeThenAppend) {
  TESSERA_REQUIRE_GPU();
  for (const auto& [D, H, KV] : std::vector<std::tuple<int, int, int>>{{64, 9, 3}, {128, 8, 2}, {80, 3, 1}}) {
    std::mt19937 rng(static_cast<uint32_t>(D * 7 + H + KV));
    const int tokens = 13, num_slots = 40, width = KV * D;
    const int64_t stride = static_cast<int64_t>(H + 2 * KV) * D;
    HostTensor qkv = HostTensor::random(kBf16, static_cast<size_t>(tokens) * stride, rng, -4.f, 4.f);
    std::vector<uint8_t> cache(static_cast<size_t>(num_slots) * width, 0x11);
    std::vector<int32_t> slots(tokens), positions(tokens);
    for (int t = 0; t < tokens; ++t) {
      slots[t] = (t * 7 + 3) % num_slots;
      positions[t] = static_cast<int32_t>(rng() % 4000);
    }
    slots[4] = -1;
    std::vector<float> inv_freq(D / 2);
    for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
    DeviceBuffer d_inv, d_slots, d_pos, ref_qkv, ref_kc, ref_vc, got_qkv, got_kc, got_vc;
    upload(d_inv, inv_freq);
    upload(d_slots, slots);
    upload(d_pos, positions);
    upload(ref_qkv, qkv.bits);
    upload(got_qkv, qkv.bits);
    for (DeviceBuffer* b : {&ref_kc, &ref_vc, &got_kc, &got_vc}) upload(*b, cache);
    uint16_t* rq = ref_qkv.as<uint16_t>();
    CUDA_OK(kc::rope_inplace(kBf16, rq, rq + H * D, d_pos.as<int32_t>(), tokens, H, KV, D, stride, stride,
                             d_inv.as<float>(), nullptr));
    CUDA_OK(kc::kv_cache_append(kBf16, ref_kc.get(), ref_vc.get(), rq + H * D, stride, rq + (H + KV) * D, stride,
                                d_slots.as<int32_t>(), tokens, KV, D, num_slots, nullptr, KvDType::kFp8E4M3));
    uint16_t* gq = got_qkv.as<uint16_t>();
    ASSERT_EQ(kc::kv_cache_append_rope_unsupported(kBf16, tokens, H, KV, D, stride, stride, stride, num_slots,
                                                   KvDType::kFp8E4M3),
              "");
    CUDA_OK(kc::kv_cache_append_rope(kBf16, got_kc.get(), got_vc.get(), gq, stride, gq + H * D, stride,
                                     gq + (H + KV) * D, stride, d_pos.as<int32_t>(), d_slots.as<int32_t>(), tokens, H,
                                     KV, D, num_slots, d_inv.as<float>(), nullptr, KvDType::kFp8E4M3));
    CUDA_OK(cudaDeviceSynchronize());
    const std::string what = "D " + std::to_string(D) + " H " + std::to_string(H) + " KV " + std::to_string(KV);
    EXPECT_EQ(download<uint8_t>(got_kc, cache.size()), download<uint8_t>(ref_kc, cache.size())) << what;
    EXPECT_EQ(download<uint8_t>(got_vc, cache.size()), download<uint8_t>(ref_vc, cache.size())) << what;
    const std::vector<uint16_t> got = download<uint16_t>(got_qkv, qkv.size()), ref = download<uint16_t>(ref_qkv, qkv.size());
    int q_diff = 0;
    for (int t = 0; t < tokens; ++t)
      for (int c = 0; c < H * D; ++c) q_diff += got[static_cast<size_t>(t * stride + c)] != ref[static_cast<size_t>(t * stride + c)];
    EXPECT_EQ(q_diff, 0) << what;
    int written = 0;
    for (uint8_t b : download<uint8_t>(got_kc, cache.size())) written += b != 0x11;
    EXPECT_GT(written, (tokens - 1) * width / 2) << what;
  }
}

// The rotating copy on an e4m3 cache: V bytes and unrotated K bytes copied exactly; rotated K within
// one e4m3 step (2^-3 of the value's binade) of the host's fp32 rotation of the widened source, every
// other slot untouched.
TEST(Fp8KvCache, CopyRotateOnAnE4m3Cache) {
  TESSERA_REQUIRE_GPU();
  for (auto [KV, D] : {std::pair{3, 64}, std::pair{1, 80}}) {
    std::mt19937 rng(static_cast<uint32_t>(KV * 31 + D));
    const int width = KV * D, num_slots = 50, rows = 17;
    std::vector<uint8_t> k(static_cast<size_t>(num_slots) * width), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      // Finite e4m3 values only (0x7f / 0xff are NaN).
      k[i] = static_cast<uint8_t>(rng() % 0x7f) | static_cast<uint8_t>(rng() & 0x80);
      v[i] = static_cast<uint8_t>(rng() % 0x7f) | static_cast<uint8_t>(rng() & 0x80);
    }
    std::vector<int32_t> order(num_slots);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> src(order.begin(), order.begin() + rows), dst(order.begin() + rows, order.begin() + 2 * rows),
        shift(rows);
    for (int r = 0; r < rows; ++r) shift[r] = r % 4 == 0 ? 0 : static_cast<int32_t>(rng() % 3000) - 1000;
    std::vector<float> inv_freq(D / 2);
    for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
    std::vector<int32_t> packed = src;
    packed.insert(packed.end(), dst.begin(), dst.end());
    packed.insert(packed.end(), shift.begin(), shift.end());
    DeviceBuffer d_k, d_v, d_idx, d_inv;
    upload(d_k, k);
    upload(d_v, v);
    upload(d_idx, packed);
    upload(d_inv, inv_freq);
    const int32_t* idx = d_idx.as<int32_t>();
    ASSERT_EQ(kc::kv_cache_copy_rotate_unsupported(kBf16, rows, KV, D, KvDType::kFp8E4M3), "");
    CUDA_OK(kc::kv_cache_copy_rotate(kBf16, d_k.get(), d_v.get(), idx, idx + rows, idx + 2 * rows, rows, KV, D,
                                     d_inv.as<float>(), nullptr, KvDType::kFp8E4M3));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got_k = download<uint8_t>(d_k, k.size()), got_v = download<uint8_t>(d_v, v.size());
    std::vector<bool> is_dst(num_slots, false);
    for (int32_t d : dst) is_dst[d] = true;
    int far = 0, checked = 0;
    for (int s = 0; s < num_slots; ++s) {
      if (is_dst[s]) continue;
      for (int i = 0; i < width; ++i) {
        far += got_k[static_cast<size_t>(s) * width + i] != k[static_cast<size_t>(s) * width + i];
        far += got_v[static_cast<size_t>(s) * width + i] != v[static_cast<size_t>(s) * width + i];
      }
    }
    EXPECT_EQ(far, 0) << "slots outside the copy changed, KV " << KV << " D " << D;
    for (int r = 0; r < rows; ++r) {
      const size_t a = static_cast<size_t>(src[r]) * width, b = static_cast<size_t>(dst[r]) * width;
      for (int i = 0; i < width; ++i) EXPECT_EQ(got_v[b + i], v[a + i]);
      for (int h = 0; h < KV; ++h)
        for (int i = 0; i < D / 2; ++i) {
          const size_t lo = static_cast<size_t>(h) * D + i, hi = lo + D / 2;
          if (shift[r] == 0) {
            EXPECT_EQ(got_k[b + lo], k[a + lo]);
            EXPECT_EQ(got_k[b + hi], k[a + hi]);
            continue;
          }
          const double angle = static_cast<double>(static_cast<float>(shift[r]) * inv_freq[i]);
          const double x1 = kc::from_e4m3_bits(k[a + lo]), x2 = kc::from_e4m3_bits(k[a + hi]);
          const double want[2] = {x1 * std::cos(angle) - x2 * std::sin(angle), x2 * std::cos(angle) + x1 * std::sin(angle)};
          const double got[2] = {kc::from_e4m3_bits(got_k[b + lo]), kc::from_e4m3_bits(got_k[b + hi])};
          for (int j = 0; j < 2; ++j) {
            const double w = std::min(std::abs(want[j]), 448.0);
            EXPECT_LE(std::abs(got[j] - std::copysign(w, want[j])), 0.125 * w + std::ldexp(1.0, -9))
                << "row " << r << " head " << h << " pair " << i << " KV " << KV << " D " << D;
            ++checked;
          }
        }
    }
    EXPECT_GT(checked, 0);
  }
}

// ---------------------------------------------------------------- decode

struct DecodeShape {
  int head_dim, num_heads, num_kv_heads, block_size;
  std::vector<int> lens;
  bool sliding = false;
};

// One decode step as the backend runs it: every row but each sequence's newest already cached
// (appended and synchronized), then on one stream the newest rows' append and the decode, for an
// e4m3 cache and the plain bf16 cache; the rounded bf16 cache is uploaded whole. Each with the split
// floor at 32 and at the default.
void run_fp8_decode(const DecodeShape& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int D = c.head_dim, H = c.num_heads, KV = c.num_kv_heads, width = KV * D;
  const int num_seqs = static_cast<int>(c.lens.size());
  const Paging p = make_paging(c.lens, c.block_size, rng);
  const int total = p.cu.back();
  const Rows rows = random_rows(static_cast<size_t>(total), width, rng);
  const HostCaches h = host_caches(rows, p, c.lens, width);
  HostTensor q = HostTensor::random(kBf16, static_cast<size_t>(num_seqs) * H * D, rng, -2.f, 2.f);
  std::vector<MaskParams> masks(num_seqs);
  if (c.sliding) {
    for (int s = 0; s < num_seqs; ++s) {
      masks[s].kind = MaskKind::kSlidingWindow;
      masks[s].window = 1 + (s * 53) % 200;
      masks[s].sinks = s % 2 == 0 ? 4 : 0;
    }
  }
  std::vector<int32_t> old_slots(total, -1), new_slots(num_seqs);
  std::vector<uint16_t> new_k(static_cast<size_t>(num_seqs) * width), new_v(new_k.size());
  for (int s = 0; s < num_seqs; ++s) {
    for (int pos = 0; pos + 1 < c.lens[s]; ++pos) old_slots[p.cu[s] + pos] = static_cast<int32_t>(p.slot(s, pos));
    new_slots[s] = static_cast<int32_t>(p.slot(s, c.lens[s] - 1));
    const size_t row = static_cast<size_t>(p.cu[s] + c.lens[s] - 1) * width;
    std::copy_n(rows.k.bits.begin() + row, width, new_k.begin() + static_cast<size_t>(s) * width);
    std::copy_n(rows.v.bits.begin() + row, width, new_v.begin() + static_cast<size_t>(s) * width);
  }
  const size_t cache_elems = h.k8.size();
  DeviceBuffer d_k, d_v, d_old, d_new_k, d_new_v, d_new, d_q, d_tables, d_lens, d_masks;
  upload(d_k, rows.k.bits);
  upload(d_v, rows.v.bits);
  upload(d_old, old_slots);
  upload(d_new_k, new_k);
  upload(d_new_v, new_v);
  upload(d_new, new_slots);
  upload(d_q, q.bits);
  upload(d_tables, p.tables);
  upload(d_lens, std::vector<int32_t>(c.lens.begin(), c.lens.end()));
  upload(d_masks, masks);
  DeviceBuffer k8(cache_elems + 16), v8(cache_elems + 16), kb(cache_elems * 2 + 16), vb(cache_elems * 2 + 16), kr, vr;
  for (DeviceBuffer* b : {&k8, &v8, &kb, &vb}) CUDA_OK(cudaMemset(b->get(), 0, b->bytes()));
  upload(kr, h.k_rounded);
  upload(vr, h.v_rounded);
  const int64_t num_slots = static_cast<int64_t>(p.num_blocks) * p.block_size;
  for (KvDType kv : {KvDType::kFp8E4M3, KvDType::kActivation}) {
    DeviceBuffer& kc_ = kv == KvDType::kFp8E4M3 ? k8 : kb;
    DeviceBuffer& vc_ = kv == KvDType::kFp8E4M3 ? v8 : vb;
    CUDA_OK(kc::kv_cache_append(kBf16, kc_.get(), vc_.get(), d_k.get(), width, d_v.get(), width, d_old.as<int32_t>(),
                                total, KV, D, num_slots, nullptr, kv));
  }
  CUDA_OK(cudaDeviceSynchronize());

  kc::DecodeArgs args;
  args.q = d_q.get();
  args.block_tables = d_tables.as<int32_t>();
  args.context_lens = d_lens.as<int32_t>();
  args.masks = c.sliding ? d_masks.as<MaskParams>() : nullptr;
  args.num_seqs = num_seqs;
  args.num_heads = H;
  args.num_kv_heads = KV;
  args.head_dim = D;
  args.block_size = p.block_size;
  args.max_blocks_per_seq = p.max_blocks;
  args.max_context_len = *std::max_element(c.lens.begin(), c.lens.end());
  args.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
  // The workspace is sized for valid arguments only (an unset out reads as a call with no plan).
  args.out = d_q.get();
  args.k_cache = k8.get();
  args.v_cache = v8.get();
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t partial_bytes = 0;
  int64_t counters = 0;
  for (KvDType kv : {KvDType::kFp8E4M3, KvDType::kActivation})
    for (int floor : {32, 0}) {
      args.kv_dtype = kv;
      args.min_split_tokens = floor;
      const kc::DecodeWorkspaceNeed need = kc::decode_workspace_need(args, sms);
      EXPECT_EQ(kc::decode_unsupported(kBf16, args), "");
      partial_bytes = std::max(partial_bytes, need.partial_bytes);
      counters = std::max(counters, need.counters);
    }
  DeviceBuffer partials(partial_bytes + 16), counter_buf((static_cast<size_t>(counters) + 4) * sizeof(int));
  CUDA_OK(cudaMemset(counter_buf.get(), 0, counter_buf.bytes()));
  const kc::DecodeWorkspace ws{partials.get(), partials.bytes(), counter_buf.as<int>(), counters + 4};

  std::vector<float> rounded_values = values_of(h.k_rounded), rounded_v = values_of(h.v_rounded);
  const std::vector<float> ref = reference_decode(q.values, rounded_values, rounded_v, p.tables,
                                                  std::vector<int32_t>(c.lens.begin(), c.lens.end()),
                                                  c.sliding ? &masks : nullptr, H, KV, D, p.block_size, p.max_blocks,
                                                  args.softmax_scale);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t out_elems = static_cast<size_t>(num_seqs) * H * D;
  for (int floor : {32, 0}) {
    args.min_split_tokens = floor;
    auto decode = [&](KvDType kv, const DeviceBuffer& kcache, const DeviceBuffer& vcache, bool append_newest) {
      DeviceBuffer out(out_elems * 2 + 16);
      poison(out);
      args.kv_dtype = kv;
      args.k_cache = kcache.get();
      args.v_cache = vcache.get();
      args.out = out.get();
      EXPECT_EQ(kc::decode_unsupported(kBf16, args), "");
      if (append_newest) {
        EXPECT_EQ(kc::kv_cache_append(kBf16, kcache.get(), vcache.get(), d_new_k.get(), width, d_new_v.get(), width,
                                      d_new.as<int32_t>(), num_seqs, KV, D, num_slots, stream, kv),
                  cudaSuccess);
      }
      EXPECT_EQ(kc::decode_attention(kBf16, args, ws, sms, stream), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      return to_floats(download<uint16_t>(out, out_elems), kBf16);
    };
    const std::vector<float> fp8 = decode(KvDType::kFp8E4M3, k8, v8, true);
    const std::vector<float> plain = decode(KvDType::kActivation, kb, vb, true);
    const std::vector<float> rounded = decode(KvDType::kActivation, kr, vr, false);
    double worst_rounded = 0, worst_ref = 0, worst_plain = 0;
    for (int s = 0; s < num_seqs; ++s) {
      const auto slice = [&](const std::vector<float>& x) {
        return std::vector<float>(x.begin() + static_cast<int64_t>(s) * H * D, x.begin() + static_cast<int64_t>(s + 1) * H * D);
      };
      const double e_rounded = normalized_error(slice(fp8), slice(rounded));
      const double e_ref = normalized_error(slice(fp8), slice(ref));
      const double e_plain = normalized_error(slice(fp8), slice(plain));
      const std::string what = "seq " + std::to_string(s) + " ctx " + std::to_string(c.lens[s]) + " D " +
                               std::to_string(D) + " H " + std::to_string(H) + "/" + std::to_string(KV) + " block " +
                               std::to_string(p.block_size) + " floor " + std::to_string(floor) +
                               (c.sliding ? " sliding" : "");
      EXPECT_LE(e_rounded, kRoundedBound) << what;
      EXPECT_LE(e_ref, tolerance(kBf16)) << what;
      EXPECT_LE(e_plain, kPlainBound) << what;
      worst_rounded = std::max(worst_rounded, e_rounded);
      worst_ref = std::max(worst_ref, e_ref);
      worst_plain = std::max(worst_plain, e_plain);
    }
    std::printf("[fp8-kv] decode D %d H %d/%d block %d floor %d%s: rel L2 worst vs rounded-bf16 cache %.3g, vs "
                "reference %.3g, vs plain bf16 cache %.3g\n",
                D, H, KV, p.block_size, floor, c.sliding ? " sliding" : "", worst_rounded, worst_ref, worst_plain);
  }
  CUDA_OK(cudaStreamDestroy(stream));
  // The appends (old rows, then the newest in the chained step) left the host's bytes.
  EXPECT_EQ(download<uint8_t>(k8, cache_elems), h.k8);
  EXPECT_EQ(download<uint8_t>(v8, cache_elems), h.v8);
}

const std::vector<int> kContexts{1, 63, 64, 65, 127, 513, 2049};

TEST(Fp8KvDecode, SmolLm2ShapeHeadDim64) {
  TESSERA_REQUIRE_GPU();
  run_fp8_decode({64, 9, 3, 16, kContexts}, 1);
}
TEST(Fp8KvDecode, HeadDim128Gqa4Block32) {
  TESSERA_REQUIRE_GPU();
  run_fp8_decode({128, 8, 2, 32, kContexts}, 2);
}
TEST(Fp8KvDecode, HeadDim128Gqa4SingleSequences) {
  TESSERA_REQUIRE_GPU();
  for (int len : {1, 65, 513, 4100}) run_fp8_decode({128, 32, 8, 16, {len}}, 3 + len);  // batch 1: many splits
}
TEST(Fp8KvDecode, HeadDim32AndSlidingWindow) {
  TESSERA_REQUIRE_GPU();
  run_fp8_decode({32, 4, 4, 16, kContexts}, 4);
  run_fp8_decode({64, 9, 3, 16, {1, 63, 300, 513, 777}, true}, 5);
}
TEST(Fp8KvDecode, HeadDims80And96) {
  TESSERA_REQUIRE_GPU();
  run_fp8_decode({80, 8, 2, 16, {1, 17, 1000}}, 6);
  run_fp8_decode({96, 12, 4, 32, {1, 17, 1000}, true}, 7);
}

TEST(Fp8KvDecode, RefusesFp8WithoutBf16AndNamesIt) {
  kc::DecodeArgs args;
  args.head_dim = 64;
  args.num_heads = 9;
  args.num_kv_heads = 3;
  args.block_size = 16;
  args.kv_dtype = KvDType::kFp8E4M3;
  EXPECT_NE(kc::decode_unsupported(DType::kFP16, args).find("kv dtype fp8_e4m3 needs bf16 activations"),
            std::string::npos);
  EXPECT_NE(kc::kv_cache_append_unsupported(DType::kFP16, 1, 3, 64, 192, 192, 16, KvDType::kFp8E4M3)
                .find("needs bf16"),
            std::string::npos);
  EXPECT_NE(kc::kv_cache_gather_unsupported(DType::kFP16, 1, 1, 1, 16, 3, 64, 1, KvDType::kFp8E4M3).find("needs bf16"),
            std::string::npos);
  kc::GenericAttentionArgs ga;
  ga.kv_dtype = KvDType::kFp8E4M3;  // contiguous keys are activations, never e4m3
  ga.num_heads = 2;
  ga.num_kv_heads = 1;
  ga.head_dim = 80;
  ga.q_row_stride = ga.out_row_stride = 160;
  ga.k_row_stride = ga.v_row_stride = 80;
  ga.softmax_scale = 1.f;
  EXPECT_NE(kc::generic_attention_unsupported(kBf16, ga).find("paged keys"), std::string::npos);
}

// ---------------------------------------------------------------- paged prefill, generic

// Chunked prefill over the paged cache as the backend runs it: each sequence has `cached` tokens in
// the cache and a chunk of new ones in a fused QKV buffer; the chunk's K/V are appended, the context
// gathered into bf16 rows and the prefill kernel run on the chunk's queries. Totals 1, 64, 65, 65,
// 127, 513 tokens. Then the generic kernel (the backend's path for other head sizes) straight over
// the same paged caches.
void run_fp8_prefill(int D, int H, int KV, int BS, uint32_t seed) {
  std::mt19937 rng(seed);
  const int width = KV * D;
  const std::vector<int> cached{0, 63, 1, 64, 100, 448}, chunk{1, 1, 64, 1, 27, 65};
  const int num_seqs = static_cast<int>(cached.size());
  std::vector<int> lens(num_seqs);
  std::vector<int32_t> cu_q{0};
  int max_q = 0;
  for (int s = 0; s < num_seqs; ++s) {
    lens[s] = cached[s] + chunk[s];
    cu_q.push_back(cu_q.back() + chunk[s]);
    max_q = std::max(max_q, chunk[s]);
  }
  const Paging p = make_paging(lens, BS, rng);
  const int total_q = cu_q.back(), total_k = p.cu.back();
  const Rows rows = random_rows(static_cast<size_t>(total_k), width, rng);
  const HostCaches h = host_caches(rows, p, lens, width);
  const int64_t qkv_stride = static_cast<int64_t>(H + 2 * KV) * D;
  HostTensor qkv = HostTensor::random(kBf16, static_cast<size_t>(total_q) * qkv_stride, rng, -2.f, 2.f);
  // The chunk rows' K/V go into the QKV buffer (the append reads them there); the cached rows are
  // appended beforehand from the row buffer.
  std::vector<int32_t> cached_slots(total_k, -1), chunk_slots(total_q);
  for (int s = 0; s < num_seqs; ++s) {
    for (int pos = 0; pos < cached[s]; ++pos) cached_slots[p.cu[s] + pos] = static_cast<int32_t>(p.slot(s, pos));
    for (int i = 0; i < chunk[s]; ++i) {
      const int pos = cached[s] + i;
      chunk_slots[cu_q[s] + i] = static_cast<int32_t>(p.slot(s, pos));
      for (int c = 0; c < width; ++c) {
        const size_t src = static_cast<size_t>(p.cu[s] + pos) * width + c;
        const size_t dst = static_cast<size_t>(cu_q[s] + i) * qkv_stride;
        qkv.bits[dst + H * D + c] = rows.k.bits[src];
        qkv.bits[dst + (H + KV) * D + c] = rows.v.bits[src];
      }
    }
  }
  qkv.refresh_values();
  const std::vector<MaskParams> masks(num_seqs);  // causal
  DeviceBuffer d_rk, d_rv, d_cached, d_chunk, d_qkv, d_tables, d_cu_k, d_cu_q, d_masks, d_lens;
  upload(d_rk, rows.k.bits);
  upload(d_rv, rows.v.bits);
  upload(d_cached, cached_slots);
  upload(d_chunk, chunk_slots);
  upload(d_qkv, qkv.bits);
  upload(d_tables, p.tables);
  upload(d_cu_k, p.cu);
  upload(d_cu_q, cu_q);
  upload(d_masks, masks);
  upload(d_lens, std::vector<int32_t>(lens.begin(), lens.end()));
  const size_t cache_elems = h.k8.size();
  const int64_t num_slots = static_cast<int64_t>(p.num_blocks) * BS;
  const uint16_t* qkv_dev = d_qkv.as<uint16_t>();

  struct Run {
    std::vector<float> prefill, generic;
  };
  // kv: the cache type; rounded: a bf16 cache uploaded with the host's rounded values (no appends).
  auto run = [&](KvDType kv, bool rounded) {
    const size_t bytes = cache_elems * (kv == KvDType::kFp8E4M3 ? 1 : 2) + 16;
    DeviceBuffer kcache(bytes), vcache(bytes);
    if (rounded) {
      upload(kcache, h.k_rounded);
      upload(vcache, h.v_rounded);
    } else {
      EXPECT_EQ(cudaMemset(kcache.get(), 0, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemset(vcache.get(), 0, bytes), cudaSuccess);
      EXPECT_EQ(kc::kv_cache_append(kBf16, kcache.get(), vcache.get(), d_rk.get(), width, d_rv.get(), width,
                                    d_cached.as<int32_t>(), total_k, KV, D, num_slots, nullptr, kv),
                cudaSuccess);
      EXPECT_EQ(kc::kv_cache_append(kBf16, kcache.get(), vcache.get(), qkv_dev + H * D, qkv_stride,
                                    qkv_dev + (H + KV) * D, qkv_stride, d_chunk.as<int32_t>(), total_q, KV, D,
                                    num_slots, nullptr, kv),
                cudaSuccess);
    }
    DeviceBuffer gk(static_cast<size_t>(total_k) * width * 2 + 16), gv(gk.bytes()),
        out(static_cast<size_t>(total_q) * H * D * 2 + 16), gout(out.bytes());
    poison(out);
    poison(gout);
    EXPECT_EQ(kc::kv_cache_gather(kBf16, gk.get(), gv.get(), kcache.get(), vcache.get(), d_tables.as<int32_t>(),
                                  p.max_blocks, d_cu_k.as<int32_t>(), num_seqs, total_k, BS, KV, D, p.num_blocks,
                                  nullptr, kv),
              cudaSuccess);
    kc::PrefillArgs args;
    args.out = out.get();
    args.q = qkv_dev;
    args.k = gk.get();
    args.v = gv.get();
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
    EXPECT_EQ(kc::prefill_unsupported(kBf16, args), "");
    EXPECT_EQ(kc::prefill_attention(kBf16, args, nullptr), cudaSuccess);
    kc::GenericAttentionArgs ga;
    ga.out = gout.get();
    ga.q = qkv_dev;
    ga.k = kcache.get();
    ga.v = vcache.get();
    ga.block_tables = d_tables.as<int32_t>();
    ga.max_blocks_per_seq = p.max_blocks;
    ga.block_size = BS;
    ga.kv_lens = d_lens.as<int32_t>();
    ga.cu_seqlens_q = d_cu_q.as<int32_t>();
    ga.masks = d_masks.as<MaskParams>();
    ga.num_seqs = num_seqs;
    ga.total_q = total_q;
    ga.num_heads = H;
    ga.num_kv_heads = KV;
    ga.head_dim = D;
    ga.q_row_stride = qkv_stride;
    ga.out_row_stride = H * D;
    ga.softmax_scale = args.softmax_scale;
    ga.kv_dtype = kv;
    EXPECT_EQ(kc::generic_attention_unsupported(kBf16, ga), "");
    EXPECT_EQ(kc::generic_attention(kBf16, ga, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (kv == KvDType::kFp8E4M3 && !rounded) {
      EXPECT_EQ(download<uint8_t>(kcache, cache_elems), h.k8);
      EXPECT_EQ(download<uint8_t>(vcache, cache_elems), h.v8);
    }
    const size_t n = static_cast<size_t>(total_q) * H * D;
    return Run{to_floats(download<uint16_t>(out, n), kBf16), to_floats(download<uint16_t>(gout, n), kBf16)};
  };
  const Run fp8 = run(KvDType::kFp8E4M3, false), rounded = run(KvDType::kActivation, true),
            plain = run(KvDType::kActivation, false);
  // The reference on the rounded values, gathered contiguously.
  std::vector<float> k(static_cast<size_t>(total_k) * width), v(k.size());
  const std::vector<float> kr = values_of(h.k_rounded), vr = values_of(h.v_rounded);
  for (int s = 0; s < num_seqs; ++s)
    for (int pos = 0; pos < lens[s]; ++pos) {
      const size_t src = static_cast<size_t>(p.slot(s, pos)) * width;
      std::copy_n(kr.begin() + static_cast<int64_t>(src), width, k.begin() + static_cast<int64_t>(p.cu[s] + pos) * width);
      std::copy_n(vr.begin() + static_cast<int64_t>(src), width, v.begin() + static_cast<int64_t>(p.cu[s] + pos) * width);
    }
  const std::vector<float> ref = reference_prefill(qkv.values, qkv_stride, k, width, v, width, cu_q, p.cu, masks, H,
                                                   KV, D, 1.f / std::sqrt(static_cast<float>(D)));
  const std::string what = "D " + std::to_string(D) + " H " + std::to_string(H) + "/" + std::to_string(KV) +
                           " block " + std::to_string(BS);
  const double e[6] = {normalized_error(fp8.prefill, rounded.prefill), normalized_error(fp8.prefill, ref),
                       normalized_error(fp8.prefill, plain.prefill),   normalized_error(fp8.generic, rounded.generic),
                       normalized_error(fp8.generic, ref),             normalized_error(fp8.generic, plain.generic)};
  EXPECT_LE(e[0], kRoundedBound) << "prefill " << what;
  EXPECT_LE(e[1], tolerance(kBf16)) << "prefill " << what;
  EXPECT_LE(e[2], kPlainBound) << "prefill " << what;
  EXPECT_LE(e[3], kRoundedBound) << "generic " << what;
  EXPECT_LE(e[4], tolerance(kBf16)) << "generic " << what;
  EXPECT_LE(e[5], kPlainBound) << "generic " << what;
  std::printf("[fp8-kv] paged prefill %s: rel L2 vs rounded-bf16 cache %.3g, vs reference %.3g, vs plain %.3g; "
              "generic: %.3g, %.3g, %.3g\n",
              what.c_str(), e[0], e[1], e[2], e[3], e[4], e[5]);
}

TEST(Fp8KvPrefill, ChunkedOverThePagedCache) {
  TESSERA_REQUIRE_GPU();
  run_fp8_prefill(64, 9, 3, 16, 11);
  run_fp8_prefill(128, 8, 2, 32, 12);
  run_fp8_prefill(128, 16, 16, 16, 13);
}

}  // namespace
}  // namespace tessera::gpu_test
