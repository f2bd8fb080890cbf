// tests/gpu/gpu_test_util.h: what every GPU kernel test shares: the no-GPU skip, device buffers,
// bf16/fp16 host conversion, seeded random data, and the normalized-error comparison.
//
// Tolerances (‖out − ref‖ / ‖ref‖ against an fp32/fp64 CPU reference on the same rounded inputs):
//   bf16: 1.5e-2 (8-bit mantissa: one rounding of an output is ~2e-3 relative, P is rounded too)
//   fp16: 4e-3   (11-bit mantissa)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_mask.h"
#include "kernels/cuda/common/dtype.h"
#include "kernels/cuda/common/host_convert.h"

namespace tessera::gpu_test {

using kernels::cuda::DType;

inline bool gpu_available() {
  static const bool available = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return available;
}

#define TESSERA_REQUIRE_GPU()                                       \
  do {                                                              \
    if (!::tessera::gpu_test::gpu_available()) GTEST_SKIP() << "no CUDA GPU present"; \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

inline double tolerance(DType dtype) { return dtype == DType::kBF16 ? 1.5e-2 : 4e-3; }

using kernels::cuda::from_bits;
using kernels::cuda::to_bits;
inline float round_to(float v, DType dtype) { return from_bits(to_bits(v, dtype), dtype); }

// Host tensor of a 2-byte dtype, with its fp32 view (the values the kernel actually sees).
struct HostTensor {
  DType dtype = DType::kBF16;
  std::vector<uint16_t> bits;
  std::vector<float> values;

  HostTensor() = default;
  HostTensor(DType d, size_t n) : dtype(d), bits(n), values(n) {}
  size_t size() const { return bits.size(); }
  void set(size_t i, float v) {
    bits[i] = to_bits(v, dtype);
    values[i] = from_bits(bits[i], dtype);
  }
  static HostTensor random(DType d, size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
    HostTensor t(d, n);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (size_t i = 0; i < n; ++i) t.set(i, dist(rng));
    return t;
  }
  void refresh_values() {
    for (size_t i = 0; i < bits.size(); ++i) values[i] = from_bits(bits[i], dtype);
  }
};

// Owning device allocation (cudaMalloc, never managed memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { allocate(bytes); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void allocate(size_t bytes) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = bytes;
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
inline void upload(DeviceBuffer& buf, const std::vector<T>& host) {
  buf.allocate(host.size() * sizeof(T) + 16);
  ASSERT_NE(buf.get(), nullptr);
  ASSERT_EQ(cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T>
inline std::vector<T> download(const DeviceBuffer& buf, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), buf.get(), count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}
// Fills a device buffer with 0xFFFF (NaN in bf16 and fp16), so an element the kernel fails to write
// makes the comparison fail.
inline void poison(DeviceBuffer& buf) { ASSERT_EQ(cudaMemset(buf.get(), 0xFF, buf.bytes()), cudaSuccess); }

// ‖out − ref‖ / ‖ref‖ over the given elements; NaN/Inf in out gives +inf.
inline double normalized_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<float> to_floats(const std::vector<uint16_t>& bits, DType dtype) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = from_bits(bits[i], dtype);
  return out;
}

inline const char* name(DType d) { return kernels::cuda::dtype_name(d); }

// One sequence of an attention test: q_len queries at the end of kv_len keys, under `mask`.
struct SeqSpec {
  int q_len;
  int kv_len;
  kernels::MaskParams mask;           // segment_ends filled from `segment_ends` by the test
  std::vector<int32_t> segment_ends;  // host copy
  int evicted_blocks = 0;             // paged tests: the first blocks after the sink block are evicted (-1)
};

inline SeqSpec causal(int q, int kv) { return {q, kv, kernels::MaskParams{}, {}}; }
inline SeqSpec bidirectional(int q, int kv) {
  kernels::MaskParams m;
  m.kind = kernels::MaskKind::kBidirectional;
  return {q, kv, m, {}};
}
inline SeqSpec sliding(int q, int kv, int window, int sinks, int evicted_blocks = 0) {
  kernels::MaskParams m;
  m.kind = kernels::MaskKind::kSlidingWindow;
  m.window = window;
  m.sinks = sinks;
  return {q, kv, m, {}, evicted_blocks};
}
inline SeqSpec segments(int q, int kv, int prefix, std::vector<int32_t> ends) {
  kernels::MaskParams m;
  m.kind = kernels::MaskKind::kSegments;
  m.shared_prefix = prefix;
  m.num_segments = static_cast<int32_t>(ends.size());
  return {q, kv, m, std::move(ends)};
}

}  // namespace tessera::gpu_test
