// kernels/cpu/blas.h: the two OpenBLAS calls the fp32 paths make, with the library opened on first
// use instead of linked. A linked OpenBLAS puts its 60 KiB of thread-local storage into every thread
// the process starts (glibc sizes static TLS for all of them): 8.5 MB of resident memory across a
// server's ~140 mostly idle HTTP and gRPC threads. Opened with dlopen, its TLS is allocated only in
// threads that call it, and a model without fp32 matrices (a quantized GGUF) never loads it.
#pragma once

#include <cblas.h>

namespace tessera::kernels::cpu::blas {

// Same arguments as cblas_sgemm / cblas_sgemv. The first call opens the library (and sets its own
// threading to 1: our pool splits the work); a library that cannot be opened is a fatal error.
void sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
           const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void sgemv(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, int m, int n, float alpha, const float* a, int lda,
           const float* x, int incx, float beta, float* y, int incy);

}  // namespace tessera::kernels::cpu::blas
