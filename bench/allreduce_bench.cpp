// bench/allreduce_bench.cpp: the latency of one all-reduce (sum, bf16) over the GPUs of this host,
// by message size: NCCL eagerly and inside a CUDA graph of back-to-back all-reduces (as a captured
// decode step runs the two a layer makes), and Tessera's one-shot all-reduce + add + RMSNorm over
// NVLink (kernels/cuda/collectives) in a graph, for messages of rows of 4096 values. One thread per
// rank, as the engine drives its ranks.
// JSON lines: {"case": "allreduce", "library": "nccl" | "tessera_oneshot", "mode": "graph" | "eager",
// "bytes", "us", ...}.
#include <cuda_runtime.h>
#include <nccl.h>

#include <CLI/CLI.hpp>

#include <barrier>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_output.h"
#include "common/error.h"
#include "kernels/cuda/collectives/oneshot_allreduce.h"

namespace tessera {
namespace {

#define CHECK_CUDA(call)                                                                  \
  do {                                                                                    \
    const cudaError_t e = (call);                                                         \
    TESSERA_CHECK(e == cudaSuccess, #call << ": " << cudaGetErrorString(e));              \
  } while (0)
#define CHECK_NCCL(call)                                                                  \
  do {                                                                                    \
    const ncclResult_t r = (call);                                                        \
    TESSERA_CHECK(r == ncclSuccess, #call << ": " << ncclGetErrorString(r));              \
  } while (0)

struct Options {
  int ranks = 2;
  std::vector<int64_t> sizes{8192, 16384, 32768, 65536, 262144, 1 << 20, 8 << 20, 64 << 20};
  int ops_per_graph = 64;
  int reps = 20;
};

// What one rank all-reduces with: NCCL's communicator, or the one-shot exchange (then `comm` is null).
struct Reducer {
  ncclComm_t comm = nullptr;
  const kernels::cuda::OneShotRank* oneshot = nullptr;
};

// Microseconds per all-reduce of `bytes` on rank `rank` (rank 0's clock is reported): `graph`
// replays a graph of ops_per_graph all-reduces `reps` times; eager issues as many one by one.
double time_rank(const Options& o, Reducer reducer, int rank, int64_t bytes, bool graph, std::barrier<>& sync) {
  CHECK_CUDA(cudaSetDevice(rank));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The buffer, then (one-shot) the residual and a norm weight of one 4096-wide row.
  constexpr int kHidden = 4096;
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, 2 * static_cast<size_t>(bytes) + kHidden * 2));
  CHECK_CUDA(cudaMemsetAsync(buffer, 0, 2 * static_cast<size_t>(bytes) + kHidden * 2, stream));
  void* residual = static_cast<char*>(buffer) + bytes;
  void* weight = static_cast<char*>(buffer) + 2 * bytes;
  const size_t count = static_cast<size_t>(bytes) / 2;
  auto issue = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (reducer.oneshot != nullptr) {
        CHECK_CUDA(kernels::cuda::oneshot_allreduce_add_rmsnorm(kernels::cuda::DType::kBF16, *reducer.oneshot, buffer,
                                                                residual, weight, static_cast<int>(count / kHidden),
                                                                kHidden, 1e-5f, stream));
      } else {
        CHECK_NCCL(ncclAllReduce(buffer, buffer, count, ncclBfloat16, ncclSum, reducer.comm, stream));
      }
    }
  };
  // NCCL connects a communicator's peers at its first collective, which a capture cannot hold: one
  // eager all-reduce first, as the engine's first (eager) step of a shape does.
  issue(1);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    issue(o.ops_per_graph);
    CHECK_CUDA(cudaStreamEndCapture(stream, &g));
    CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
    CHECK_CUDA(cudaGraphDestroy(g));
  }
  auto run = [&](int reps) {
    for (int r = 0; r < reps; ++r) {
      if (graph) {
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
      } else {
        issue(o.ops_per_graph);
      }
    }
  };
  run(2);  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  sync.arrive_and_wait();
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  run(o.reps);
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(buffer);
  cudaStreamDestroy(stream);
  return 1000.0 * ms / (o.reps * o.ops_per_graph);
}

int run(const Options& o) {
  int gpus = 0;
  CHECK_CUDA(cudaGetDeviceCount(&gpus));
  TESSERA_CHECK(gpus >= o.ranks, "--ranks " << o.ranks << ": " << gpus << " GPUs are visible");
  std::vector<int> devices(static_cast<size_t>(o.ranks));
  for (int r = 0; r < o.ranks; ++r) devices[static_cast<size_t>(r)] = r;
  std::vector<ncclComm_t> comms(static_cast<size_t>(o.ranks));
  CHECK_NCCL(ncclCommInitAll(comms.data(), o.ranks, devices.data()));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int version = 0;
  ncclGetVersion(&version);
  std::string why;
  const std::unique_ptr<kernels::cuda::OneShotGroup> oneshot = kernels::cuda::OneShotGroup::create(devices, &why);
  TESSERA_CHECK(oneshot != nullptr, "one-shot all-reduce: " << why);
  struct Mode {
    bool oneshot, graph;
  };
  for (const Mode mode : {Mode{false, true}, Mode{false, false}, Mode{true, true}}) {
    const bool graph = mode.graph;
    for (const int64_t bytes : o.sizes) {
      if (mode.oneshot && (bytes % (4096 * 2) != 0 || bytes > kernels::cuda::kOneShotMaxBytes)) continue;
      std::barrier sync(o.ranks);
      std::vector<double> us(static_cast<size_t>(o.ranks));
      std::vector<std::thread> threads;
      std::vector<std::string> errors(static_cast<size_t>(o.ranks));
      for (int r = 0; r < o.ranks; ++r) {
        threads.emplace_back([&, r] {
          try {
            const Reducer reducer = mode.oneshot ? Reducer{nullptr, &oneshot->rank(r)} : Reducer{comms[static_cast<size_t>(r)], nullptr};
            us[static_cast<size_t>(r)] = time_rank(o, reducer, r, bytes, graph, sync);
          } catch (const std::exception& e) {
            errors[static_cast<size_t>(r)] = e.what();
            sync.arrive_and_drop();  // the other rank does not wait for this one at the barrier
          }
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < o.ranks; ++r) {
        TESSERA_CHECK(errors[static_cast<size_t>(r)].empty(), "rank " << r << ", " << bytes << " bytes, "
                                                                     << (graph ? "graph" : "eager") << ": "
                                                                     << errors[static_cast<size_t>(r)]);
      }
      bench::print_json_line({{"bench", "tessera_allreduce"}, {"case", "allreduce"}, {"mode", graph ? "graph" : "eager"},
                              {"library", mode.oneshot ? "tessera_oneshot_add_rmsnorm" : "nccl"},
                              {"nccl_version", version}, {"ranks", o.ranks}, {"bytes", bytes},
                              {"us", us[0]}, {"unit", "us"}, {"device", prop.name},
                              {"bus_gb_s", 2.0 * (o.ranks - 1) / o.ranks * static_cast<double>(bytes) / (us[0] * 1e3)}});
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Options o;
  CLI::App app{"NCCL all-reduce latency by message size, eager and in a CUDA graph"};
  app.add_option("--ranks", o.ranks, "GPUs")->capture_default_str();
  app.add_option("--sizes", o.sizes, "message sizes in bytes")->capture_default_str();
  app.add_option("--reps", o.reps, "graph replays (or eager rounds) timed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return tessera::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce-bench: %s\n", e.what());
    return 1;
  }
}
