// kernels/cpu/quant/isa.h: which SIMD code path the CPU matmuls take. Picked once at run time from
// the CPU's features (one binary runs on any x86-64); tests force each path in turn.
#pragma once

namespace tessera::kernels::cpu {

enum class Isa : int {
  kScalar,      // portable C++, any CPU
  kAvx2,        // AVX2 + FMA + F16C (Haswell, Zen 1 and later)
  kAvx512Vnni,  // the AVX2 set plus AVX-512 F/BW/VL and VNNI (Ice Lake, Zen 4 and later)
};

const char* isa_name(Isa isa);
bool isa_supported(Isa isa);  // does this CPU run it?
Isa best_isa();               // the fastest supported path (cached after the first call)

}  // namespace tessera::kernels::cpu
