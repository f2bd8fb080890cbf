// bench/tessera_bench.cu: tessera-bench, the GPU kernel benchmark. Prints one JSON line per case:
//   {impl, case, shape, median_ms, p10_ms, p90_ms, tflops|gbps, device, commit}
// CUDA events, warm-up, >= 20 timed samples; each sample times enough back-to-back launches to
// span ~1 ms and reports the time per launch. The peers run from attention_peers.py in the same call.
//
//   tessera-bench [--only SUBSTRING] [--samples N]      (commit from $TESSERA_COMMIT)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_mask.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/prefill_hopper.h"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/quantized_weights.h"
#include "kernels/cuda/norm/norm.h"

namespace {

using tessera::kernels::MaskKind;
using tessera::kernels::MaskParams;
namespace kc = tessera::kernels::cuda;

#define BENCH_CHECK(expr)                                                                        \
  do {                                                                                           \
    const cudaError_t err_ = (expr);                                                             \
    if (err_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #expr, __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// Uniform values in [-1, 1) from a hash of the index: random-looking data, never zeros.
__global__ void fill_random_kernel(__nv_bfloat16* data, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed + static_cast<uint32_t>(i >> 32) * 97u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    data[i] = __float2bfloat16(static_cast<float>(h & 0xFFFFFF) / 8388608.f - 1.f);
  }
}

struct DeviceMem {
  void* ptr = nullptr;
  explicit DeviceMem(size_t bytes) { BENCH_CHECK(cudaMalloc(&ptr, bytes > 0 ? bytes : 16)); }
  ~DeviceMem() { cudaFree(ptr); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

void fill_random(void* p, size_t elems, uint32_t seed) {
  fill_random_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), elems, seed);
  BENCH_CHECK(cudaGetLastError());
}

struct Timing {
  double median_ms, p10_ms, p90_ms;
};

std::string g_device, g_commit, g_only;
int g_samples = 30;
// Stream the timed launches go to: the legacy default stream unless TESSERA_BENCH_STREAM=1 (a created
// non-blocking stream, as an engine would use; decode only).
cudaStream_t g_stream = nullptr;

Timing time_launches(const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) launch();  // warm-up: module load, attributes, caches
  BENCH_CHECK(cudaEventRecord(start, g_stream));
  launch();
  BENCH_CHECK(cudaEventRecord(stop, g_stream));
  BENCH_CHECK(cudaEventSynchronize(stop));
  float one_ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&one_ms, start, stop));
  const int reps = std::clamp(static_cast<int>(1.0 / std::max(one_ms, 1e-4f)), 1, 1000);
  for (int i = 0; i < reps; ++i) launch();
  std::vector<double> samples;
  for (int s = 0; s < g_samples; ++s) {
    BENCH_CHECK(cudaEventRecord(start, g_stream));
    for (int i = 0; i < reps; ++i) launch();
    BENCH_CHECK(cudaEventRecord(stop, g_stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms / reps);
  }
  BENCH_CHECK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(samples.begin(), samples.end());
  auto pct = [&](double p) { return samples[static_cast<size_t>(p * (samples.size() - 1) + 0.5)]; };
  return {pct(0.5), pct(0.1), pct(0.9)};
}

// The same per launch, for kPerGraph launches captured into one CUDA graph and replayed: how a
// decoder step would run them, without the host's per-launch cost. `launch` must use g_stream.
Timing time_graph(const std::function<void()>& launch) {
  constexpr int kPerGraph = 100;
  cudaStream_t saved = g_stream, stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  g_stream = stream;
  for (int i = 0; i < 3; ++i) launch();  // module load and attributes outside the capture
  BENCH_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kPerGraph; ++i) launch();
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  Timing t = time_launches([&] { BENCH_CHECK(cudaGraphLaunch(exec, stream)); });
  BENCH_CHECK(cudaGraphExecDestroy(exec));
  BENCH_CHECK(cudaGraphDestroy(graph));
  BENCH_CHECK(cudaStreamDestroy(stream));
  g_stream = saved;
  return {t.median_ms / kPerGraph, t.p10_ms / kPerGraph, t.p90_ms / kPerGraph};
}

