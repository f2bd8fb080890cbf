// kernels/cuda/gemm/quantized_weights.cu: quantization at load, dequantization for the cuBLASLt
// path, and the decode GEMV over quantized weights; the only place their templates are instantiated.
//
// The int8 / fp8 GEMV has gemv.cu's two kernels with other inner steps. A vector holds 16 weights:
//   - the row-streaming kernel (gemv_rows.cuh) expands them to fp32 8 at a time and multiplies in
//     fp32;
//   - the tensor-core kernel (gemv_mma.cuh) expands them to bf16 pairs, exactly (|int8| <= 127 and
//     every e4m3 value are bf16 values), for m16n8k16 MMAs. It runs from tensor_core_min_rows rows,
//     and at every m for a caller that needs the same bits at any m (gemv.h).
// int8 is expanded by the 2^23 trick: a byte permute puts the value in the low mantissa byte of
// 8388608.0f, and subtracting 2^23 leaves the value, exactly. Per-row scales are applied once at the
// end.
// The int4_g128 GEMV runs on the tensor cores; its section says how.
// quantized_gemv_silu_mul is the same kernels with another epilogue: a weight in pairs order (rows
// 2j and 2j + 1 are gate and up row j) has each pair in one warp (R even) or one tile (16 rows), and
// the up sum reaches its gate's thread by one shuffle.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/activation/activation.cuh"
#include "kernels/cuda/common/device.cuh"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/gemv_mma.cuh"
#include "kernels/cuda/gemm/gemv_rows.cuh"
#include "kernels/cuda/gemm/quantized_weights.h"

namespace tessera::kernels::cuda {
namespace {

// Quantized weights serve bf16 models (an LLM's dtype: auto), the only dtype instantiated here.
using Bf16 = __nv_bfloat16;

using gemv_rows::evict_first_policy;
using gemv_rows::kThreads;
using gemv_rows::kWarpsPerBlock;
using gemv_rows::load_weight;

constexpr int64_t groups_per_row(int64_t k) { return (k + kInt4GroupSize - 1) / kInt4GroupSize; }

constexpr size_t align16(size_t bytes) { return (bytes + 15) & ~size_t{15}; }

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

// Blocks an SM must hold: expanding weights is several instructions per byte (int4 most), so small
// m needs more warps than gemv.cu's to keep the SM's pipes busy between dependent operations.
template <int M>
constexpr int min_blocks_per_sm() {
  return M <= 2 ? 4 : 2;
}

// kSiluMul: y is [M, n / 2], y[i, j] = silu(row 2j's output) · row 2j + 1's (bias is null).
template <typename T, WeightFormat F, int M, int R, bool kSiluMul>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<M>())
    quantized_gemv_kernel(T* y, const T* x, const uint4* __restrict__ data, const float* __restrict__ scales,
                          const T* __restrict__ bias, int n, int k) {
  using Fmt = Format<F>;
  constexpr int kChunks = Fmt::kPerVector / 8;  // 8-weight chunks per vector
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (row0 >= n) return;
  const int kv = k / Fmt::kPerVector;  // vectors per row
  const int kx = k >> 3;               // 16-byte x vectors per row of x
  const uint4* x_vec = reinterpret_cast<const uint4*>(x);
  auto fma_vector = [&](const auto& wv, int u, int v, float(&acc)[M][R]) {
    const int vec = v + u * 32 + lane;  // this lane's vector index within the row
    float dot[M][R];                    // Σ x·q over this vector
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) dot[i][r] = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) Fmt::chunk(wv[r][u], c, wf[r]);
      gemv_rows::fma_x_rows<T, M, R>([&](int i) { return x_vec[static_cast<int64_t>(i) * kx + vec * kChunks + c]; },
                                     wf, dot);
    }
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[i][r] += dot[i][r];
  };
  const float out = gemv_rows::warp_row_sums<M, R>(data, row0, n, kv, lane, fma_vector);
  gemv_rows::store_row_sums<T, M, R, kSiluMul>(y, out, bias, row0, n, lane,
                                               [&](float sum, int row) { return sum * scales[row]; });
}

