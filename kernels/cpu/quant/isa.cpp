// kernels/cpu/quant/isa.cpp: CPU feature detection (GCC/Clang's __builtin_cpu_supports reads CPUID
// and the OS's XSAVE state, so a feature the kernel cannot save is reported absent).
#include "kernels/cpu/quant/isa.h"

#include <initializer_list>

namespace tessera::kernels::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Vnni: return "avx512vnni";
  }
  return "?";
}

bool isa_supported(Isa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return avx2;
    case Isa::kAvx512Vnni:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

Isa best_isa() {
  static const Isa best = [] {
    for (Isa isa : {Isa::kAvx512Vnni, Isa::kAvx2}) {
      if (isa_supported(isa)) return isa;
    }
    return Isa::kScalar;
  }();
  return best;
}

}  // namespace tessera::kernels::cpu