void emit(const std::string& impl, const std::string& name, const std::string& shape, const Timing& t,
          const char* rate_key, double rate) {
  std::printf(
      "{\"impl\": \"%s\", \"case\": \"%s\", \"shape\": \"%s\", \"median_ms\": %.5f, \"p10_ms\": %.5f, \"p90_ms\": "
      "%.5f, \"%s\": %.2f, \"device\": \"%s\", \"commit\": \"%s\"}\n",
      impl.c_str(), name.c_str(), shape.c_str(), t.median_ms, t.p10_ms, t.p90_ms, rate_key, rate, g_device.c_str(),
      g_commit.c_str());
  std::fflush(stdout);
}

bool selected(const std::string& name) { return g_only.empty() || name.find(g_only) != std::string::npos; }

// ---------------------------------------------------------------- prefill attention
struct PrefillCase {
  std::string name;
  int batch, seqlen, heads, head_dim;
  MaskKind kind;
  int window = 0;
  int documents = 0;  // kSegments: equal-length causal documents, no prefix, no tail
  kc::DType dtype = kc::DType::kBF16;
};

// Visible (q, k) pairs of one sequence, from the policy itself: the FLOPs a dense-equivalent kernel
// would need on exactly the unmasked entries (causal counts half the square, as FlashAttention does).
double visible_pairs(const MaskParams& mask, int seqlen) {
  double pairs = 0;
  for (int q = 0; q < seqlen; ++q) {
    const int lo = mask.lowest_key(q), lead = std::min(mask.leading_keys(), lo);
    const int hi = mask.kind == MaskKind::kBidirectional ? seqlen - 1 : q;  // the last key q sees
    pairs += (hi - lo + 1) + lead;
  }
  return pairs;
}