// The 16 weights of a vector as 8 bf16 pairs, for the tensor-core kernel.
template <WeightFormat F>
struct MmaWeights {
  static constexpr int kValues = 16;
  __device__ __forceinline__ static void pairs(const uint4& v, uint32_t (&out)[8]) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float w[8];
      Format<F>::chunk(v, c, w);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(w[2 * e], w[2 * e + 1]);
        out[4 * c + e] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    }
  }
};

template <WeightFormat F, bool kSiluMul>
__global__ void __launch_bounds__(gemv_mma::kThreads)
    quantized_gemv_mma_kernel(Bf16* y, const Bf16* x, const uint4* __restrict__ data, const float* __restrict__ scales,
                              const Bf16* __restrict__ bias, int m, int n, int k) {
  gemv_mma::gemv<Bf16, MmaWeights<F>, kSiluMul>(y, x, data, bias, m, n, k,
                                                [&](float sum, int row) { return sum * scales[row]; });
}

// The fewest rows the tensor-core kernel serves by default: below, expanding 16 weights a vector to
// bf16 costs more issue slots than the row-streaming kernel's fp32 FMAs (H100, 7B linears, GB/s at
// 2 / 4 / 8 rows: int8 2,255 / 2,246 / 2,220 against 2,625 / 1,944 / 1,384; fp8 1,809 / 1,804 / 1,786
// against 2,596 / 2,048 / 1,407). Each is one past a rung of the decode batch ladder (1, 2, 4, 8), so
// a batch and the rung its CUDA graph pads it to take the same kernel and give the same bits: int8
// from 3 rows (the two kernels about even there), fp8 from 5.
template <WeightFormat F>
constexpr int tensor_core_min_rows() {
  return F == WeightFormat::kInt8 ? 3 : 5;
}

// The row-streaming kernel below tensor_core_min_rows unless the caller needs the same bits at every
// m; the tensor-core kernel otherwise.
template <WeightFormat F, bool kSiluMul>
cudaError_t launch_gemv_m(Bf16* y, const Bf16* x, const void* w, const Bf16* bias, int m, int n, int k,
                          GemvRowBits row_bits, cudaStream_t stream) {
  const auto* data = static_cast<const uint4*>(w);
  const auto* scales = reinterpret_cast<const float*>(static_cast<const char*>(w) + align16(quantized_data_bytes(F, n, k)));
  if (gemv_mma::takes(m, tensor_core_min_rows<F>(), row_bits))
    return gemv_mma::launch(quantized_gemv_mma_kernel<F, kSiluMul>, n, stream, y, x, data, scales, bias, m, n, k);
  auto kernel_of = [](auto m_tag, auto r_tag) {
    return quantized_gemv_kernel<Bf16, F, decltype(m_tag)::value, decltype(r_tag)::value, kSiluMul>;
  };
  return gemv_rows::launch_for_m(m, n, stream, kernel_of, y, x, data, scales, bias, n, k);
}

// --- int4_g128: tensor-core GEMV ------------------------------------------------------------
//
// The layout (see the header) stores each 16 x 64 atom as the 32 lanes' A fragments of four
// mma.m16n8k16 steps, 16 bytes a lane (a 32-bit word a step), and a tile's atoms one after another,
// so lane (g, t) = (lane / 4, lane % 4) of a block owning a 16-row tile loads 16 bytes per 64 k, and
// the 32 lanes read 512 contiguous bytes. Its B fragments are x row g (the activation rows are the
// mma's N) at k 2t, 2t + 1 and 2t + 8, 2t + 9 of each step.
//
// A nibble q is OR-ed into the mantissa of bf16 128.0 (0x4300), giving 128 + q exactly with no
// int -> float conversion: one LOP3 per two weights, nibbles i and i + 4 of a word, which the layout
// puts in fragment register i. The tensor cores sum (128 + q) · x in fp32, and a second mma with an
// A of ones sums x over the group; per group and row, y += scale · Σ(128 + q)·x + (min - 128 · scale)
// · Σx, which is q · scale + min folded out of the inner loop. Columns past m are 0.
//
// The B fragments' k are not contiguous for a lane (2t, 2t + 1, 2t + 8, 2t + 9 of each step), so a
// warp stages its group's x rows in shared memory and reads them back with ldmatrix, which hands out
// exactly those pairs.
//
// A block's 16 warps take its groups round-robin, one group (two atoms) in flight per warp, and
// add their partial sums through shared memory. Splitting k this finely was the fastest of the shapes
// tried on the H100 (4 and 8 warps a tile, several groups in flight a warp, a cp.async ring in
// persistent blocks): a decode GEMV is bound by how many loads are in flight, and a warp's loads wait
// on its previous group's math.
constexpr int kTileRows = 16;
constexpr int kAtomK = 64;  // the k of an atom: four mma steps
constexpr int kAtomsPerGroup = kInt4GroupSize / kAtomK;
constexpr int kStepsPerGroup = kInt4GroupSize / 16;
constexpr int kInt4Warps = 16;
constexpr int kInt4Threads = 32 * kInt4Warps;
constexpr uint32_t kBf16Magic2 = 0x43004300u;  // bf16 128.0, twice
constexpr uint32_t kBf16One2 = 0x3F803F80u;    // bf16 1.0, twice

