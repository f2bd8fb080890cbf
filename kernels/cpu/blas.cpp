// kernels/cpu/blas.cpp: BLAS opened on first use (see blas.h).
#include "kernels/cpu/blas.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace tessera::kernels::cpu::blas {
namespace {

// The header's own declarations give the types (whichever CBLAS header the build found).
using SgemmFn = decltype(&cblas_sgemm);
using SgemvFn = decltype(&cblas_sgemv);
using SetThreadsFn = void (*)(int);

struct Library {
  SgemmFn sgemm = nullptr;
  SgemvFn sgemv = nullptr;
};

const Library& library() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // The library CMake found at build time, then the usual OpenBLAS name.
    void* handle = nullptr;
    for (const char* name : {TESSERA_BLAS_LIBRARY, "libopenblas.so.0"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
    }
    if (handle != nullptr) {
      lib.sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "cblas_sgemm"));
      lib.sgemv = reinterpret_cast<SgemvFn>(dlsym(handle, "cblas_sgemv"));
      // OpenBLAS only: each call single-threaded, since the kernel thread pool splits the work.
      if (auto set_threads = reinterpret_cast<SetThreadsFn>(dlsym(handle, "openblas_set_num_threads"))) set_threads(1);
    }
    if (lib.sgemm == nullptr || lib.sgemv == nullptr) {
      std::fprintf(stderr, "tessera: cannot load BLAS (%s): %s\n", TESSERA_BLAS_LIBRARY, dlerror());
      std::abort();
    }
  });
  return lib;
}

}  // namespace

void sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
           const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  library().sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemv(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, int m, int n, float alpha, const float* a, int lda, const float* x,
           int incx, float beta, float* y, int incy) {
  library().sgemv(order, ta, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

}  // namespace tessera::kernels::cpu::blas
