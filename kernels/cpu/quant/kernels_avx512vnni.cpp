// kernels/cpu/quant/kernels_avx512vnni.cpp: the x86 kernels with AVX-512 VNNI's vpdpbusd for the
// int8 dot products (256-bit EVEX forms through AVX-512 VL: on Zen 4 a 512-bit op costs two 256-bit
// ones, and 256-bit blocks keep one 32-value block per vector; see kernels_x86.inc).
#if defined(__x86_64__)
#define TESSERA_QUANT_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define TESSERA_QUANT_VNNI 1
#define TESSERA_QUANT_TABLE avx512vnni_kernels
#include "kernels/cpu/quant/kernels_x86.inc"
#else
#include "kernels/cpu/quant/kernel_table.h"
namespace tessera::kernels::cpu::quant_detail {
const KernelTable& avx512vnni_kernels() { return scalar_kernels(); }  // never picked off x86 (isa_supported)
}  // namespace tessera::kernels::cpu::quant_detail
#endif