__host__ __device__ constexpr int64_t row_tiles(int64_t n) { return (n + kTileRows - 1) / kTileRows; }
__host__ __device__ constexpr int64_t k_atoms(int64_t k) { return (k + kAtomK - 1) / kAtomK; }

// Where the scales and the minimums start (the header's layout), as bf16 arrays [groups, n].
constexpr size_t int4_scales_offset(int64_t n, int64_t k) {
  return static_cast<size_t>(row_tiles(n) * k_atoms(k) * 512);
}
// Each of the two parts' bytes: a bf16 per row and group, padded to 16.
constexpr size_t int4_group_part_bytes(int64_t n, int64_t k) {
  return align16(static_cast<size_t>(n * groups_per_row(k)) * sizeof(Bf16));
}
constexpr size_t int4_mins_offset(int64_t n, int64_t k) { return int4_scales_offset(n, k) + int4_group_part_bytes(n, k); }

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One word of the layout -> the A fragment of one mma step as bf16 (128 + q): register i takes
// nibbles i (low half) and 4 + i (high half).
// (One LOP3 each: (w & mask) | magic, written out because the compiler splits an AND and an OR of
// two immediates into two.)
__device__ __forceinline__ void int4_word_to_fragment(uint32_t word, uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(a[i]) : "r"(word >> (4 * i)), "n"(0x000F000F), "r"(kBf16Magic2));
}

