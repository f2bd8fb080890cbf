// kernels/cuda/gemm/quantized_weights.h: linear-layer weights stored in fewer bits than the
// activations, for decode, which is bound by streaming the weights once per token.
//
// Formats (w[n, k] is one linear layer's weight, a row per output):
//   int8      symmetric, one fp32 scale per row: w ≈ q · scale, q in [-127, 127]; row-major bytes;
//   int4_g128 asymmetric, groups of 128 along k (the last may be shorter), a bf16 scale and
//             minimum per group: w ≈ q · scale + min, q in [0, 15]; tiled nibbles (below);
//   fp8_e4m3  OCP e4m3, one fp32 scale per row: w ≈ fp8 · scale (|fp8| <= 448); row-major bytes.
// Data and scales live in one device allocation of quantized_weight_bytes(), the scales after the
// data at a 16-byte boundary, so a quantized weight is one buffer like any other.
//
// int4_g128's layout is the one CUTLASS's mixed-input GEMM reads shuffled (its
// compute_memory_reordering_atom for bf16, four mma steps an atom, values in order 0, 2, 4, 6, 1, 3,
// 5, 7), so that the GEMV and the GEMM share one copy. Rows come in tiles of 16 and k in atoms of 64
// (the padding is q = 0); each atom is 512 bytes, a tile's atoms in k order, then the next tile's.
// Inside an atom, lane l = 4 · (r % 8) + (e % 8) / 2 of the mma.m16n8k16 A fragment owns 16 bytes,
// a 32-bit word for each 16 k, and weight (r, e) is nibble (r % 16) / 8 + 4 · (e % 2) + 2 ·
// ((e % 16) / 8) of its word (bits 4i..4i+3 hold nibble i): nibbles i and i + 4 are fragment
// register i. So weight (r, e) is in word ((r / 16) · ceil(k / 64) + e / 64) · 128 + 4 · l +
// (e % 64) / 16. Then the scales, bf16 [groups, n] (scale (r, g) at g · n + r), and the minimums in
// the same shape, each part at a 16-byte boundary.
// bf16 rather than fp16 because the GEMM's bf16 tensor-core path multiplies them in without a
// conversion (fp16 scales cost it 20-30% on the H100), and bf16's exponent range needs no
// saturation or subnormals. The quantizer rounds the minimum down and the scale up, so that the
// stored grid min + q · scale still spans the group's [min, max] and every weight lies within half a
// stored step.
//
// quantized_gemv() computes y[m, n] = x[m, k] · dequant(w)ᵀ (+ bias) for m <= kGemvMaxM with fp32
// accumulation. Above that, int8 and fp8_e4m3 run as W8A8: quantize_activations() puts x in the
// weight's per-row form and GemmRunner::run_w8a8() (gemm.h) multiplies on the int8 or FP8 tensor
// cores; int4_g128 runs through GemmRunner::run_int4_g128(), which expands the nibbles in registers;
// dequantize_weight() expands w to the activation dtype for the cuBLASLt bf16 path (shapes those
// kernels do not take).
// Activations are bf16 (any other dtype: cudaErrorInvalidValue). Stateless and thread-safe; plain
// launches, so they can be captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/common/dtype.h"
#include "kernels/cuda/gemm/gemv.h"

namespace tessera::kernels::cuda {

enum class WeightFormat : int32_t { kInt8 = 0, kInt4G128 = 1, kFp8E4M3 = 2 };

const char* weight_format_name(WeightFormat format);
inline constexpr int kInt4GroupSize = 128;

// Byte sizes of the two parts and of the whole allocation; 0 for a shape the format cannot hold
// (k must be a multiple of 16, and of 32 for int4_g128). int4_g128's: data ceil(n/16) · ceil(k/64) ·
// 512 bytes, scales twice ceil(k/128) · n · 2 rounded up to 16.
size_t quantized_data_bytes(WeightFormat format, int64_t n, int64_t k);
size_t quantized_scale_bytes(WeightFormat format, int64_t n, int64_t k);
size_t quantized_weight_bytes(WeightFormat format, int64_t n, int64_t k);

// w (dtype, [n, k], device) -> out (quantized_weight_bytes, 16-byte aligned, device).
cudaError_t quantize_weight(DType dtype, const void* w, int n, int k, WeightFormat format, void* out,
                            cudaStream_t stream);
// The quantized weight back in the activation dtype: out [n, k]. Both buffers 16-byte aligned (the
// expansion moves whole vectors; cudaErrorInvalidValue otherwise).
cudaError_t dequantize_weight(DType dtype, const void* quantized, int n, int k, WeightFormat format, void* out,
                              cudaStream_t stream);

// Activations x [m, k] (bf16, 16-byte aligned rows) quantized as an int8 or fp8_e4m3 weight of m
// rows is: per row, scale = |x|max / 127 (or 448) and q = x / scale (rounded, saturating), into out
// of quantized_weight_bytes(format, m, k). k must be a multiple of 16, and int4_g128 is no activation
// format (cudaErrorInvalidValue).
cudaError_t quantize_activations(DType dtype, WeightFormat format, const void* x, int m, int k, void* out,
                                 cudaStream_t stream);
// The three parts of an int4_g128 weight of n x k (the layout above).
struct Int4G128Parts {
  const void* data;
  const void* scales;
  const void* mins;
};
Int4G128Parts int4_g128_parts(const void* quantized, int n, int k);

// The per-row scales of an int8 or fp8_e4m3 buffer of `rows` rows (weights or quantized activations).
const float* quantized_row_scales(WeightFormat format, const void* quantized, int rows, int k);

// Whether quantized_gemv() takes this call: 1 <= m <= kGemvMaxM, the shape holdable, x and the
// weight 16-byte aligned.
bool quantized_gemv_supported(WeightFormat format, int m, int n, int k, const void* x, const void* w);
// Whether quantized_gemv() runs m rows of this format on the tensor-core kernel (gemv.h's row_bits;
// int4_g128 always does).
bool quantized_gemv_takes_tensor_cores(WeightFormat format, int m, GemvRowBits row_bits);
// row_bits as gemv() (gemv.h); int4_g128 runs on the tensor cores at every m, so it ignores it.
cudaError_t quantized_gemv(DType dtype, WeightFormat format, void* y, const void* x, const void* w,
                           const void* bias, int m, int n, int k, GemvRowBits row_bits, cudaStream_t stream);
// The gate-up projection and SiLU·mul in one pass, as gemv_silu_mul (gemv.h): w quantized from a
// [n, k] matrix in pairs order (row 2j gate row j, row 2j + 1 up row j; n = 2 · dim, even), out
// [m, n / 2] <- silu(x · gateᵀ) · (x · upᵀ), rounded once. For calls quantized_gemv_supported()
// accepts with an even n; cudaErrorInvalidValue otherwise.
cudaError_t quantized_gemv_silu_mul(DType dtype, WeightFormat format, void* out, const void* x, const void* w, int m,
                                    int n, int k, GemvRowBits row_bits, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