// Runs the dispatch's own choice as the backend calls it, with tile counters, as "tessera"; where
// that is the Hopper kernel, the same kernel with one CTA per tile runs too, as
// "tessera-cta-per-tile", and the portable mma.sync kernel as "tessera-mma".
void bench_prefill(const PrefillCase& c) {
  const int B = c.batch, S = c.seqlen, H = c.heads, D = c.head_dim;
  const size_t elems = static_cast<size_t>(B) * S * H * D;
  DeviceMem q(elems * 2), k(elems * 2), v(elems * 2), out(elems * 2);
  fill_random(q.ptr, elems, 1);
  fill_random(k.ptr, elems, 2);
  fill_random(v.ptr, elems, 3);
  std::vector<int32_t> cu(B + 1);
  for (int b = 0; b <= B; ++b) cu[b] = b * S;
  std::vector<int32_t> ends;
  for (int d = 1; d <= c.documents; ++d) ends.push_back(S * d / c.documents);
  DeviceMem d_cu(cu.size() * 4), d_ends(std::max<size_t>(ends.size(), 1) * 4), d_masks(B * sizeof(MaskParams));
  BENCH_CHECK(cudaMemcpy(d_cu.ptr, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  if (!ends.empty()) BENCH_CHECK(cudaMemcpy(d_ends.ptr, ends.data(), ends.size() * 4, cudaMemcpyHostToDevice));
  MaskParams mask;
  mask.kind = c.kind;
  mask.window = c.window;
  mask.num_segments = static_cast<int32_t>(ends.size());
  MaskParams host_mask = mask;
  host_mask.segment_ends = ends.empty() ? nullptr : ends.data();
  mask.segment_ends = ends.empty() ? nullptr : d_ends.as<int32_t>();
  std::vector<MaskParams> masks(B, mask);
  BENCH_CHECK(cudaMemcpy(d_masks.ptr, masks.data(), masks.size() * sizeof(MaskParams), cudaMemcpyHostToDevice));

  kc::PrefillArgs a;
  a.out = out.ptr;
  a.q = q.ptr;
  a.k = k.ptr;
  a.v = v.ptr;
  a.cu_seqlens_q = a.cu_seqlens_k = d_cu.as<int32_t>();
  a.masks = d_masks.as<MaskParams>();
  a.num_seqs = B;
  a.max_seqlen_q = S;
  a.total_q = a.total_k = B * S;
  a.num_heads = a.num_kv_heads = H;
  a.head_dim = D;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = a.out_row_stride = static_cast<int64_t>(H) * D;
  a.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
  const double flops = 4.0 * D * H * B * visible_pairs(host_mask, S);
  char shape[128];
  std::snprintf(shape, sizeof(shape), "B%d H%d S%d D%d", B, H, S, D);
  DeviceMem counters(2 * sizeof(int));
  BENCH_CHECK(cudaMemset(counters.ptr, 0, 2 * sizeof(int)));
  struct Variant {
    kc::PrefillKernel kernel;
    std::string impl;
    int* tile_counters;
  };
  std::vector<Variant> variants = {{kc::PrefillKernel::kAuto, "tessera", counters.as<int>()}};
  if (kc::hopper_prefill_supported(c.dtype, a)) {
    variants.push_back({kc::PrefillKernel::kHopper, "tessera-cta-per-tile", nullptr});
    variants.push_back({kc::PrefillKernel::kMmaSync, "tessera-mma", nullptr});
  }
  for (const Variant& variant : variants) {
    const std::string why = kc::prefill_unsupported(c.dtype, a, variant.kernel);
    if (!why.empty()) {
      std::fprintf(stderr, "skip %s/%s: %s\n", variant.impl.c_str(), c.name.c_str(), why.c_str());
      continue;
    }
    a.tile_counters = variant.tile_counters;
    const Timing t = time_launches([&] { BENCH_CHECK(kc::prefill_attention(c.dtype, a, nullptr, variant.kernel)); });
    emit(variant.impl, c.name, shape, t, "tflops", flops / (t.median_ms * 1e-3) / 1e12);
  }
}

// ---------------------------------------------------------------- decode attention
// Head dim 128: Llama-2-7B's 32 heads on 8 KV heads; head dim 256: Gemma-2-9B's 16 on 8.
void bench_decode(int batch, int context, int head_dim) {
  const int H = head_dim == 256 ? 16 : 32, KV = 8, D = head_dim, BS = 16;
  char name[64], shape[128];
  if (head_dim == 128) {
    std::snprintf(name, sizeof(name), "decode_b%d_ctx%dk", batch, context / 1024);
  } else {
    std::snprintf(name, sizeof(name), "decode_hd%d_b%d_ctx%dk", head_dim, batch, context / 1024);
  }
  if (!selected(name)) return;
  const int blocks_per_seq = (context + BS - 1) / BS;
  const size_t num_blocks = static_cast<size_t>(batch) * blocks_per_seq;
  const size_t cache_elems = num_blocks * BS * KV * D;
  // A KV set that fits in L2 (50 MB) would be re-read from L2 by back-to-back launches; rotate over
  // enough sets to span 128 MB, as a decoder's layers would (each reads its own cache once per step).
  const size_t kv_set_bytes = 2 * cache_elems * 2;
  int sets = static_cast<int>(std::min<size_t>(8, (size_t{128} << 20) / kv_set_bytes + 1));
  if (const char* e = std::getenv("TESSERA_BENCH_KV_SETS")) sets = std::max(1, std::atoi(e));  // 1: L2-warm
  DeviceMem kc_(cache_elems * 2 * sets), vc(cache_elems * 2 * sets), q(static_cast<size_t>(batch) * H * D * 2),
      out(static_cast<size_t>(batch) * H * D * 2);
  fill_random(kc_.ptr, cache_elems * sets, 4);
  fill_random(vc.ptr, cache_elems * sets, 5);
  fill_random(q.ptr, static_cast<size_t>(batch) * H * D, 6);
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));  // blocks scattered, as after churn
  std::vector<int32_t> lens(batch, context);
  DeviceMem d_table(table.size() * 4), d_lens(lens.size() * 4);
  BENCH_CHECK(cudaMemcpy(d_table.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_lens.ptr, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  kc::DecodeArgs a;
  a.out = out.ptr;
  a.q = q.ptr;
  a.k_cache = kc_.ptr;
  a.v_cache = vc.ptr;
  a.block_tables = d_table.as<int32_t>();
  a.context_lens = d_lens.as<int32_t>();
  a.num_seqs = batch;
  a.num_heads = H;
  a.num_kv_heads = KV;
  a.head_dim = D;
  a.block_size = BS;
  a.max_blocks_per_seq = blocks_per_seq;
  a.max_context_len = context;
  a.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
  int sms = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const kc::DecodeWorkspaceNeed need = kc::decode_workspace_need(a, sms);
  DeviceMem partials(need.partial_bytes), counters(static_cast<size_t>(need.counters) * sizeof(int));
  BENCH_CHECK(cudaMemset(counters.ptr, 0, need.counters > 0 ? need.counters * sizeof(int) : 16));
  const kc::DecodeWorkspace ws{partials.ptr, need.partial_bytes, static_cast<int*>(counters.ptr), need.counters};
  int set = 0;
  const char* stream_env = std::getenv("TESSERA_BENCH_STREAM");
  cudaStream_t own = nullptr;
  if (stream_env != nullptr && std::atoi(stream_env) == 1) BENCH_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  BENCH_CHECK(cudaDeviceSynchronize());
  g_stream = own;
  auto launch = [&] {
    a.k_cache = kc_.as<__nv_bfloat16>() + (set % sets) * cache_elems;
    a.v_cache = vc.as<__nv_bfloat16>() + (set % sets) * cache_elems;
    ++set;
    BENCH_CHECK(kc::decode_attention(kc::DType::kBF16, a, ws, sms, g_stream));
  };
  const Timing t = time_launches(launch);
  BENCH_CHECK(cudaStreamSynchronize(g_stream));
  g_stream = nullptr;
  if (own != nullptr) BENCH_CHECK(cudaStreamDestroy(own));
  const double bytes = 2.0 * batch * context * KV * D * 2;  // K and V, bf16
  std::snprintf(shape, sizeof(shape), "B%d ctx%d H%d KV%d D%d block%d%s", batch, context, H, KV, D, BS,
                sets > 1 ? (" KV x" + std::to_string(sets) + " rotated").c_str() : "");
  emit("tessera", name, shape, t, "gbps", bytes / (t.median_ms * 1e-3) / 1e9);
  // At batch 1 a step is a few microseconds, near what the host needs to issue one launch: the same
  // launches inside a CUDA graph show the kernel without the host's pace.
  if (batch == 1) {
    const Timing g = time_graph(launch);
    emit("tessera", std::string(name) + "_graph", shape, g, "gbps", bytes / (g.median_ms * 1e-3) / 1e9);
  }
}

void bench_copy() {
  if (!selected("d2d_copy")) return;
  const size_t bytes = size_t{1} << 30;
  DeviceMem src(bytes), dst(bytes);
  fill_random(src.ptr, bytes / 2, 8);
  const Timing t = time_launches([&] { BENCH_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice)); });
  emit("cudaMemcpy", "d2d_copy", "1 GiB", t, "gbps", 2.0 * bytes / (t.median_ms * 1e-3) / 1e9);  // read + write
}

