// bench/cuda_stub/cudart_stub.cpp: a stand-in for libcudart.so.13 on a machine without a GPU (built
// and used by bench/host_ab.sh, never by CMake). Every call returns success at once and is counted by
// name, so a CUDA binary runs its host side alone: what a step costs the host outside the driver,
// and which CUDA calls it makes, can be compared between two builds with no device. Device memory is
// fake addresses; a copy to the host writes zeros (a sampled token is 0).
//   TESSERA_STUB_COUNTS=path  at exit, each call's count, one "name count" a line
//   TESSERA_STUB_TRACE=path   at exit, the last 2^20 launches (kernel, grid, block, shared memory),
//                             copies, memsets, allocations and waits, one a line
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

// ---- counting

struct Counter {
  const char* name = nullptr;
  std::atomic<long> calls{0};
};
constexpr int kMaxCounters = 128;
Counter g_counters[kMaxCounters];
int g_counters_used = 0;
std::mutex g_counters_mutex;

int counter_slot(const char* name) {
  std::lock_guard<std::mutex> lock(g_counters_mutex);
  for (int i = 0; i < g_counters_used; ++i) {
    if (std::strcmp(g_counters[i].name, name) == 0) return i;
  }
  g_counters[g_counters_used].name = name;
  return g_counters_used++;
}

#define TESSERA_STUB_COUNT()                                                   \
  do {                                                                         \
    static const int stub_slot = counter_slot(__func__);                       \
    g_counters[stub_slot].calls.fetch_add(1, std::memory_order_relaxed);       \
  } while (0)

// ---- tracing

const bool g_tracing = std::getenv("TESSERA_STUB_TRACE") != nullptr;
constexpr size_t kTraceLines = size_t{1} << 20;
std::vector<std::string> g_trace;
size_t g_trace_next = 0;
std::map<const void*, std::string> g_kernel_names;  // host stub -> device function name

// Takes the line as a function, built only when tracing: building every call's string would add
// the stub's own allocations to the host time it is there to measure.
template <typename Line>
void trace(Line&& line) {
  if (!g_tracing) return;
  if (g_trace.empty()) g_trace.resize(kTraceLines);
  g_trace[g_trace_next++ % kTraceLines] = std::string(line());
}

std::string dims(dim3 d) { return std::to_string(d.x) + "x" + std::to_string(d.y) + "x" + std::to_string(d.z); }

std::string launch_line(const char* how, const void* kernel, dim3 grid, dim3 block, size_t smem) {
  const auto it = g_kernel_names.find(kernel);
  return std::string(how) + " " + (it == g_kernel_names.end() ? "?" : it->second) + " grid " + dims(grid) + " block " +
         dims(block) + " smem " + std::to_string(smem);
}

// ---- fake device memory

constexpr uintptr_t kDeviceBase = 0x7e0000000000;
std::atomic<uintptr_t> g_device_next{kDeviceBase};

void* fake_device_alloc(size_t bytes) {
  const size_t rounded = (bytes + 4095) / 4096 * 4096 + 4096;
  return reinterpret_cast<void*>(g_device_next.fetch_add(rounded));
}

bool on_device(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v >= kDeviceBase && v < g_device_next.load();
}

// A copy as the host sees it: to the device dropped, from the device zeros, host to host done.
void copy(void* dst, const void* src, size_t bytes) {
  if (on_device(dst)) return;
  if (on_device(src)) {
    std::memset(dst, 0, bytes);
    return;
  }
  std::memmove(dst, src, bytes);
}

struct LaunchConfig {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
};
thread_local LaunchConfig t_launch;

// One object stands for every stream, event, graph and executable graph.
int g_handle;

template <typename T>
T handle() {
  return reinterpret_cast<T>(&g_handle);
}

struct WriteAtExit {
  ~WriteAtExit() {
    if (const char* path = std::getenv("TESSERA_STUB_COUNTS")) write_counts(path);
    if (const char* path = std::getenv("TESSERA_STUB_TRACE")) write_trace(path);
  }
  static void write_counts(const char* path) {
    FILE* out = std::fopen(path, "w");
    if (out == nullptr) return;
    for (int i = 0; i < g_counters_used; ++i) std::fprintf(out, "%s %ld\n", g_counters[i].name, g_counters[i].calls.load());
    std::fclose(out);
  }
  static void write_trace(const char* path) {
    FILE* out = std::fopen(path, "w");
    if (out == nullptr) return;
    const size_t n = std::min(g_trace_next, kTraceLines);
    for (size_t i = g_trace_next - n; i < g_trace_next; ++i) std::fprintf(out, "%s\n", g_trace[i % kTraceLines].c_str());
    std::fclose(out);
  }
} g_write_at_exit;

