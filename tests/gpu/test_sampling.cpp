// tests/gpu/test_sampling.cpp: GPU sampling (kernels/cuda/sampling) against the CPU Sampler's own
// transforms (engine/sampler): greedy ids, penalties, the top-k / top-p / min-p kept sets, the draw for
// a given uniform, and raw logprobs, on fp32 / bf16 / fp16 logits with awkward vocabulary sizes and
// many rows of mixed settings in one launch.
//
// Where results may differ, and by how much (both justified by the GPU's arithmetic, see sampling.h):
//  - top-p: the GPU's masses are fp32 exps (<= 2 ulp, the difference compensated) summed exactly, the
//    CPU's fp64 exps summed in fp64; any prefix mass agrees to ~3e-7 of the total. A kept set may then
//    differ from the CPU's only by tokens whose cumulative mass is within kMassTol of the target.
//  - the draw: the weights are fp32 exps on both sides, but CUDA's expf and the host's may differ by
//    an ulp or two; the GPU token may differ only where u * total is within kMassTol of a cumulative
//    weight between the two tokens.
// Everything else (greedy ids, penalized and tempered values, top-k, min-p, top-n ids) is exact.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/sampler/sampler.h"
#include "gpu_test_util.h"
#include "kernels/cuda/sampling/sampling.h"

