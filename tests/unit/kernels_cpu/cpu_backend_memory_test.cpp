// tests/unit/kernels_cpu/cpu_backend_memory_test.cpp: CpuBackend's tensor memory (BufferCache): every
// new tensor reads as zeros, whether fresh or reused, and a large fresh one takes no resident memory
// until written (so the idle server's KV cache costs no RSS), and dropped step buffers that the
// cache keeps for reuse go back to the OS on release_step_memory().
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend/cpu/cpu_backend.h"

namespace tessera {
namespace {

// Resident bytes of this process (/proc/self/statm, second field, in pages).
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

bool all_zero(const Tensor& t) {
  const float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (p[i] != 0.0f) return false;
  }
  return true;
}

TEST(CpuBackendMemory, NewTensorsReadAsZerosFreshOrReused) {
  CpuBackend backend(1);
  for (int64_t rows : {3, 300, 3000}) {  // 7 KiB (malloc), 703 KiB (cached), 7 MiB (own map, cached)
    {
      Tensor t = backend.empty({rows, 600}, ScalarType::kF32, "dirty");
      EXPECT_TRUE(all_zero(t)) << rows;
      float* p = t.f32();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = 1.5f;
    }  // dropped: the larger ones go back to the cache
    const Tensor again = backend.empty({rows, 600}, ScalarType::kF32, "again");
    EXPECT_TRUE(all_zero(again)) << rows << " rows: a reused buffer must be cleared";
  }
}

TEST(CpuBackendMemory, LargeFreshTensorIsNotResidentUntilWritten) {
  CpuBackend backend(1);
  const int64_t before = resident_bytes();
  Tensor t = backend.empty({64, 1 << 18}, ScalarType::kF32, "kv");  // 64 MiB
  const int64_t untouched = resident_bytes() - before;
  EXPECT_LT(untouched, int64_t{4} << 20) << "a fresh 64 MiB tensor made " << untouched << " bytes resident";
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); i += 1024) p[i] = 1.0f;  // every page
  EXPECT_GT(resident_bytes() - before, int64_t{60} << 20) << "the probe must see written pages";
}

TEST(CpuBackendMemory, ReleaseStepMemoryHandsCachedBuffersBack) {
  CpuBackend backend(1);
  const int64_t before = resident_bytes();
  {
    Tensor step = backend.empty({16, 1 << 20}, ScalarType::kF32, "step");  // 64 MiB, kept by the cache when dropped
    float* p = step.f32();
    for (int64_t i = 0; i < step.numel(); i += 1024) p[i] = 1.0f;
  }
  EXPECT_GT(resident_bytes() - before, int64_t{60} << 20) << "a dropped step buffer stays cached for the next step";
  backend.release_step_memory();
  EXPECT_LT(resident_bytes() - before, int64_t{4} << 20) << "released buffers must leave the resident set";
  const Tensor again = backend.empty({16, 1 << 20}, ScalarType::kF32, "again");
  EXPECT_TRUE(all_zero(again));
}

}  // namespace
}  // namespace tessera
