// bench/cpu_matmul_bench.cpp: multiply-adds per ns of the CPU block-format matmuls
// (kernels/cpu/quant/matmul.h) on SmolLM2-135M's shapes, row format beside its 8-row interleaved
// form, at the activation row counts of decode (1), a served batch (8, 64) and a prefill chunk (512).
// Weights are random blocks (the speed does not depend on the values). One JSON line per case:
//   tessera-cpu-matmul-bench [--threads N] [--isa avx512vnni|avx2|scalar] [--reps N] [--bits 8|16]
// (--bits: the activation precision; both when not given.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_output.h"
#include "kernels/cpu/quant/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace kc = tessera::kernels::cpu;

int main(int argc, char** argv) {
  int threads = 0, reps = 20, only_bits = 0;
  kc::Isa isa = kc::best_isa();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--threads") threads = std::stoi(value);
    if (flag == "--reps") reps = std::stoi(value);
    if (flag == "--bits") only_bits = std::stoi(value);
    if (flag == "--isa") isa = value == "scalar" ? kc::Isa::kScalar : value == "avx2" ? kc::Isa::kAvx2 : kc::Isa::kAvx512Vnni;
  }
  kc::set_num_threads(threads);
  struct Shape {
    const char* name;
    kc::WeightFormat format;
    int64_t n, k;
  };
  // SmolLM2-135M Q4_1 GGUF: fused qkv, o, fused gate/up, down (Q4_1) and the tied lm_head (Q8_0).
  const Shape shapes[] = {{"qkv", kc::WeightFormat::kQ4_1, 960, 576},     {"o", kc::WeightFormat::kQ4_1, 576, 576},
                          {"gate_up", kc::WeightFormat::kQ4_1, 3072, 576}, {"down", kc::WeightFormat::kQ4_1, 576, 1536},
                          {"lm_head", kc::WeightFormat::kQ8_0, 49152, 576}};
  std::mt19937 rng(1);
  for (const Shape& s : shapes) {
    const size_t bytes = kc::weight_row_bytes(s.format, s.k) * static_cast<size_t>(s.n);
    std::vector<std::byte> rows(bytes), interleaved(bytes);
    for (auto& b : rows) b = static_cast<std::byte>(rng() & 0xff);
    // Scales: small positive fp16 values (0x2000 = 2^-7), so no inf / nan reaches the timing.
    const size_t block = kc::weight_row_bytes(s.format, 32);
    for (size_t at = 0; at < bytes; at += block) {
      const uint16_t scale = 0x2000;
      std::memcpy(&rows[at], &scale, 2);
      if (s.format == kc::WeightFormat::kQ4_1) std::memcpy(&rows[at + 2], &scale, 2);
    }
    kc::interleave_rows(s.format, rows.data(), s.n, s.k, interleaved.data());
    for (int64_t m : {1, 8, 64, 512}) {
      std::vector<float> x(static_cast<size_t>(m * s.k)), y(static_cast<size_t>(m * s.n));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : x) v = normal(rng);
      for (kc::WeightFormat f : {s.format, kc::interleaved_format(s.format)}) {
        for (kc::ActivationBits bits : {kc::ActivationBits::k8, kc::ActivationBits::k16}) {
          if (only_bits != 0 && only_bits != static_cast<int>(bits)) continue;
          const std::byte* w = f == s.format ? rows.data() : interleaved.data();
          const int r = m >= 512 && s.n > 10000 ? 3 : reps;
          std::vector<double> times;
          for (int i = 0; i < r + 1; ++i) {
            const auto t0 = tessera::bench::Clock::now();
            if (kc::linear_on(isa, f, w, x.data(), nullptr, y.data(), m, s.n, s.k, bits) != kc::Status::kOk) return 1;
            if (i > 0) times.push_back(tessera::bench::seconds(t0, tessera::bench::Clock::now()));
          }
          const double median = tessera::bench::stats_of(times).median;
          tessera::bench::print_json_line({{"bench", "cpu_matmul"}, {"matrix", s.name}, {"format", kc::weight_format_name(f)},
                                           {"isa", kc::isa_name(isa)}, {"activation_bits", static_cast<int>(bits)},
                                           {"threads", kc::num_threads()}, {"m", m},
                                           {"n", s.n}, {"k", s.k}, {"median_us", median * 1e6},
                                           {"mac_per_ns", static_cast<double>(m * s.n * s.k) / (median * 1e9)}});
        }
      }
    }
  }
  return 0;
}
