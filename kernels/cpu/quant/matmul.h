// kernels/cpu/quant/matmul.h: y = x · wᵀ (+ bias) with the weight in its storage format. The one
// place the CPU backend's linear layers dispatch on a weight's format:
//   f32        OpenBLAS (gemm_xwt)
//   q8_0, q4_0, q4_1
//              x is quantized on the fly to 8- or 16-bit integer blocks of 32 (q8_rows.h; 16-bit
//              as two int8 digits); integer dot products per block, scaled and accumulated in fp32
//   q8_0x8, q4_0x8, q4_1x8
//              the same with 8 weight rows interleaved (formats.h; the CPU backend rearranges block
//              weights so at load): 8 outputs per vector, which batches of rows need
//   f16, bf16  fp32 accumulation, weights widened in registers (a few rows: no copy) or tile by tile
//              into a small buffer for OpenBLAS (many rows)
// Output rows are split over the kernel thread pool; small products run on the calling thread.
#pragma once

#include <cstdint>

#include "kernels/cpu/quant/formats.h"
#include "kernels/cpu/quant/isa.h"
#include "kernels/cpu/quant/q8_rows.h"
#include "kernels/cpu/status.h"

namespace tessera::kernels::cpu {

Status linear(WeightFormat format,
              const void* w,      // [n] rows of weight_row_bytes(format, k) bytes
              const float* x,     // [m, k]
              const float* bias,  // [n] or nullptr
              float* y,           // [m, n]
              int64_t m, int64_t n, int64_t k,
              ActivationBits activation_bits);  // block formats: x's precision (others ignore it)

// The same on a chosen SIMD path (tests force each in turn). kUnsupported when this CPU lacks it.
// Frees the calling thread's quantized-activation rows, which keep the size of the largest product
// it ran (0.7 MB after a 240-token prefill of SmolLM2) until then.
void release_activation_rows();

Status linear_on(Isa isa, WeightFormat format, const void* w, const float* x, const float* bias, float* y, int64_t m,
                 int64_t n, int64_t k, ActivationBits activation_bits);

// out[i] (+)= dequantized row ids[i] of a table in any format (the token embedding, which a tied
// model's lm_head shares, so it stays in its format too).
Status embedding_gather_rows(WeightFormat format, const int32_t* ids, const void* table, float* out, int64_t count,
                             int64_t vocab, int64_t dim, bool accumulate);

}  // namespace tessera::kernels::cpu
