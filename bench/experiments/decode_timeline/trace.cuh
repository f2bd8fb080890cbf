// bench/experiments/decode_timeline/trace.cuh: per-CTA timeline marks (thread 0, %globaltimer, which
// ticks in 256 ns steps on the H200) for back-to-back launches. A CTA learns its launch's index from
// a per-CTA counter, so launches need no argument: the n-th launch of the grid is index n.
#pragma once
constexpr int kDiagLaunches = 512, kDiagCtas = 1024, kDiagEvents = 8;
__device__ unsigned long long g_trace[kDiagLaunches][kDiagCtas][kDiagEvents];
__device__ int g_cta_launch[kDiagCtas];
__device__ __forceinline__ unsigned long long diag_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
#define DIAG_BEGIN()                                                                      \
  const int diag_cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);   \
  int diag_launch = 0;                                                                    \
  if (threadIdx.x == 0) {                                                                 \
    diag_launch = atomicAdd(&g_cta_launch[diag_cta], 1);                                  \
    if (diag_launch < kDiagLaunches) g_trace[diag_launch][diag_cta][0] = diag_now();      \
  }
#define DIAG_MARK(e)                                                                      \
  if (threadIdx.x == 0 && diag_launch < kDiagLaunches) g_trace[diag_launch][diag_cta][e] = diag_now();