__device__ __forceinline__ uint4 load_activation(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// A row's scale and minimum for one group, as loaded: converted only where the group's sums are
// scaled, so that the warp does not wait for them before its x loads go out.
struct Int4RowScale {
  Bf16 scale, minimum;
};

__device__ __forceinline__ Int4RowScale int4_row_scale(const Bf16* scales, const Bf16* mins, int64_t index) {
  return {scales[index], mins[index]};
}

// acc (a row's two columns) += scale · Σ(128 + q)·x + (min - 128 · scale) · Σx.
__device__ __forceinline__ void int4_scale_sums(Int4RowScale s, const float* dot, const float* xsum, float* acc) {
  const float scale = __bfloat162float(s.scale), offset = fmaf(-128.f, scale, __bfloat162float(s.minimum));
  acc[0] += fmaf(scale, dot[0], offset * xsum[0]);
  acc[1] += fmaf(scale, dot[1], offset * xsum[1]);
}

// One group of a tile: acc (rows g and g + 8, columns 2t and 2t + 1) += the group's dequantized
// weights times x, from the lane's 16 bytes of each of the group's two atoms (a word a step), the
// rows' scales, and its x words (two a step; 0 past m or k).
__device__ __forceinline__ void int4_group_mma(const uint4 (&w)[kAtomsPerGroup], Int4RowScale lo, Int4RowScale hi,
                                               const uint32_t (&xw)[2 * kStepsPerGroup], float (&acc)[4]) {
  const uint32_t ones[4] = {kBf16One2, kBf16One2, kBf16One2, kBf16One2};
  const uint32_t words[kStepsPerGroup] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
  float dot[4] = {0.f, 0.f, 0.f, 0.f};   // Σ (128 + q) · x
  float xsum[4] = {0.f, 0.f, 0.f, 0.f};  // Σ x
#pragma unroll
  for (int j = 0; j < kStepsPerGroup; ++j) {
    uint32_t a[4];
    int4_word_to_fragment(words[j], a);
    mma_bf16_16816(dot, a, xw[2 * j], xw[2 * j + 1]);
    mma_bf16_16816(xsum, ones, xw[2 * j], xw[2 * j + 1]);
  }
  int4_scale_sums(lo, dot, xsum, acc);
  int4_scale_sums(hi, dot + 2, xsum + 2, acc + 2);
}

// kSiluMul: y is [m, n / 2], y[i, j] = silu(row 2j's output) · row 2j + 1's (bias is null).
template <bool kSiluMul>
__global__ void __launch_bounds__(kInt4Threads, 2)
    int4_gemv_kernel(Bf16* y, const Bf16* x, const uint4* __restrict__ data, const Bf16* __restrict__ scales,
                     const Bf16* __restrict__ mins, const Bf16* __restrict__ bias, int m, int n, int k, int groups) {
  // Each warp's x of its group, row-major (x row c's 128 values at c * kStageRow words), read back
  // as mma B fragments by ldmatrix; the 16-byte pad puts the 8 rows an ldmatrix reads on distinct
  // banks. After the loop the same memory holds the partial sums.
  constexpr int kStageRow = kInt4GroupSize / 2 + 4;
  constexpr int kStageWords = kGemvMaxM * kStageRow;
  static_assert(kStageWords * kInt4Warps >= kInt4Warps * 32 * 4, "the partial sums reuse the staging memory");
  __shared__ __align__(16) uint32_t shared[kInt4Warps * kStageWords];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int tile = blockIdx.x;
  uint32_t* stage = shared + warp * kStageWords;
  const int column = lane >> 2;  // the activation row this lane's B fragments come from
  const uint64_t policy = evict_first_policy();
  const int atoms = static_cast<int>(k_atoms(k));
  const uint4* w_lane = data + static_cast<int64_t>(tile) * atoms * 32 + lane;
  // The padding rows of the last tile (q = 0) take row n - 1's scales; their sums are never stored.
  const int row_lo = min(tile * kTileRows + column, n - 1), row_hi = min(tile * kTileRows + column + 8, n - 1);

  uint4 w[kAtomsPerGroup];
  uint32_t xw[2 * kStepsPerGroup];
  Int4RowScale sc_lo, sc_hi;
  auto load_weights = [&](int g) {
#pragma unroll
    for (int u = 0; u < kAtomsPerGroup; ++u) {
      const int atom = g * kAtomsPerGroup + u;
      w[u] = atom < atoms ? load_weight(w_lane + atom * 32, policy) : make_uint4(0u, 0u, 0u, 0u);
    }
    sc_lo = int4_row_scale(scales, mins, static_cast<int64_t>(g) * n + row_lo);
    sc_hi = int4_row_scale(scales, mins, static_cast<int64_t>(g) * n + row_hi);
  };
  // x's rows of group g into the stage (k past the end as 0), then the lane's B fragments of the
  // group's 8 mma steps by 4 ldmatrix.x4: matrix q of call p is rows 0..7 at k 32p + 8q, so lane
  // (g, t) receives row g's k 32p + 8q + 2t, +1, which is step 2p + q / 2's b0 (q even) or b1.
  // Rows past m hold stale values; they feed only the mma columns past m, which are never stored.
  const uint32_t stage_address = static_cast<uint32_t>(__cvta_generic_to_shared(stage)) +
                                 4 * ((lane & 7) * kStageRow + 4 * (lane >> 3));
  auto load_x = [&](int g) {
    __syncwarp();  // the previous group's stage has been read
    for (int i = lane; i < m * (kInt4GroupSize / 8); i += 32) {
      const int c = i / (kInt4GroupSize / 8), v = i % (kInt4GroupSize / 8);
      const int64_t e = static_cast<int64_t>(g) * kInt4GroupSize + 8 * v;
      reinterpret_cast<uint4*>(stage + c * kStageRow)[v] =
          e < k ? load_activation(reinterpret_cast<const uint4*>(x + c * static_cast<int64_t>(k) + e))
                : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();
#pragma unroll
    for (int p = 0; p < 4; ++p)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(xw[4 * p]), "=r"(xw[4 * p + 1]), "=r"(xw[4 * p + 2]), "=r"(xw[4 * p + 3])
                   : "r"(stage_address + 64 * p));
  };

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (warp < groups) load_weights(warp);  // weights are parameters: no need to wait for the kernel before
  pdl_wait_previous();
  pdl_launch_dependents();
  for (int g = warp; g < groups; g += kInt4Warps) {
    if (g != warp) load_weights(g);
    load_x(g);
    int4_group_mma(w, sc_lo, sc_hi, xw, acc);
  }

  // acc holds rows lane/4 (acc[0..1]) and lane/4 + 8 (acc[2..3]) at columns 2t and 2t + 1.
  __syncthreads();  // every warp is done with its stage
  auto partial = reinterpret_cast<float(*)[32 * 4]>(shared);
#pragma unroll
  for (int j = 0; j < 4; ++j) partial[warp][lane * 4 + j] = acc[j];
  __syncthreads();
  if (threadIdx.x < 32 * 4) {
    const int i = threadIdx.x;
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kInt4Warps; ++v) sum += partial[v][i];
    const int from_lane = i >> 2, j = i & 3;
    const int row = tile * kTileRows + (from_lane >> 2) + 8 * (j >> 1);
    const int col = 2 * (from_lane & 3) + (j & 1);
    if constexpr (kSiluMul) {
      // Row + 1 is thread i + 16's (from_lane + 4), in the same warp exactly when row is even (bit 2
      // of from_lane clear, so i % 32 < 16).
      const float up = __shfl_down_sync(0xffffffffu, sum, 16);
      if (col < m && row < n && row % 2 == 0)
        y[static_cast<int64_t>(col) * (n / 2) + row / 2] = from_float<Bf16>(silu(sum) * up);
    } else if (col < m && row < n) {
      if (bias != nullptr) sum += to_float(bias[row]);
      y[static_cast<int64_t>(col) * n + row] = from_float<Bf16>(sum);
    }
  }
}

