// kernels/cuda/gemm/quantized_weights.h: linear-layer weights stored in fewer bits than the
// activations, for decode, which is bound by streaming the weights once per token.
//
// Formats (w[n, k] is one linear layer's weight, a row per output):
//   int8      symmetric, one fp32 scale per row: w ≈ q · scale, q in [-127, 127]; row-major bytes;
//   int4_g128 asymmetric, groups of 128 along k (the last may be shorter), an fp16 scale and
//             minimum per group: w ≈ q · scale + min, q in [0, 15], tiled for the tensor cores
//             (below);
//   fp8_e4m3  OCP e4m3, one fp32 scale per row: w ≈ fp8 · scale (|fp8| <= 448); row-major bytes.
// Data and scales live in one device allocation of quantized_weight_bytes(), the scales after the
// data at a 16-byte boundary, so a quantized weight is one buffer like any other.
//
// int4_g128's tiled layout. Rows come in tiles of 16 and k in whole groups (padding is q = 0, scale
// and minimum 0), so the data is ceil(n/16) · 16 rows x ceil(k/128) · 128 nibbles. Each tile's data
// is contiguous, 64-wide units of k in order, 512 bytes a unit: 32 slots of 16 bytes (one lane of a
// warp each), a slot 4 little-endian 32-bit words, word s holding 8 nibbles (nibble i at bits
// 4i..4i+3). Weight (row r, k index e) lies in
//   tile r / 16, unit e / 64, slot 4 · (r % 8) + (e % 64) / 16, word (e % 16) / 4,
//   nibble 2 · (j / 2) + (r % 16) / 8 + 4 · (j % 2), where j = e % 4.
// (A slot is one lane's A fragments of four mma.m16n8k16 steps, with k permuted inside the unit so
// that the lane's activations are 16 consecutive values.) Scales are per tile and group, in order,
// 64 bytes each: 8 quads of fp16 {scale(r), min(r), scale(r + 8), min(r + 8)} for rows r = 0..7
// of the tile; the unused rows of the last tile hold 0. fp16 rather than bf16: a group's scale and
// minimum are of the weights' magnitude (|w| well inside fp16's 65504 for LLM linears; scales down
// to 6e-8 as subnormals), where fp16's 11-bit significand is 8 times finer than bf16's. The
// quantizer rounds the minimum down and the scale up, so that the stored grid min + q · scale still
// spans the group's [min, max] and every weight lies within half a stored step; weights beyond
// fp16's range saturate (no LLM's linears come near it).
//
// quantized_gemv() computes y[m, n] = x[m, k] · dequant(w)ᵀ (+ bias) for m <= kGemvMaxM with fp32
// accumulation. Above that, int8 and fp8_e4m3 run as W8A8: quantize_activations() puts x in the
// weight's per-row form and GemmRunner::run_w8a8() (gemm.h) multiplies on the int8 or FP8 tensor
// cores; dequantize_weight() expands w to the activation dtype for the cuBLASLt bf16 path (int4_g128,
// and shapes the W8A8 kernels do not take).
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
// (k must be a multiple of 16, and of 32 for int4_g128). int4_g128's count the padded rows and
// groups: data ceil(n/16) · 16 · ceil(k/128) · 64 bytes, scales ceil(n/16) · 16 · ceil(k/128) · 4.
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
// The per-row scales of an int8 or fp8_e4m3 buffer of `rows` rows (weights or quantized activations).
const float* quantized_row_scales(WeightFormat format, const void* quantized, int rows, int k);

// Whether quantized_gemv() takes this call: 1 <= m <= kGemvMaxM, the shape holdable, x and the
// weight 16-byte aligned.
bool quantized_gemv_supported(WeightFormat format, int m, int n, int k, const void* x, const void* w);
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