namespace tessera::gpu_test {
namespace {

using kernels::cuda::LogitsType;
using kernels::cuda::SampledRow;
using kernels::cuda::SamplingRowParams;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kMassTol = 1e-6;      // of the total mass
constexpr double kLogprobTol = 1e-4;

struct RowCase {
  SamplingRowParams p;
  std::vector<int32_t> prompt;     // feed the repetition penalty
  std::vector<int32_t> generated;  // feed all the penalties
};

struct Batch {
  LogitsType type = LogitsType::kBF16;
  int vocab = 0;
  int64_t stride = 0;
  std::vector<float> values;     // [rows, stride]: what the kernel sees, as fp32
  std::vector<uint16_t> bits;    // bf16 / fp16 storage
  std::vector<RowCase> rows;
};

struct GpuResult {
  std::vector<SampledRow> out;
  std::vector<float> filtered;  // [rows, vocab]
};

float round_logit(float v, LogitsType type) {
  if (type == LogitsType::kBF16) return round_to(v, DType::kBF16);
  if (type == LogitsType::kFP16) return round_to(v, DType::kFP16);
  return v;
}

// Logits of the row's kind: 0 normal (sigma 2), 1 coarse (multiples of 0.25: long runs of ties),
// 2 normal with a few -inf, 3 peaked (one token far ahead).
void fill_logits(Batch& b, int row, int kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 2.f);
  float* x = b.values.data() + static_cast<int64_t>(row) * b.stride;
  for (int i = 0; i < b.vocab; ++i) {
    float v = normal(rng);
    if (kind == 1) v = std::round(v * 4.f) / 4.f;
    x[i] = v;
  }
  if (kind == 2) {
    std::uniform_int_distribution<int> id(0, b.vocab - 1);
    for (int j = 0; j < 5; ++j) x[id(rng)] = -kInf;
  }
  if (kind == 3) x[std::uniform_int_distribution<int>(0, b.vocab - 1)(rng)] = 12.f;
  for (int i = 0; i < b.vocab; ++i) x[i] = round_logit(x[i], b.type);
}

void encode(Batch& b) {
  if (b.type == LogitsType::kF32) return;
  const DType d = b.type == LogitsType::kBF16 ? DType::kBF16 : DType::kFP16;
  b.bits.resize(b.values.size());
  for (size_t i = 0; i < b.values.size(); ++i) b.bits[i] = to_bits(b.values[i], d);
}

// Settings for row r: a cycle through the features, alone and combined.
RowCase make_case(int r, int vocab, std::mt19937& rng) {
  RowCase c;
  SamplingRowParams& p = c.p;
  std::uniform_real_distribution<float> unif(0.f, 1.f);
  p.uniform = unif(rng);
  switch (r % 16) {
    case 0: p.temperature = 0.f; break;                                                  // fast path
    case 1: p.temperature = 0.f; p.num_top_logprobs = 5; break;
    case 2: p.temperature = 0.f; p.repetition_penalty = 1.3f; p.frequency_penalty = 0.5f; break;
    case 3: p.temperature = 1.f; break;
    case 4: p.temperature = 0.7f; p.top_k = 50; break;
    case 5: p.temperature = 1.3f; p.top_p = 0.9f; break;
    case 6: p.temperature = 0.8f; p.top_k = 200; p.top_p = 0.5f; p.num_top_logprobs = 20; break;
    case 7: p.temperature = 1.f; p.min_p = 0.05f; break;
    case 8: p.temperature = 0.6f; p.top_k = 1; break;
    case 9: p.temperature = 1.f; p.top_k = vocab; p.top_p = 0.99f; p.min_p = 0.2f; break;
    case 10: p.temperature = 0.9f; p.repetition_penalty = 0.8f; p.presence_penalty = -1.5f; p.top_p = 0.7f; break;
    case 11: p.temperature = 1.f; p.presence_penalty = 2.f; p.frequency_penalty = -0.7f; p.num_top_logprobs = 0; break;
    case 12: p.temperature = 0.5f; p.top_k = 7; p.min_p = 0.3f; p.num_top_logprobs = 1; break;
    case 13: p.temperature = 2.f; p.top_p = 0.3f; p.repetition_penalty = 2.f; break;
    case 14: p.temperature = 1.f; p.top_p = 0.95f; p.top_k = 1000; p.uniform = std::nextafter(1.f, 0.f); break;
    default: p.temperature = 0.f; p.presence_penalty = 1.f; p.num_top_logprobs = 3; break;
  }
  const bool penalties = p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
  if (penalties) {
    std::uniform_int_distribution<int> id(0, vocab - 1);
    const int prompt = 1 + r * 7 % 300, generated = r % 40;
    for (int i = 0; i < prompt; ++i) c.prompt.push_back(id(rng));
    // Generated tokens repeat (counts > 1), and favour high logits so the penalties matter.
    for (int i = 0; i < generated; ++i) c.generated.push_back(id(rng) % std::max(1, vocab / 8));
  }
  return c;
}

Batch make_batch(LogitsType type, int vocab, int rows, int pad, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.type = type;
  b.vocab = vocab;
  b.stride = vocab + pad;
  b.values.assign(static_cast<size_t>(rows) * b.stride, 0.f);
  for (int r = 0; r < rows; ++r) {
    fill_logits(b, r, (r / 16) % 4, rng);
    b.rows.push_back(make_case(r, vocab, rng));
  }
  encode(b);
  return b;
}

SamplingParams cpu_params(const SamplingRowParams& p) {
  SamplingParams s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.repetition_penalty = p.repetition_penalty;
  s.presence_penalty = p.presence_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.seed = 1;
  return s;
}

// Runs the batch; the penalty lists are what the engine would build: every token seen (prompt or
// generated) once, with the times it was generated.
void run_gpu(Batch& b, bool with_filtered, GpuResult& res) {
  const int rows = static_cast<int>(b.rows.size());
  std::vector<SamplingRowParams> params;
  std::vector<int32_t> tokens, counts;
  for (RowCase& c : b.rows) {
    SamplingRowParams p = c.p;
    p.penalty_begin = static_cast<int32_t>(tokens.size());
    std::vector<int32_t> count(static_cast<size_t>(b.vocab), -1);
    for (int32_t t : c.prompt) count[static_cast<size_t>(t)] = std::max(count[static_cast<size_t>(t)], 0);
    for (int32_t t : c.generated) count[static_cast<size_t>(t)] = std::max(count[static_cast<size_t>(t)], 0) + 1;
    for (int t = 0; t < b.vocab; ++t) {
      if (count[static_cast<size_t>(t)] < 0) continue;
      tokens.push_back(t);
      counts.push_back(count[static_cast<size_t>(t)]);
    }
    p.penalty_end = static_cast<int32_t>(tokens.size());
    params.push_back(p);
  }
  tokens.push_back(0);  // never empty uploads
  counts.push_back(0);
  DeviceBuffer d_logits, d_params, d_tokens, d_counts, d_out, d_filtered;
  if (b.type == LogitsType::kF32) {
    upload(d_logits, b.values);
  } else {
    upload(d_logits, b.bits);
  }
  upload(d_params, params);
  upload(d_tokens, tokens);
  upload(d_counts, counts);
  const size_t ws_bytes = kernels::cuda::sampling_workspace_bytes(rows, b.vocab);
  DeviceBuffer d_ws(ws_bytes);
  d_out.allocate(sizeof(SampledRow) * static_cast<size_t>(rows));
  poison(d_out);
  if (with_filtered) {
    d_filtered.allocate(sizeof(float) * static_cast<size_t>(rows) * b.vocab);
    poison(d_filtered);
  }
  cudaError_t err;
  if (with_filtered) {
    err = kernels::cuda::sample_rows_with_filtered(b.type, d_logits.get(), b.stride, rows, b.vocab,
                                                   d_params.as<SamplingRowParams>(), d_tokens.as<int32_t>(),
                                                   d_counts.as<int32_t>(), d_ws.get(), ws_bytes,
                                                   d_out.as<SampledRow>(), d_filtered.as<float>(), nullptr);
  } else {
    err = kernels::cuda::sample_rows(b.type, d_logits.get(), b.stride, rows, b.vocab,
                                     d_params.as<SamplingRowParams>(), d_tokens.as<int32_t>(),
                                     d_counts.as<int32_t>(), d_ws.get(), ws_bytes, d_out.as<SampledRow>(), nullptr);
  }
  CUDA_OK(err);
  CUDA_OK(cudaDeviceSynchronize());
  res.out = download<SampledRow>(d_out, static_cast<size_t>(rows));
  if (with_filtered) res.filtered = download<float>(d_filtered, static_cast<size_t>(rows) * b.vocab);
}

// The CPU draw over filtered logits, as Sampler::sample does it for a given u; also the cumulative
// weights (0 for masked tokens) and total, to judge a boundary case.
int cpu_draw(const std::vector<float>& f, float u, std::vector<double>& cum, double& total) {
  const float m = *std::max_element(f.begin(), f.end());
  cum.assign(f.size(), 0.0);
  total = 0.0;
  for (size_t i = 0; i < f.size(); ++i) {
    total += std::exp(f[i] - m);
    cum[i] = total;
  }
  const double target = double(u) * total;
  int last = -1;
  for (size_t i = 0; i < f.size(); ++i) {
    if (std::exp(f[i] - m) == 0.0f) continue;
    last = int(i);
    if (cum[i] > target) return int(i);
  }
  return last;
}

// The CPU's top-p run over post-top-k logits t: candidates most likely first (lower id on ties) and
// their cumulative fp64 masses, the target, and the CPU's kept length.
struct TopPRun {
  std::vector<int32_t> order;
  std::vector<double> cum;
  double target = 0, total = 0;
  size_t keep = 0;
};
TopPRun top_p_run(const std::vector<float>& t, float top_p) {
  TopPRun run;
  const float m = *std::max_element(t.begin(), t.end());
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] != -kInf) run.order.push_back(int32_t(i));
  std::sort(run.order.begin(), run.order.end(), [&](int32_t a, int32_t b) { return t[a] != t[b] ? t[a] > t[b] : a < b; });
  for (int32_t id : run.order) {
    run.total += std::exp(double(t[size_t(id)]) - m);
    run.cum.push_back(run.total);
  }
  run.target = double(top_p) * run.total;
  run.keep = run.order.size();
  for (size_t j = 0; j < run.cum.size(); ++j) {
    if (run.cum[j] >= run.target) {
      run.keep = j + 1;
      break;
    }
  }
  return run;
}

