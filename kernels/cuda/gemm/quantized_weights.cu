// kernels/cuda/gemm/quantized_weights.cu: quantization at load, dequantization for the cuBLASLt
// path, and the decode GEMV over quantized weights; the only place their templates are instantiated.
//
// The GEMV follows gemv.cu: each warp owns R rows, a step loads 8 16-byte weight vectors per lane
// (L2 evict-first, no L1), and the m rows of x are read from L1. A vector holds 16 int8 / fp8 or 32
// int4 weights, expanded to fp32 8 at a time and multiplied in fp32. Integers are expanded by the
// 2^23 trick: a byte permute puts the value in the low mantissa byte of 8388608.0f, and subtracting
// 2^23 leaves the value, exactly. Per-row scales are applied once at the end; an int4 group's scale
// and minimum once per vector (a vector lies inside one group): acc += scale · Σ x·q + min · Σ x.
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/quantized_weights.h"

namespace tessera::kernels::cuda {
namespace {

// Quantized weights serve bf16 models (an LLM's dtype: auto), the only dtype instantiated here.
using Bf16 = __nv_bfloat16;

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int kLoadsPerLane = 8;

int64_t groups_per_row(int64_t k) { return (k + kInt4GroupSize - 1) / kInt4GroupSize; }

size_t align16(size_t bytes) { return (bytes + 15) & ~size_t{15}; }

// Byte b of `bytes` as the low mantissa byte of 8388608.0f (2^23): one byte permute, and the float
// minus 2^23 is the byte's value, exactly.
__device__ __forceinline__ float magic_byte(uint32_t bytes, int b) {
  return __int_as_float(static_cast<int>(__byte_perm(bytes, 0x4B000000u, 0x7540u | b)));
}

template <WeightFormat F>
struct Format;

template <>
struct Format<WeightFormat::kInt8> {
  static constexpr int kPerVector = 16;
  // Chunk c (0..1) of a vector: 8 weights as fp32 integers in [-127, 127].
  __device__ __forceinline__ static void chunk(const uint4& v, int c, float (&w)[8]) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t biased = words[2 * c + h] ^ 0x80808080u;  // int8 + 128, per byte
#pragma unroll
      for (int b = 0; b < 4; ++b) w[4 * h + b] = magic_byte(biased, b) - 8388736.f;
    }
  }
};

template <>
struct Format<WeightFormat::kInt4G128> {
  static constexpr int kPerVector = 32;
  // Chunk c (0..3): 8 nibbles of one word, low nibble first, as fp32 integers in [0, 15].
  __device__ __forceinline__ static void chunk(const uint4& v, int c, float (&w)[8]) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    // Low nibbles (even elements) and high nibbles (odd ones) of the word's 4 bytes, a byte each.
    const uint32_t even = words[c] & 0x0F0F0F0Fu;
    const uint32_t odd = (words[c] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      w[2 * b] = magic_byte(even, b) - 8388608.f;
      w[2 * b + 1] = magic_byte(odd, b) - 8388608.f;
    }
  }
};