template <bool kSiluMul>
cudaError_t launch_int4_gemv(Bf16* y, const Bf16* x, const void* w, const Bf16* bias, int m, int n, int k,
                             cudaStream_t stream) {
  const Int4G128Parts parts = int4_g128_parts(w, n, k);
  return launch_with_pdl(int4_gemv_kernel<kSiluMul>, dim3(static_cast<unsigned>(row_tiles(n))), dim3(kInt4Threads), 0,
                         stream, y, x, static_cast<const uint4*>(parts.data), static_cast<const Bf16*>(parts.scales),
                         static_cast<const Bf16*>(parts.mins), bias, m, n, k, static_cast<int>(groups_per_row(k)));
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

// int4_g128, pass 1: a warp per (row, group) (4 weights a lane), min and scale = (max - min) / 15
// in bf16. The minimum is rounded down and the scale up (from the rounded minimum), so the stored
// grid still spans [min, max].
template <typename T>
__global__ void int4_scales_kernel(const T* w, int n, int k, int groups, Bf16* scales, Bf16* mins) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (warp >= static_cast<int64_t>(n) * groups) return;
  const int lane = threadIdx.x & 31;
  const int row = static_cast<int>(warp / groups);
  const int group = static_cast<int>(warp % groups);
  const int64_t base = static_cast<int64_t>(row) * k + static_cast<int64_t>(group) * kInt4GroupSize;
  const int size = min(kInt4GroupSize, k - group * kInt4GroupSize);  // a multiple of 32
  float lo = INFINITY, hi = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int e = lane * 4 + j;
    if (e < size) {
      const float v = to_float(w[base + e]);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
  }
  lo = warp_min(lo);
  hi = warp_max(hi);
  if (lane == 0) {
    const Bf16 minimum = __float2bfloat16_rd(lo);
    const int64_t at = static_cast<int64_t>(group) * n + row;
    scales[at] = __float2bfloat16_ru(fmaxf((hi - __bfloat162float(minimum)) / 15.f, 0.f));
    mins[at] = minimum;
  }
}