// ---------------------------------------------------------------- add + RMSNorm
void bench_add_rmsnorm(int tokens) {
  const int hidden = 4096;
  char name[64], shape[64];
  std::snprintf(name, sizeof(name), "add_rmsnorm_t%d", tokens);
  if (!selected(name)) return;
  // Small cases rotate over enough buffer sets to leave L2 (50 MB), as a decoder's layers would.
  const size_t elems = static_cast<size_t>(tokens) * hidden;
  const int sets = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / (elems * 4), 1, 64));
  std::vector<std::unique_ptr<DeviceMem>> xs, rs;
  for (int s = 0; s < sets; ++s) {
    xs.push_back(std::make_unique<DeviceMem>(elems * 2));
    rs.push_back(std::make_unique<DeviceMem>(elems * 2));
    fill_random(xs.back()->ptr, elems, 10 + s);
    fill_random(rs.back()->ptr, elems, 100 + s);
  }
  DeviceMem w(hidden * 2);
  fill_random(w.ptr, hidden, 9);
  int next = 0;
  auto launch = [&] {
    const int s = next++ % sets;
    BENCH_CHECK(kc::fused_add_rmsnorm(kc::DType::kBF16, xs[s]->ptr, rs[s]->ptr, w.ptr, tokens, hidden, hidden, 1e-6f,
                                      g_stream));
  };
  const double bytes = 4.0 * elems * 2 + hidden * 2;  // read x, residual; write both
  std::snprintf(shape, sizeof(shape), "T%d hidden%d", tokens, hidden);
  const Timing t = time_launches(launch);
  emit("tessera", name, shape, t, "gbps", bytes / (t.median_ms * 1e-3) / 1e9);
  if (tokens <= 64) {  // launch-bound sizes: also inside a CUDA graph (attention_peers.py does the same)
    const Timing g = time_graph(launch);
    emit("tessera", std::string(name) + "_graph", shape, g, "gbps", bytes / (g.median_ms * 1e-3) / 1e9);
  }
}