template <>
struct Format<WeightFormat::kFp8E4M3> {
  static constexpr int kPerVector = 16;
  __device__ __forceinline__ static void chunk(const uint4& v, int c, float (&w)[8]) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t word = words[2 * c + h];
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const __half2_raw pair =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> (16 * p)), __NV_E4M3);
        const float2 f = __half22float2(__half2(pair));
        w[4 * h + 2 * p] = f.x;
        w[4 * h + 2 * p + 1] = f.y;
      }
    }
  }
};

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint4 load_weight(const uint4* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// Blocks an SM must hold: expanding weights is several instructions per byte (int4 most), so small
// m needs more warps than gemv.cu's to keep the SM's pipes busy between dependent operations.
template <int M>
constexpr int min_blocks_per_sm() {
  return M <= 2 ? 4 : 2;
}

template <typename T, WeightFormat F, int M, int R>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<M>()) quantized_gemv_kernel(T* y, const T* x, const uint4* __restrict__ data,
                                                                  const float* __restrict__ scales,
                                                                  const T* __restrict__ bias, int n, int k) {
  using Fmt = Format<F>;
  constexpr bool kGrouped = F == WeightFormat::kInt4G128;
  constexpr int kChunks = Fmt::kPerVector / 8;  // 8-weight chunks per vector
  constexpr int U = kLoadsPerLane / R;
  constexpr int kStep = 32 * U;  // vectors of each row per warp per step
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (row0 >= n) return;
  const int kv = k / Fmt::kPerVector;  // vectors per row
  const int kx = k >> 3;               // 16-byte x vectors per row of x
  const int groups = (k + kInt4GroupSize - 1) / kInt4GroupSize;
  const uint64_t policy = evict_first_policy();
  int rows[R];
  const uint4* w_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    rows[r] = min(row0 + r, n - 1);  // rows past n re-read row n - 1 and are never stored
    w_row[r] = data + static_cast<int64_t>(rows[r]) * kv + lane;
  }
  const uint4* x_vec = reinterpret_cast<const uint4*>(x);

  uint4 wv[R][U];
  auto load_step = [&](int v, auto guard_tag) {
    constexpr bool kGuard = decltype(guard_tag)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kGuard && v + u * 32 + lane >= kv) continue;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][u] = load_weight(w_row[r] + v + u * 32, policy);
    }
  };
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.f;

  auto fma_step = [&](int v, auto guard_tag) {
    constexpr bool kGuard = decltype(guard_tag)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int vec = v + u * 32 + lane;  // this lane's vector index within the row
      if (kGuard && vec >= kv) continue;
      float dot[M][R];  // Σ x·q over this vector
      float xsum[M];    // Σ x over this vector (grouped formats' minimum)
#pragma unroll
      for (int i = 0; i < M; ++i) {
        xsum[i] = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) dot[i][r] = 0.f;
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) Fmt::chunk(wv[r][u], c, wf[r]);
#pragma unroll
        for (int i = 0; i < M; ++i) {
          Vec8<T> t;
          t.raw = x_vec[static_cast<int64_t>(i) * kx + vec * kChunks + c];
          float xf[8];
          vec8_to_float(t, xf);
          if constexpr (kGrouped) {
#pragma unroll
            for (int e = 0; e < 8; ++e) xsum[i] += xf[e];
          }
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) dot[i][r] = fmaf(xf[e], wf[r][e], dot[i][r]);
        }
      }
      if constexpr (kGrouped) {
        const int group = vec * Fmt::kPerVector / kInt4GroupSize;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float scale = scales[static_cast<int64_t>(rows[r]) * groups + group];
          const float minimum = scales[static_cast<int64_t>(n) * groups + static_cast<int64_t>(rows[r]) * groups + group];
#pragma unroll
          for (int i = 0; i < M; ++i) acc[i][r] += fmaf(scale, dot[i][r], minimum * xsum[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < M; ++i)
#pragma unroll
          for (int r = 0; r < R; ++r) acc[i][r] += dot[i][r];
      }
    }
  };

  const int full_steps = kv / kStep;
  const bool has_tail = kv % kStep != 0;
  if (full_steps > 0)
    load_step(0, std::false_type{});
  else
    load_step(0, std::true_type{});
  pdl_wait_previous();
  pdl_launch_dependents();
  for (int s = 0; s < full_steps; ++s) {
    if (s > 0) load_step(s * kStep, std::false_type{});
    fma_step(s * kStep, std::false_type{});
  }
  if (has_tail) {
    if (full_steps > 0) load_step(full_steps * kStep, std::true_type{});
    fma_step(full_steps * kStep, std::true_type{});
  }

  float out = 0.f;
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = warp_sum(acc[i][r]);
      if (lane == i * R + r) out = s;
    }
  const int row = row0 + lane % R;
  if (lane < M * R && row < n) {
    if constexpr (!kGrouped) out *= scales[row];
    if (bias != nullptr) out += to_float(bias[row]);
    y[static_cast<int64_t>(lane / R) * n + row] = from_float<T>(out);
  }
}

template <typename T, WeightFormat F, int M>
cudaError_t launch_gemv(T* y, const T* x, const void* w, const T* bias, int n, int k, cudaStream_t stream) {
  constexpr int R = M <= 2 ? 2 : 4;
  constexpr int kRowsPerBlock = R * kWarpsPerBlock;
  const auto* data = static_cast<const uint4*>(w);
  const auto* scales = reinterpret_cast<const float*>(static_cast<const char*>(w) + align16(quantized_data_bytes(F, n, k)));
  return launch_with_pdl(quantized_gemv_kernel<T, F, M, R>,
                         dim3(static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock)), dim3(kThreads), 0,
                         stream, y, x, data, scales, bias, n, k);
}