// The Hopper prefill encodes its TMA descriptors through the driver entry point the runtime hands
// out: this one succeeds, so a stubbed run takes the Hopper path, as an H100 does.
CUresult stub_tensor_map_encode_tiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                      CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  TESSERA_STUB_COUNT();
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

// For cublaslt_stub.cpp, which counts and traces through this library.
int tessera_stub_counter_slot(const char* name) { return counter_slot(name); }
void tessera_stub_count(int slot) { g_counters[slot].calls.fetch_add(1, std::memory_order_relaxed); }
bool tessera_stub_tracing() { return g_tracing; }
void tessera_stub_trace(const char* line) { trace([&] { return line; }); }

// ---- what nvcc's generated host code calls: registration and <<<...>>> launches

void** __cudaRegisterFatBinary(void*) {
  static void* module = nullptr;
  return &module;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
// A __device__ or __constant__ variable of a kernel file (CUTLASS has some): nothing to place.
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
void __cudaRegisterFunction(void**, const char* host_stub, char*, const char* device_name, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {
  g_kernel_names[host_stub] = device_name;
}
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  t_launch = {grid, block, smem, stream};
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* smem, void* stream) {
  *grid = t_launch.grid;
  *block = t_launch.block;
  *smem = t_launch.smem;
  *static_cast<cudaStream_t*>(stream) = t_launch.stream;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_stub) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(host_stub));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void**, size_t smem, cudaStream_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return launch_line("launch", kernel, grid, block, smem); });
  return cudaSuccess;
}

// ---- the runtime API

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* kernel, void**) {
  TESSERA_STUB_COUNT();
  trace([&] {
    return launch_line("launch_ex", kernel, config->gridDim, config->blockDim, config->dynamicSmemBytes) + " attrs " +
           std::to_string(config->numAttrs);
  });
  return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  const bool known = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
  *function = known ? reinterpret_cast<void*>(&stub_tensor_map_encode_tiled) : nullptr;
  if (status != nullptr) *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* device) {
  TESSERA_STUB_COUNT();
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  TESSERA_STUB_COUNT();
  switch (attr) {  // an H100's
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 1024; break;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  std::memset(prop, 0, sizeof(*prop));
  std::strcpy(prop->name, "cuda stub (no device)");
  prop->major = 9;
  prop->multiProcessorCount = 132;
  prop->totalGlobalMem = size_t{80} << 30;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  TESSERA_STUB_COUNT();
  *free_bytes = size_t{70} << 30;
  *total_bytes = size_t{80} << 30;
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t) { return "cudaStub"; }
const char* cudaGetErrorString(cudaError_t) { return "no error: the CUDA stub fails nothing"; }
cudaError_t cudaGetLastError() {
  TESSERA_STUB_COUNT();
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) {
  TESSERA_STUB_COUNT();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  TESSERA_STUB_COUNT();
  *ptr = fake_device_alloc(bytes);
  trace([&] { return "malloc " + std::to_string(bytes); });
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  TESSERA_STUB_COUNT();
  trace([&] { return "free " + std::to_string(reinterpret_cast<uintptr_t>(ptr) - kDeviceBase); });
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  TESSERA_STUB_COUNT();
  trace([&] { return "malloc_host " + std::to_string(bytes); });
  *ptr = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  TESSERA_STUB_COUNT();
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  TESSERA_STUB_COUNT();
  trace([&] { return "memcpy kind " + std::to_string(kind) + " bytes " + std::to_string(bytes); });
  copy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return "memcpy_async kind " + std::to_string(kind) + " bytes " + std::to_string(bytes); });
  copy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void*, size_t, const void*, size_t, size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return "memcpy_2d kind " + std::to_string(kind) + " bytes " + std::to_string(width * height); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return "memset bytes " + std::to_string(bytes); });
  if (!on_device(dst)) std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return "stream_sync"; });
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  TESSERA_STUB_COUNT();
  trace([&] { return "begin_capture"; });
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  TESSERA_STUB_COUNT();
  trace([&] { return "end_capture"; });
  *graph = handle<cudaGraph_t>();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t, unsigned long long) {
  TESSERA_STUB_COUNT();
  *exec = handle<cudaGraphExec_t>();
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return "graph_launch"; });
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  TESSERA_STUB_COUNT();
  *event = handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return "event_record"; });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  TESSERA_STUB_COUNT();
  trace([&] { return "event_sync"; });
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.f;
  return cudaSuccess;
}

}  // extern "C"
