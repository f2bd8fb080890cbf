// kernels/cpu/quant/kernel_table.h: the per-ISA kernels behind matmul.h (internal). Each ISA's file
// fills one table; matmul.cpp picks a table and a format and splits the output rows over threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/quant/formats.h"
#include "kernels/cpu/quant/isa.h"
#include "kernels/cpu/quant/q8_rows.h"

namespace tessera::kernels::cpu::quant_detail {

// Quantizes rows [r0, r1) of x [rows, k] into `out` (already sized for all rows).
using QuantizeRowsFn = void (*)(const float* x, int64_t r0, int64_t r1, Q8Rows& out);
// y[r * ldy + j] = sum_i x[r, i] * w[j, i] for every row r of x and j in [j0, j1); w is a block
// format's rows of row_bytes each (interleaved formats: j0 and j1 are multiples of 8, and w is the
// whole matrix, groups of 8 rows of 8 * row_bytes each).
using QuantMatmulFn = void (*)(const Q8Rows& x, const std::byte* w, size_t row_bytes, int64_t j0, int64_t j1,
                               float* y, int64_t ldy);
// The same for fp16 / bf16 weights and fp32 activations x [m, k] (fp32 accumulation).
using FloatMatmulFn = void (*)(const float* x, int64_t m, int64_t k, const std::byte* w, size_t row_bytes,
                               int64_t j0, int64_t j1, float* y, int64_t ldy);
// count fp16 / bf16 values to fp32 (weight tiles for the large-batch path).
using WidenFn = void (*)(const std::byte* src, int64_t count, float* dst);

struct KernelTable {
  QuantizeRowsFn quantize_rows = nullptr;
  QuantMatmulFn q8_0 = nullptr;
  QuantMatmulFn q4_0 = nullptr;
  QuantMatmulFn q4_1 = nullptr;
  QuantMatmulFn q8_0x8 = nullptr;
  QuantMatmulFn q4_0x8 = nullptr;
  QuantMatmulFn q4_1x8 = nullptr;
  FloatMatmulFn f16 = nullptr;
  FloatMatmulFn bf16 = nullptr;
  WidenFn widen_f16 = nullptr;
  WidenFn widen_bf16 = nullptr;
};

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();        // call only where isa_supported(Isa::kAvx2)
const KernelTable& avx512vnni_kernels();  // call only where isa_supported(Isa::kAvx512Vnni)

}  // namespace tessera::kernels::cpu::quant_detail
