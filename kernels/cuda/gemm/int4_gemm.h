// kernels/cuda/gemm/int4_gemm.h: the GEMM of int4_g128 weights for more rows than the GEMV takes,
// built from CUTLASS's sm90 mixed-input GEMM: the nibbles travel to shared memory as stored, and
// each is expanded to bf16 in registers inside the main loop (w = q · scale + min, the group's bf16
// scale and minimum), so no bf16 copy of the weight is ever written.
//   y[i, j] = bf16(Σ_e x[i, e] · (q[j, e] · scale[e / 128, j] + min[e / 128, j]) + bias[j])
// x [m, k] bf16 row-major; q the int4_g128 data (quantized_weights.h: [n, k] nibbles in CUTLASS's
// shuffled layout); scale and min bf16 [k / 128 rounded up, n]; y [m, n] bf16 row-major; bias bf16
// [n] or null. k a multiple of 64 and n of 16 (whole atoms of the layout), every pointer 16-byte
// aligned. Anything else, or a build without
// sm_90a code, is cudaErrorNotSupported, and the caller takes a bf16 path. A plain launch, so it can
// be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tessera::kernels::cuda {

cudaError_t int4_g128_gemm(void* y, const void* x, const void* q, const void* scales, const void* mins,
                           const void* bias, int m, int n, int k, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);

}  // namespace tessera::kernels::cuda
