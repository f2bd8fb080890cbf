// bench/experiments/decode_timeline/timeline.cu: when each phase of a paged decode launch happens, in a
// stream of back-to-back launches as tessera-bench's decode_b1 rows run them (B1, 32 query heads on 8
// KV heads, hd128, bf16, KV sets rotated past L2, PDL). Thread 0 of every CTA stamps %globaltimer at
// seven points (trace.cuh; the marks go into a copy of decode.cuh that build.sh makes), and this
// prints, per point, the median over launches of the earliest, median and latest CTA, in ns after
// the previous launch's last merge. Usage: timeline [context] (default 4096); TESSERA_DECODE_CHUNK
// forces the split length as in the benchmark.
#include "decode_traced.cuh"
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>
namespace kc = tessera::kernels::cuda;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char** argv) {
  const int context = argc > 1 ? std::atoi(argv[1]) : 4096;
  const int launches = 400, H = 32, KV = 8, D = 128, BS = 16;
  const int blocks = context / BS;
  const size_t elems = size_t(blocks) * BS * KV * D;
  const int sets = std::min<size_t>(8, (size_t{128} << 20) / (4 * elems) + 1);
  __nv_bfloat16 *k, *v, *q, *out;
  CK(cudaMalloc(&k, elems * 2 * sets)); CK(cudaMalloc(&v, elems * 2 * sets));
  CK(cudaMemset(k, 0x3c, elems * 2 * sets)); CK(cudaMemset(v, 0x3c, elems * 2 * sets));
  CK(cudaMalloc(&q, H * D * 2)); CK(cudaMalloc(&out, H * D * 2)); CK(cudaMemset(q, 0x3c, H * D * 2));
  std::vector<int> table(blocks); std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  int *d_table, *d_len; CK(cudaMalloc(&d_table, blocks * 4)); CK(cudaMalloc(&d_len, 4));
  CK(cudaMemcpy(d_table, table.data(), blocks * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_len, &context, 4, cudaMemcpyHostToDevice));
  kc::DecodeArgs a;
  a.out = out; a.q = q; a.block_tables = d_table; a.context_lens = d_len; a.num_seqs = 1; a.num_heads = H;
  a.num_kv_heads = KV; a.head_dim = D; a.block_size = BS; a.max_blocks_per_seq = blocks; a.max_context_len = context;
  a.softmax_scale = 0.088f;
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const kc::DecodeSplitPlan plan = kc::plan_decode_split(a, sms);
  void* partials; int* counters;
  CK(cudaMalloc(&partials, plan.bytes + 16)); CK(cudaMalloc(&counters, 4096)); CK(cudaMemset(counters, 0, 4096));
  const kc::DecodeWorkspace ws{partials, plan.bytes, counters, plan.counters};
  const int ctas = plan.num_splits * KV * plan.head_tiles;
  std::printf("context %d sets %d chunk %d splits %d ctas %d\n", context, sets, plan.chunk, plan.num_splits, ctas);
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < launches; ++i) {
    if (i == 100) CK(cudaEventRecord(e0));
    a.k_cache = k + (i % sets) * elems; a.v_cache = v + (i % sets) * elems;
    CK((kc::launch_decode<__nv_bfloat16, __nv_bfloat16, 128>(a, plan, ws, nullptr)));
  }
  CK(cudaEventRecord(e1)); CK(cudaDeviceSynchronize());
  float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
  std::printf("event time per launch %.3f us\n", ms * 1e3 / (launches - 100));
  static unsigned long long tr[kDiagLaunches][kDiagCtas][kDiagEvents];
  CK(cudaMemcpyFromSymbol(tr, g_trace, sizeof(tr)));
  // Per launch, relative to the previous launch's merge end.
  const char* names[] = {"start", "table", "ringfull", "waitpass", "loopdone", "atomic", "merge"};
  std::vector<std::vector<double>> lo(7), mid(7), hi(7);
  for (int L = 150; L < launches; ++L) {
    auto merge_end = [&](int l) { unsigned long long m = 0; for (int c = 0; c < ctas; ++c) m = std::max(m, tr[l][c][6]); return m; };
    const double ref = double(merge_end(L - 1));
    for (int e = 0; e < 7; ++e) {
      std::vector<double> t;
      for (int c = 0; c < ctas; ++c) if (tr[L][c][e] != 0) t.push_back(double(tr[L][c][e]) - ref);
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      lo[e].push_back(t.front()); mid[e].push_back(t[t.size() / 2]); hi[e].push_back(t.back());
    }
  }
  std::printf("ns after the previous launch's merge end (medians over launches of min / median / max over CTAs)\n");
  for (int e = 0; e < 7; ++e)
    if (!lo[e].empty()) std::printf("%-9s %8.0f %8.0f %8.0f\n", names[e], med(lo[e]), med(mid[e]), med(hi[e]));
  return 0;
}