// Where the 32-bit word `word` of the layout lies: its first row and k (the fragment's row g and
// k 2t of its mma step); its nibbles cover rows +0 / +8 and k +0, +1, +8, +9 (the header's order).
struct Int4WordOrigin {
  int64_t row, e;
};
__device__ __forceinline__ Int4WordOrigin int4_word_origin(int64_t word, int64_t atoms) {
  const int64_t atom = word / 128;
  const int lane = static_cast<int>(word / 4 % 32), step = static_cast<int>(word % 4);
  return {(atom / atoms) * kTileRows + lane / 4, (atom % atoms) * kAtomK + 16 * step + 2 * (lane % 4)};
}

// int4_g128, pass 2: a thread per 32-bit word of the layout, its 8 nibbles quantized against pass 1's
// scales; the padding (rows past n, k past the end) is q = 0.
template <typename T>
__global__ void int4_pack_kernel(const T* w, int n, int k, const Bf16* scales, const Bf16* mins, uint32_t* data) {
  const int64_t word = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (word >= row_tiles(n) * k_atoms(k) * 128) return;
  const auto [row0, e0] = int4_word_origin(word, k_atoms(k));
  uint32_t packed = 0;
#pragma unroll
  for (int nibble = 0; nibble < 8; ++nibble) {
    // The header's nibble order: bit 0 the row half, bit 1 the k half, bit 2 the k parity.
    const int64_t row = row0 + 8 * (nibble & 1);
    const int64_t e = e0 + 8 * ((nibble >> 1) & 1) + (nibble >> 2);
    if (row >= n || e >= k) continue;
    const int64_t at = (e / kInt4GroupSize) * n + row;
    const float scale = __bfloat162float(scales[at]);
    const float inverse = scale > 0.f ? 1.f / scale : 0.f;
    const float v = to_float(w[row * k + e]);
    const uint32_t q =
        static_cast<uint32_t>(fminf(fmaxf(rintf((v - __bfloat162float(mins[at])) * inverse), 0.f), 15.f));
    packed |= q << (4 * nibble);
  }
  data[word] = packed;
}

// int8 and fp8_e4m3 expanded to T: a thread per 16 bytes (16 weights of one row, k being a multiple
// of 16), written as two 16-byte vectors, so the pass streams at copy speed.
template <typename T, WeightFormat F>
__global__ void dequantize_per_row_kernel(const uint8_t* data, const float* scales, int n, int k, T* out) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int chunks_per_row = k / 16;
  if (chunk >= static_cast<int64_t>(n) * chunks_per_row) return;
  const float scale = scales[chunk / chunks_per_row];
  const uint4 in = reinterpret_cast<const uint4*>(data)[chunk];
  const auto* bytes = reinterpret_cast<const uint8_t*>(&in);
  alignas(16) T values[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float v;
    if constexpr (F == WeightFormat::kInt8) {
      v = static_cast<float>(static_cast<int8_t>(bytes[i]));
    } else {
      v = __half2float(__half(__nv_cvt_fp8_to_halfraw(bytes[i], __NV_E4M3)));
    }
    values[i] = from_float<T>(v * scale);
  }
  auto* dst = reinterpret_cast<uint4*>(out + chunk * 16);
  dst[0] = reinterpret_cast<const uint4*>(values)[0];
  dst[1] = reinterpret_cast<const uint4*>(values)[1];
}