// Compares one launch against the CPU Sampler, row by row.
void check_batch(Batch& b, const GpuResult& res, bool with_filtered) {
  const int V = b.vocab;
  for (size_t r = 0; r < b.rows.size(); ++r) {
    const RowCase& c = b.rows[r];
    const SamplingRowParams& p = c.p;
    const SampledRow& o = res.out[r];
    const std::string where = "row " + std::to_string(r) + " vocab " + std::to_string(V) + " type " +
                              std::to_string(int(b.type));
    std::vector<float> raw(b.values.begin() + int64_t(r) * b.stride, b.values.begin() + int64_t(r) * b.stride + V);
    Sampler sampler(cpu_params(p), c.prompt, V);
    for (int32_t t : c.generated) sampler.record_generated(t);
    std::vector<float> cpu = raw;
    sampler.apply_penalties(cpu);
    const float* gf = with_filtered ? res.filtered.data() + r * size_t(V) : nullptr;

    if (p.temperature == 0.f) {
      EXPECT_EQ(o.token, Sampler::argmax(cpu)) << where;
      if (gf) {
        for (int i = 0; i < V; ++i) ASSERT_EQ(gf[i], cpu[size_t(i)]) << where << " id " << i;
      }
    } else {
      Sampler::apply_temperature(cpu, p.temperature);
      Sampler::apply_top_k(cpu, p.top_k);
      const std::vector<float> after_k = cpu;
      Sampler::apply_top_p(cpu, p.top_p);
      Sampler::apply_min_p(cpu, p.min_p);
      std::vector<float> gpu_f;
      if (gf) {
        gpu_f.assign(gf, gf + V);
        // Same kept set (or a top-p length that differs only across boundary-close masses), same values.
        bool same = gpu_f == cpu;
        if (!same && p.top_p < 1.f) {
          const TopPRun run = top_p_run(after_k, p.top_p);
          for (size_t len = run.keep > 3 ? run.keep - 3 : 1; len <= std::min(run.order.size(), run.keep + 3) && !same;
               ++len) {
            bool close = true;
            for (size_t j = std::min(len, run.keep); j < std::max(len, run.keep); ++j)
              close = close && std::abs(run.cum[j - 1] - run.target) <= kMassTol * run.total;
            if (!close) continue;
            std::vector<float> alt(size_t(V), -kInf);
            for (size_t j = 0; j < len; ++j) alt[size_t(run.order[j])] = after_k[size_t(run.order[j])];
            Sampler::apply_min_p(alt, p.min_p);
            same = alt == gpu_f;
          }
        }
        EXPECT_TRUE(same) << where << ": kept set or values differ from the CPU's";
      } else {
        gpu_f = cpu;
      }
      // The draw over the GPU's own kept set.
      std::vector<double> cum;
      double total = 0;
      const int want = cpu_draw(gpu_f, p.uniform, cum, total);
      if (o.token != want) {
        const double target = double(p.uniform) * total;
        bool close = o.token >= 0 && o.token < V && gpu_f[size_t(o.token)] != -kInf;
        for (int j = std::min(o.token, want); close && j < std::max(o.token, want); ++j)
          close = std::abs(cum[size_t(j)] - target) <= kMassTol * total || cum[size_t(j)] == (j ? cum[size_t(j - 1)] : 0);
        EXPECT_TRUE(close) << where << ": drew " << o.token << ", CPU draws " << want << " (u " << p.uniform << ")";
      }
    }

    if (p.num_top_logprobs < 0) {
      EXPECT_TRUE(std::isnan(o.logprob)) << where;
      for (int j = 0; j < kernels::cuda::kMaxTopLogprobs; ++j) EXPECT_EQ(o.top_ids[j], -1) << where;
    } else {
      double mx = -kInf, sum = 0;
      for (float x : raw) mx = std::max(mx, double(x));
      for (float x : raw) sum += std::exp(double(x) - mx);
      const double lse = mx + std::log(sum);
      ASSERT_TRUE(o.token >= 0 && o.token < V) << where;
      EXPECT_NEAR(o.logprob, double(raw[size_t(o.token)]) - lse, kLogprobTol) << where;
      const auto ref = Sampler::top_logprobs(raw, p.num_top_logprobs);
      for (size_t j = 0; j < ref.size(); ++j) {
        EXPECT_EQ(o.top_ids[j], ref[j].token) << where << " rank " << j;
        EXPECT_NEAR(o.top_logprobs[j], ref[j].logprob, kLogprobTol) << where << " rank " << j;
      }
      for (size_t j = ref.size(); j < size_t(kernels::cuda::kMaxTopLogprobs); ++j) EXPECT_EQ(o.top_ids[j], -1) << where;
    }
  }
}