template <typename T, WeightFormat F>
cudaError_t launch_gemv_m(T* y, const T* x, const void* w, const T* bias, int m, int n, int k, cudaStream_t stream) {
  switch (m) {
    case 1: return launch_gemv<T, F, 1>(y, x, w, bias, n, k, stream);
    case 2: return launch_gemv<T, F, 2>(y, x, w, bias, n, k, stream);
    case 3: return launch_gemv<T, F, 3>(y, x, w, bias, n, k, stream);
    case 4: return launch_gemv<T, F, 4>(y, x, w, bias, n, k, stream);
    case 5: return launch_gemv<T, F, 5>(y, x, w, bias, n, k, stream);
    case 6: return launch_gemv<T, F, 6>(y, x, w, bias, n, k, stream);
    case 7: return launch_gemv<T, F, 7>(y, x, w, bias, n, k, stream);
    case 8: return launch_gemv<T, F, 8>(y, x, w, bias, n, k, stream);
  }
  return cudaErrorInvalidValue;
}

// --- quantize / dequantize -------------------------------------------------------------------

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Per-row formats: a block per row finds |w|max, then writes q = round(w / scale).
template <typename T, WeightFormat F>
__global__ void quantize_per_row_kernel(const T* w, int k, uint8_t* data, float* scales) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const T* w_row = w + static_cast<int64_t>(row) * k;
  float local = 0.f;
  for (int e = threadIdx.x; e < k; e += blockDim.x) local = fmaxf(local, fabsf(to_float(w_row[e])));
  local = warp_max(local);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = local;
  __syncthreads();
  float absmax = 0.f;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) absmax = fmaxf(absmax, scratch[i]);
  constexpr float kLargest = F == WeightFormat::kInt8 ? 127.f : 448.f;
  const float scale = absmax / kLargest;
  const float inverse = scale > 0.f ? 1.f / scale : 0.f;
  if (threadIdx.x == 0) scales[row] = scale;
  uint8_t* out = data + static_cast<int64_t>(row) * k;
  for (int e = threadIdx.x; e < k; e += blockDim.x) {
    const float v = to_float(w_row[e]) * inverse;
    if constexpr (F == WeightFormat::kInt8) {
      out[e] = static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(rintf(v), -127.f), 127.f)));
    } else {
      out[e] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
  }
}

// int4_g128: a warp per group (4 weights a lane), scale = (max - min) / 15.
template <typename T>
__global__ void quantize_int4_kernel(const T* w, int n, int k, uint8_t* data, float* scales) {
  const int groups = (k + kInt4GroupSize - 1) / kInt4GroupSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (warp >= static_cast<int64_t>(n) * groups) return;
  const int lane = threadIdx.x & 31;
  const int row = static_cast<int>(warp / groups);
  const int group = static_cast<int>(warp % groups);
  const int64_t base = static_cast<int64_t>(row) * k + static_cast<int64_t>(group) * kInt4GroupSize;
  const int size = min(kInt4GroupSize, k - group * kInt4GroupSize);  // a multiple of 32
  float v[4];
  float lo = INFINITY, hi = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int e = lane * 4 + j;
    v[j] = e < size ? to_float(w[base + e]) : 0.f;
    if (e < size) {
      lo = fminf(lo, v[j]);
      hi = fmaxf(hi, v[j]);
    }
  }
  lo = warp_min(lo);
  hi = warp_max(hi);
  const float scale = (hi - lo) / 15.f;
  const float inverse = scale > 0.f ? 1.f / scale : 0.f;
  if (lane == 0) {
    scales[static_cast<int64_t>(row) * groups + group] = scale;
    scales[static_cast<int64_t>(n) * groups + static_cast<int64_t>(row) * groups + group] = lo;
  }
  if (lane * 4 >= size) return;
  uint32_t q[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) q[j] = static_cast<uint32_t>(fminf(fmaxf(rintf((v[j] - lo) * inverse), 0.f), 15.f));
  uint8_t* out = data + base / 2 + lane * 2;
  out[0] = static_cast<uint8_t>(q[0] | (q[1] << 4));
  out[1] = static_cast<uint8_t>(q[2] | (q[3] << 4));
}

template <typename T, WeightFormat F>
__global__ void dequantize_kernel(const uint8_t* data, const float* scales, int n, int k, T* out) {
  const int64_t total = static_cast<int64_t>(n) * k;
  const int groups = (k + kInt4GroupSize - 1) / kInt4GroupSize;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / k;
    float v;
    if constexpr (F == WeightFormat::kInt8) {
      v = static_cast<float>(static_cast<int8_t>(data[i])) * scales[row];
    } else if constexpr (F == WeightFormat::kFp8E4M3) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(data[i], __NV_E4M3);
      v = __half2float(__half(h)) * scales[row];
    } else {
      const int64_t g = row * groups + (i % k) / kInt4GroupSize;
      const uint32_t q = (data[i / 2] >> (4 * (i & 1))) & 0xF;
      v = static_cast<float>(q) * scales[g] + scales[static_cast<int64_t>(n) * groups + g];
    }
    out[i] = from_float<T>(v);
  }
}