// int4_g128 expanded to T: a thread per 32-bit word of the layout (rows r and r + 8, two pairs of
// consecutive k each), written as four pairs.
template <typename T>
__global__ void dequantize_int4_kernel(const uint32_t* data, const Bf16* scales, const Bf16* mins, int n, int k,
                                       T* out) {
  const int64_t word = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (word >= row_tiles(n) * k_atoms(k) * 128) return;
  const auto [row0, e0] = int4_word_origin(word, k_atoms(k));
  const uint32_t packed = data[word];
#pragma unroll
  for (int pair = 0; pair < 4; ++pair) {  // nibbles pair and pair + 4: (row half, k half) = bits of pair
    const int64_t row = row0 + 8 * (pair & 1), e = e0 + 8 * (pair >> 1);
    if (row >= n || e >= k) continue;
    const int64_t at = (e / kInt4GroupSize) * n + row;
    const float scale = __bfloat162float(scales[at]), minimum = __bfloat162float(mins[at]);
    const float lo = static_cast<float>((packed >> (4 * pair)) & 0xFu) * scale + minimum;
    const float hi = static_cast<float>((packed >> (4 * pair + 16)) & 0xFu) * scale + minimum;
    *reinterpret_cast<typename DTypeTraits<T>::pair*>(out + row * k + e) = DTypeTraits<T>::from_float2(lo, hi);
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
  // int4_g128: whole 16 x 64 atoms (the padding q = 0), two values a byte.
  if (format == WeightFormat::kInt4G128) return k % 32 == 0 ? int4_scales_offset(n, k) : 0;
  return static_cast<size_t>(n * k);
}

size_t quantized_scale_bytes(WeightFormat format, int64_t n, int64_t k) {
  if (quantized_data_bytes(format, n, k) == 0) return 0;
  if (format == WeightFormat::kInt4G128)  // bf16 scales, then bf16 minimums, each 16-byte aligned
    return 2 * int4_group_part_bytes(n, k);
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
  void* scales = data + align16(quantized_data_bytes(format, n, k));
  if (dtype != DType::kBF16) return cudaErrorInvalidValue;
  const auto* in = static_cast<const Bf16*>(w);
  return dispatch_format(format, [&](auto f) {
    constexpr WeightFormat F = decltype(f)::value;
    if constexpr (F == WeightFormat::kInt4G128) {
      const int groups = static_cast<int>(groups_per_row(k));
      const int64_t warps = static_cast<int64_t>(n) * groups;
      auto* group_scales = reinterpret_cast<Bf16*>(data + int4_scales_offset(n, k));
      auto* group_mins = reinterpret_cast<Bf16*>(data + int4_mins_offset(n, k));
      int4_scales_kernel<Bf16><<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream>>>(
          in, n, k, groups, group_scales, group_mins);
      const int64_t words = row_tiles(n) * k_atoms(k) * 128;
      int4_pack_kernel<Bf16><<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(
          in, n, k, group_scales, group_mins, reinterpret_cast<uint32_t*>(data));
    } else {
      quantize_per_row_kernel<Bf16, F>
          <<<static_cast<unsigned>(n), 256, 0, stream>>>(in, k, data, static_cast<float*>(scales));
    }
    return cudaGetLastError();
  });
}

cudaError_t dequantize_weight(DType dtype, const void* quantized, int n, int k, WeightFormat format, void* out,
                              cudaStream_t stream) {
  if (quantized_weight_bytes(format, n, k) == 0 || !is_aligned16(out) || !is_aligned16(quantized))
    return cudaErrorInvalidValue;
  const auto* data = static_cast<const uint8_t*>(quantized);
  const void* scales = data + align16(quantized_data_bytes(format, n, k));
  if (dtype != DType::kBF16) return cudaErrorInvalidValue;
  auto* y = static_cast<Bf16*>(out);
  constexpr int kThreads = 256;
  return dispatch_format(format, [&](auto f) {
    constexpr WeightFormat F = decltype(f)::value;
    if constexpr (F == WeightFormat::kInt4G128) {
      const int64_t words = row_tiles(n) * k_atoms(k) * 128;
      const Int4G128Parts parts = int4_g128_parts(quantized, n, k);
      dequantize_int4_kernel<Bf16><<<static_cast<unsigned>((words + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          static_cast<const uint32_t*>(parts.data), static_cast<const Bf16*>(parts.scales),
          static_cast<const Bf16*>(parts.mins), n, k, y);
    } else {
      const int64_t chunks = static_cast<int64_t>(n) * (k / 16);
      dequantize_per_row_kernel<Bf16, F><<<static_cast<unsigned>((chunks + kThreads - 1) / kThreads), kThreads, 0,
                                            stream>>>(data, static_cast<const float*>(scales), n, k, y);
    }
    return cudaGetLastError();
  });
}

cudaError_t quantize_activations(DType dtype, WeightFormat format, const void* x, int m, int k, void* out,
                                 cudaStream_t stream) {
  // The per-row kernel of the weights: one block per row, so its cost is a read of x twice and a
  // write of half or a quarter of it, small beside the GEMM that follows for the m it serves.
  if (format == WeightFormat::kInt4G128) return cudaErrorInvalidValue;
  if (m <= 0) return m == 0 ? cudaSuccess : cudaErrorInvalidValue;
  return quantize_weight(dtype, x, m, k, format, out, stream);
}

Int4G128Parts int4_g128_parts(const void* quantized, int n, int k) {
  const auto* base = static_cast<const uint8_t*>(quantized);
  return {base, base + int4_scales_offset(n, k), base + int4_mins_offset(n, k)};
}

const float* quantized_row_scales(WeightFormat format, const void* quantized, int rows, int k) {
  if (format == WeightFormat::kInt4G128 || quantized_weight_bytes(format, rows, k) == 0) return nullptr;
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(quantized) +
                                        align16(quantized_data_bytes(format, rows, k)));
}

bool quantized_gemv_takes_tensor_cores(WeightFormat format, int m, GemvRowBits row_bits) {
  switch (format) {
    case WeightFormat::kInt8: return gemv_mma::takes(m, tensor_core_min_rows<WeightFormat::kInt8>(), row_bits);
    case WeightFormat::kFp8E4M3: return gemv_mma::takes(m, tensor_core_min_rows<WeightFormat::kFp8E4M3>(), row_bits);
    case WeightFormat::kInt4G128: return true;
  }
  return false;
}

bool quantized_gemv_supported(WeightFormat format, int m, int n, int k, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxM && quantized_weight_bytes(format, n, k) > 0 && is_aligned16(x) && is_aligned16(w);
}

cudaError_t quantized_gemv(DType dtype, WeightFormat format, void* y, const void* x, const void* w,
                           const void* bias, int m, int n, int k, GemvRowBits row_bits, cudaStream_t stream) {
  if (dtype != DType::kBF16 || !quantized_gemv_supported(format, m, n, k, x, w)) return cudaErrorInvalidValue;
  if (format == WeightFormat::kInt4G128)
    return launch_int4_gemv<false>(static_cast<Bf16*>(y), static_cast<const Bf16*>(x), w,
                                   static_cast<const Bf16*>(bias), m, n, k, stream);
  return dispatch_format(format, [&](auto f) {
    if constexpr (decltype(f)::value == WeightFormat::kInt4G128) {
      return cudaErrorInvalidValue;  // taken above
    } else {
      return launch_gemv_m<decltype(f)::value, false>(static_cast<Bf16*>(y), static_cast<const Bf16*>(x), w,
                                                      static_cast<const Bf16*>(bias), m, n, k, row_bits, stream);
    }
  });
}

cudaError_t quantized_gemv_silu_mul(DType dtype, WeightFormat format, void* out, const void* x, const void* w, int m,
                                    int n, int k, GemvRowBits row_bits, cudaStream_t stream) {
  if (dtype != DType::kBF16 || !quantized_gemv_supported(format, m, n, k, x, w) || n % 2 != 0)
    return cudaErrorInvalidValue;
  if (format == WeightFormat::kInt4G128)
    return launch_int4_gemv<true>(static_cast<Bf16*>(out), static_cast<const Bf16*>(x), w, nullptr, m, n, k, stream);
  return dispatch_format(format, [&](auto f) {
    if constexpr (decltype(f)::value == WeightFormat::kInt4G128) {
      return cudaErrorInvalidValue;  // taken above
    } else {
      return launch_gemv_m<decltype(f)::value, true>(static_cast<Bf16*>(out), static_cast<const Bf16*>(x), w,
                                                     nullptr, m, n, k, row_bits, stream);
    }
  });
}

}  // namespace tessera::kernels::cuda