void run_and_check(LogitsType type, int vocab, int rows, int pad, uint32_t seed) {
  Batch b = make_batch(type, vocab, rows, pad, seed);
  GpuResult with, without;
  run_gpu(b, true, with);
  check_batch(b, with, true);
  // The plain entry point draws the same tokens.
  run_gpu(b, false, without);
  for (int r = 0; r < rows; ++r) EXPECT_EQ(without.out[size_t(r)].token, with.out[size_t(r)].token) << "row " << r;
}

TEST(Sampling, MatchesCpuSamplerBf16) {
  TESSERA_REQUIRE_GPU();
  for (int vocab : {1000, 32000, 49152, 151936}) run_and_check(LogitsType::kBF16, vocab, 67, 8, uint32_t(vocab));
}

TEST(Sampling, MatchesCpuSamplerF32) {
  TESSERA_REQUIRE_GPU();
  for (int vocab : {1000, 32000, 49152, 151936}) run_and_check(LogitsType::kF32, vocab, 67, 0, uint32_t(vocab + 1));
}

TEST(Sampling, MatchesCpuSamplerFp16UnalignedRows) {
  TESSERA_REQUIRE_GPU();
  // Odd strides: rows are not 16-byte aligned, so the fast path's scalar loads run.
  for (int vocab : {1000, 32003}) run_and_check(LogitsType::kFP16, vocab, 35, 3, uint32_t(vocab + 2));
  run_and_check(LogitsType::kBF16, 4099, 1, 1, 7u);
}