template <typename Fn>
cudaError_t dispatch_format(WeightFormat format, Fn&& fn) {
  switch (format) {
    case WeightFormat::kInt8: return fn(std::integral_constant<WeightFormat, WeightFormat::kInt8>{});
    case WeightFormat::kInt4G128: return fn(std::integral_constant<WeightFormat, WeightFormat::kInt4G128>{});
    case WeightFormat::kFp8E4M3: return fn(std::integral_constant<WeightFormat, WeightFormat::kFp8E4M3>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kInt4G128: return "int4_g128";
    case WeightFormat::kFp8E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

size_t quantized_data_bytes(WeightFormat format, int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || k % 16 != 0) return 0;
  if (format == WeightFormat::kInt4G128) return k % 32 == 0 ? static_cast<size_t>(n * k / 2) : 0;
  return static_cast<size_t>(n * k);
}

size_t quantized_scale_bytes(WeightFormat format, int64_t n, int64_t k) {
  if (quantized_data_bytes(format, n, k) == 0) return 0;
  if (format == WeightFormat::kInt4G128) return static_cast<size_t>(2 * n * groups_per_row(k)) * sizeof(float);
  return static_cast<size_t>(n) * sizeof(float);
}

size_t quantized_weight_bytes(WeightFormat format, int64_t n, int64_t k) {
  const size_t data = quantized_data_bytes(format, n, k);
  return data == 0 ? 0 : align16(data) + quantized_scale_bytes(format, n, k);
}

cudaError_t quantize_weight(DType dtype, const void* w, int n, int k, WeightFormat format, void* out,
                            cudaStream_t stream) {
  if (quantized_weight_bytes(format, n, k) == 0 || !is_aligned16(out)) return cudaErrorInvalidValue;
  auto* data = static_cast<uint8_t*>(out);
  auto* scales = reinterpret_cast<float*>(data + align16(quantized_data_bytes(format, n, k)));
  if (dtype != DType::kBF16) return cudaErrorInvalidValue;
  const auto* in = static_cast<const Bf16*>(w);
  return dispatch_format(format, [&](auto f) {
    constexpr WeightFormat F = decltype(f)::value;
    if constexpr (F == WeightFormat::kInt4G128) {
      const int64_t warps = static_cast<int64_t>(n) * groups_per_row(k);
      quantize_int4_kernel<Bf16><<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream>>>(in, n, k, data,
                                                                                                        scales);
    } else {
      quantize_per_row_kernel<Bf16, F><<<static_cast<unsigned>(n), 256, 0, stream>>>(in, k, data, scales);
    }
    return cudaGetLastError();
  });
}

cudaError_t dequantize_weight(DType dtype, const void* quantized, int n, int k, WeightFormat format, void* out,
                              cudaStream_t stream) {
  if (quantized_weight_bytes(format, n, k) == 0) return cudaErrorInvalidValue;
  const auto* data = static_cast<const uint8_t*>(quantized);
  const auto* scales = reinterpret_cast<const float*>(data + align16(quantized_data_bytes(format, n, k)));
  const int64_t total = static_cast<int64_t>(n) * k;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65536));
  if (dtype != DType::kBF16) return cudaErrorInvalidValue;
  return dispatch_format(format, [&](auto f) {
    dequantize_kernel<Bf16, decltype(f)::value><<<blocks, 256, 0, stream>>>(data, scales, n, k, static_cast<Bf16*>(out));
    return cudaGetLastError();
  });
}

bool quantized_gemv_supported(WeightFormat format, int m, int n, int k, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxM && quantized_weight_bytes(format, n, k) > 0 && is_aligned16(x) && is_aligned16(w);
}

cudaError_t quantized_gemv(DType dtype, WeightFormat format, void* y, const void* x, const void* w,
                           const void* bias, int m, int n, int k, cudaStream_t stream) {
  if (dtype != DType::kBF16 || !quantized_gemv_supported(format, m, n, k, x, w)) return cudaErrorInvalidValue;
  return dispatch_format(format, [&](auto f) {
    return launch_gemv_m<Bf16, decltype(f)::value>(static_cast<Bf16*>(y), static_cast<const Bf16*>(x), w,
                                                   static_cast<const Bf16*>(bias), m, n, k, stream);
  });
}

}  // namespace tessera::kernels::cuda