// ---------------------------------------------------------------- quantized weights at decode
// One token's linear layers of Llama-2-7B as the engine runs them (fused qkv 12288x4096, o
// 4096x4096, fused gate_up 22016x4096, down 4096x11008; 32 layers: 6.5 G weights) at m rows, each
// weight format in turn: what decode spends streaming weights. The 128 launches are captured into
// one CUDA graph, as the engine replays a decode step, so the host's launch cost is not timed.
void bench_7b_linear_decode(int m) {
  struct Shape {
    int n, k;
  };
  const Shape kLayer[] = {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}};
  constexpr int kPerLayer = sizeof(kLayer) / sizeof(kLayer[0]);
  constexpr int kLayers = 32;
  DeviceMem x(static_cast<size_t>(m) * 11008 * 2), y(static_cast<size_t>(m) * 22016 * 2);
  fill_random(x.ptr, static_cast<size_t>(m) * 11008, 3);
  const std::pair<const char*, int> formats[] = {{"bf16", -1},
                                                 {"int8", static_cast<int>(kc::WeightFormat::kInt8)},
                                                 {"int4_g128", static_cast<int>(kc::WeightFormat::kInt4G128)},
                                                 {"fp8_e4m3", static_cast<int>(kc::WeightFormat::kFp8E4M3)}};
  for (const auto& [format_name, format_id] : formats) {
    char name[64], shape[96];
    std::snprintf(name, sizeof(name), "linear7b_decode_m%d_%s", m, format_name);
    if (!selected(name)) continue;
    const auto format = static_cast<kc::WeightFormat>(format_id);
    std::vector<std::unique_ptr<DeviceMem>> weights;
    double bytes = 0;
    {
      DeviceMem source(size_t{22016} * 4096 * 2);  // each bf16 weight before it is quantized
      for (int l = 0; l < kLayers; ++l) {
        for (const Shape& sh : kLayer) {
          const size_t elems = static_cast<size_t>(sh.n) * sh.k;
          const size_t size = format_id < 0 ? elems * 2 : kc::quantized_weight_bytes(format, sh.n, sh.k);
          weights.push_back(std::make_unique<DeviceMem>(size));
          bytes += static_cast<double>(size);
          const uint32_t seed = static_cast<uint32_t>(1000 + weights.size());
          if (format_id < 0) {
            fill_random(weights.back()->ptr, elems, seed);
          } else {
            fill_random(source.ptr, elems, seed);
            BENCH_CHECK(kc::quantize_weight(kc::DType::kBF16, source.ptr, sh.n, sh.k, format, weights.back()->ptr,
                                            nullptr));
          }
        }
      }
      BENCH_CHECK(cudaDeviceSynchronize());
    }
    cudaStream_t stream;
    BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto pass = [&] {
      for (size_t i = 0; i < weights.size(); ++i) {
        const Shape& sh = kLayer[i % kPerLayer];
        BENCH_CHECK(format_id < 0 ? kc::gemv(kc::DType::kBF16, y.ptr, x.ptr, weights[i]->ptr, nullptr, m, sh.n, sh.k,
                                             kc::GemvRowBits::kFastest, stream)
                                  : kc::quantized_gemv(kc::DType::kBF16, format, y.ptr, x.ptr, weights[i]->ptr,
                                                       nullptr, m, sh.n, sh.k, kc::GemvRowBits::kFastest, stream));
      }
    };
    pass();  // module load outside the capture
    BENCH_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    pass();
    BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const cudaStream_t saved = g_stream;
    g_stream = stream;
    const Timing t = time_launches([&] { BENCH_CHECK(cudaGraphLaunch(exec, stream)); });
    g_stream = saved;
    BENCH_CHECK(cudaGraphExecDestroy(exec));
    BENCH_CHECK(cudaGraphDestroy(graph));
    BENCH_CHECK(cudaStreamDestroy(stream));
    std::snprintf(shape, sizeof(shape), "Llama-2-7B linears x32 layers, m%d, %.2f GB of weights", m, bytes / 1e9);
    emit("tessera", name, shape, t, "gbps", bytes / (t.median_ms * 1e-3) / 1e9);
  }
}

