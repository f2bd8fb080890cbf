// kernels/cpu/quant/kernels_avx2.cpp: the x86 kernels for AVX2 + FMA + F16C (see kernels_x86.inc).
#if defined(__x86_64__)
#define TESSERA_QUANT_TARGET "avx2,fma,f16c"
#define TESSERA_QUANT_VNNI 0
#define TESSERA_QUANT_TABLE avx2_kernels
#include "kernels/cpu/quant/kernels_x86.inc"
#else
#include "kernels/cpu/quant/kernel_table.h"
namespace tessera::kernels::cpu::quant_detail {
const KernelTable& avx2_kernels() { return scalar_kernels(); }  // never picked off x86 (isa_supported)
}  // namespace tessera::kernels::cpu::quant_detail
#endif