TEST(Sampling, GreedyFastPathManyRows) {
  TESSERA_REQUIRE_GPU();
  for (LogitsType type : {LogitsType::kBF16, LogitsType::kF32}) {
    for (int vocab : {1, 7, 1000, 151936}) {
      Batch b = make_batch(type, vocab, 67, 0, 11u);
      for (RowCase& c : b.rows) c = RowCase{};
      for (RowCase& c : b.rows) c.p.temperature = 0.f;
      GpuResult res;
      run_gpu(b, false, res);
      for (int r = 0; r < 67; ++r) {
        const std::vector<float> row(b.values.begin() + int64_t(r) * b.stride,
                                     b.values.begin() + int64_t(r) * b.stride + vocab);
        EXPECT_EQ(res.out[size_t(r)].token, Sampler::argmax(row)) << "row " << r << " vocab " << vocab;
        EXPECT_TRUE(std::isnan(res.out[size_t(r)].logprob));
      }
    }
  }
}

// Runs of equal values everywhere: greedy takes the lowest id, top-p cuts inside a run lower ids
// first, top-n takes lower ids first.
TEST(Sampling, TiesGoToLowerIds) {
  TESSERA_REQUIRE_GPU();
  for (LogitsType type : {LogitsType::kBF16, LogitsType::kF32}) {
    Batch b;
    b.type = type;
    b.vocab = 5000;
    b.stride = 5000;
    const int rows = 6;
    b.values.assign(size_t(rows) * b.stride, 0.f);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < b.vocab; ++i) b.values[size_t(r) * b.stride + i] = r < 3 ? 0.f : float(i % 3);
    encode(b);
    b.rows.resize(rows);
    b.rows[0].p.temperature = 0.f;
    b.rows[0].p.num_top_logprobs = 20;
    b.rows[1].p.top_p = 0.3f;
    b.rows[1].p.uniform = 0.999f;
    b.rows[2].p.top_k = 10;
    b.rows[2].p.top_p = 0.5f;
    b.rows[3].p.top_p = 0.2f;
    b.rows[3].p.num_top_logprobs = 7;
    b.rows[4].p.min_p = 0.5f;
    b.rows[4].p.uniform = 0.5f;
    b.rows[5].p.temperature = 0.f;
    b.rows[5].p.repetition_penalty = 3.f;
    b.rows[5].prompt = {2, 5};
    GpuResult res;
    run_gpu(b, true, res);
    check_batch(b, res, true);
    EXPECT_EQ(res.out[0].token, 0);
    for (int j = 0; j < 20; ++j) EXPECT_EQ(res.out[0].top_ids[j], j);
    EXPECT_EQ(res.out[5].token, 8);  // 2 and 5 are penalized; 8 is the next 2.0
  }
}

TEST(Sampling, IsDeterministic) {
  TESSERA_REQUIRE_GPU();
  Batch b = make_batch(LogitsType::kBF16, 151936, 48, 0, 3u);
  GpuResult first, second;
  run_gpu(b, true, first);
  run_gpu(b, true, second);
  ASSERT_EQ(first.out.size(), second.out.size());
  EXPECT_EQ(std::memcmp(first.out.data(), second.out.data(), first.out.size() * sizeof(SampledRow)), 0);
  EXPECT_EQ(std::memcmp(first.filtered.data(), second.filtered.data(), first.filtered.size() * sizeof(float)), 0);
}

TEST(Sampling, ReportsUnsupportedValuesByName) {
  TESSERA_REQUIRE_GPU();
  using kernels::cuda::sampling_unsupported;
  using kernels::cuda::sampling_workspace_bytes;
  EXPECT_EQ(sampling_unsupported(4, 1000, 1000, sampling_workspace_bytes(4, 1000)), "");
  EXPECT_NE(sampling_unsupported(-1, 1000, 1000, 0).find("rows"), std::string::npos);
  EXPECT_NE(sampling_unsupported(1, 0, 0, 0).find("vocab"), std::string::npos);
  EXPECT_NE(sampling_unsupported(1, (1 << 18) + 1, 1 << 19, 1ull << 32).find("vocab"), std::string::npos);
  EXPECT_NE(sampling_unsupported(1, 1000, 999, 1 << 20).find("row_stride"), std::string::npos);
  EXPECT_NE(sampling_unsupported(2, 1000, 1000, 100).find("workspace_bytes"), std::string::npos);
}

}  // namespace
}  // namespace tessera::gpu_test