// ---------------------------------------------------------------- quantized weights at prefill
// One layer's linears of Llama-2-7B (the four shapes above) at m rows, over 4 layers of distinct
// weights, as the backend's Impl::gemm runs them above 8 rows: bf16 weights through cuBLASLt (the
// peer); int8 and fp8_e4m3 as W8A8 (each linear quantizes its input rows to the weight's format,
// then the int8 or FP8 tensor-core GEMM with both scale vectors, both timed); int4_g128 on the
// mixed-input GEMM (nibbles expanded in registers); and *_dequant, the path those replaced (the
// weight expanded to bf16, then the bf16 GEMM). Rate: the GEMMs' tflops. Up to kDecodeBatchRows rows
// each is timed again inside a CUDA graph (*_graph).
constexpr int kDecodeBatchRows = 128;
void bench_7b_linear_prefill(int m) {
  struct Shape {
    int n, k;
  };
  const Shape kLayer[] = {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}};
  constexpr int kPerLayer = sizeof(kLayer) / sizeof(kLayer[0]);
  constexpr int kLayers = 4;
  enum class Path { kDense, kW8A8, kMixedInput, kDequantize };
  struct Format {
    const char* name;
    Path path;
    kc::WeightFormat format;
  };
  const Format kFormats[] = {{"bf16", Path::kDense, kc::WeightFormat::kInt8},
                             {"int8", Path::kW8A8, kc::WeightFormat::kInt8},
                             {"fp8_e4m3", Path::kW8A8, kc::WeightFormat::kFp8E4M3},
                             {"int4_g128", Path::kMixedInput, kc::WeightFormat::kInt4G128},
                             {"int8_dequant", Path::kDequantize, kc::WeightFormat::kInt8},
                             {"fp8_e4m3_dequant", Path::kDequantize, kc::WeightFormat::kFp8E4M3},
                             {"int4_g128_dequant", Path::kDequantize, kc::WeightFormat::kInt4G128}};
  bool any = false;
  for (const Format& f : kFormats) any = any || selected("linear7b_prefill_m" + std::to_string(m) + "_" + f.name);
  if (!any) return;
  DeviceMem x(static_cast<size_t>(m) * 11008 * 2), y(static_cast<size_t>(m) * 22016 * 2);
  DeviceMem xq(kc::quantized_weight_bytes(kc::WeightFormat::kInt8, m, 11008));
  DeviceMem dense(size_t{22016} * 4096 * 2);
  fill_random(x.ptr, static_cast<size_t>(m) * 11008, 5);
  kc::GemmRunner runner;
  BENCH_CHECK(runner.init());
  double flops = 0;
  for (const Shape& sh : kLayer) flops += 2.0 * m * sh.n * sh.k * kLayers;
  for (const Format& f : kFormats) {
    char name[64], shape[96];
    std::snprintf(name, sizeof(name), "linear7b_prefill_m%d_%s", m, f.name);
    if (!selected(name)) continue;
    std::vector<std::unique_ptr<DeviceMem>> weights;
    for (int l = 0; l < kLayers; ++l) {
      for (const Shape& sh : kLayer) {
        const size_t elems = static_cast<size_t>(sh.n) * sh.k;
        const uint32_t seed = static_cast<uint32_t>(2000 + weights.size());
        if (f.path == Path::kDense) {
          weights.push_back(std::make_unique<DeviceMem>(elems * 2));
          fill_random(weights.back()->ptr, elems, seed);
        } else {
          weights.push_back(std::make_unique<DeviceMem>(kc::quantized_weight_bytes(f.format, sh.n, sh.k)));
          fill_random(dense.ptr, elems, seed);
          BENCH_CHECK(
              kc::quantize_weight(kc::DType::kBF16, dense.ptr, sh.n, sh.k, f.format, weights.back()->ptr, nullptr));
        }
      }
    }
    BENCH_CHECK(cudaDeviceSynchronize());
    auto gemm_status = [&](cudaError_t e) {
      if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: %s (%s)\n", name, cudaGetErrorString(e), runner.last_error().c_str());
        std::exit(1);
      }
    };
    auto pass = [&] {
      for (size_t i = 0; i < weights.size(); ++i) {
        const Shape& sh = kLayer[i % kPerLayer];
        const void* w = weights[i]->ptr;
        if (f.path == Path::kDense) {
          gemm_status(runner.run(kc::DType::kBF16, y.ptr, x.ptr, w, nullptr, m, sh.n, sh.k, g_stream));
        } else if (f.path == Path::kMixedInput) {
          gemm_status(runner.run_int4_g128(y.ptr, x.ptr, w, nullptr, m, sh.n, sh.k, g_stream));
        } else if (f.path == Path::kW8A8) {
          BENCH_CHECK(kc::quantize_activations(kc::DType::kBF16, f.format, x.ptr, m, sh.k, xq.ptr, g_stream));
          gemm_status(runner.run_w8a8(f.format, y.ptr, xq.ptr, kc::quantized_row_scales(f.format, xq.ptr, m, sh.k), w,
                                      kc::quantized_row_scales(f.format, w, sh.n, sh.k), nullptr, m, sh.n, sh.k,
                                      g_stream));
        } else {
          BENCH_CHECK(kc::dequantize_weight(kc::DType::kBF16, w, sh.n, sh.k, f.format, dense.ptr, g_stream));
          gemm_status(runner.run(kc::DType::kBF16, y.ptr, x.ptr, dense.ptr, nullptr, m, sh.n, sh.k, g_stream));
        }
      }
    };
    const Timing t = time_launches(pass);
    std::snprintf(shape, sizeof(shape), "Llama-2-7B linears x%d layers, m%d", kLayers, m);
    emit("tessera", name, shape, t, "tflops", flops / (t.median_ms * 1e-3) / 1e12);
    // At a decode batch's rows the host's launches take about as long as the GEMMs: these rows are
    // also timed inside a CUDA graph, as the engine replays a decode step.
    if (m <= kDecodeBatchRows) {
      const Timing g = time_graph(pass);
      emit("tessera", std::string(name) + "_graph", shape, g, "tflops", flops / (g.median_ms * 1e-3) / 1e12);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--only" && i + 1 < argc) {
      g_only = argv[++i];
    } else if (arg == "--samples" && i + 1 < argc) {
      g_samples = std::max(20, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: tessera-bench [--only SUBSTRING] [--samples N>=20]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  g_device = prop.name;
  g_commit = std::getenv("TESSERA_COMMIT") ? std::getenv("TESSERA_COMMIT") : "unknown";

  bench_copy();
  std::vector<PrefillCase> prefill = {
      {"causal_hd128_b4_s4096", 4, 4096, 32, 128, MaskKind::kCausal},
      {"causal_hd128_b2_s8192", 2, 8192, 32, 128, MaskKind::kCausal},
      {"causal_hd64_b4_s4096", 4, 4096, 32, 64, MaskKind::kCausal},
      {"sliding1024_hd128_b4_s4096", 4, 4096, 32, 128, MaskKind::kSlidingWindow, 1024},
      {"sliding1024_hd128_b2_s8192", 2, 8192, 32, 128, MaskKind::kSlidingWindow, 1024},
      {"doc8_causal_hd128_b2_s8192", 2, 8192, 32, 128, MaskKind::kSegments, 0, 8},
      // Short prompts, one sequence: the 7B shape's 32 heads of 128 and SmolLM2's 9 of 64.
      {"short_causal_hd128_b1_h32_s128", 1, 128, 32, 128, MaskKind::kCausal},
      {"short_causal_hd128_b1_h32_s512", 1, 512, 32, 128, MaskKind::kCausal},
      {"short_causal_hd128_b1_h32_s1024", 1, 1024, 32, 128, MaskKind::kCausal},
      {"short_causal_hd64_b1_h9_s128", 1, 128, 9, 64, MaskKind::kCausal},
      {"short_causal_hd64_b1_h9_s512", 1, 512, 9, 64, MaskKind::kCausal},
      {"short_causal_hd64_b1_h9_s2048", 1, 2048, 9, 64, MaskKind::kCausal},
      // BERT-base's encoder attention (12 heads of 64, bidirectional, fp16): one text, and a batch.
      {"bert_bidir_hd64_b1_s128_fp16", 1, 128, 12, 64, MaskKind::kBidirectional, 0, 0, kc::DType::kFP16},
      {"bert_bidir_hd64_b128_s128_fp16", 128, 128, 12, 64, MaskKind::kBidirectional, 0, 0, kc::DType::kFP16},
  };
  // The H100 table of FlashAttention-3's paper (causal; batch x heads x length per head dim), in
  // both 16-bit types.
  for (const auto& [dtype, suffix] : {std::pair{kc::DType::kFP16, "fp16"}, std::pair{kc::DType::kBF16, "bf16"}}) {
    const std::string type_name = suffix;
    prefill.push_back({"seed_causal_hd64_b4_h32_s4096_" + type_name, 4, 4096, 32, 64, MaskKind::kCausal, 0, 0, dtype});
    prefill.push_back({"seed_causal_hd128_b2_h16_s8192_" + type_name, 2, 8192, 16, 128, MaskKind::kCausal, 0, 0, dtype});
    prefill.push_back({"seed_causal_hd256_b1_h8_s16384_" + type_name, 1, 16384, 8, 256, MaskKind::kCausal, 0, 0, dtype});
  }
  for (const auto& c : prefill) {
    if (!selected(c.name)) continue;
    bench_prefill(c);
  }
  for (int batch : {1, 16, 64})
    for (int context : {4096, 16384}) bench_decode(batch, context, 128);
  for (int batch : {1, 16}) bench_decode(batch, 4096, 256);
  for (int tokens : {1, 64, 4096, 16384}) bench_add_rmsnorm(tokens);
  for (int m : {1, 2, 4, 8}) bench_7b_linear_decode(m);
  for (int m : {16, 64, 128, 512, 2048}) bench_7b_linear_prefill(m);
  return 0;
}
