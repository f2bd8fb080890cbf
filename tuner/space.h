// tuner/space.h: TuneSpace, the search space of `tessera tune` (a YAML file, validated: unknown keys
// and values a backend cannot run are refused naming the field), and Candidate, one point of it.
//
// The schema covers both backends, so the GPU formats slot in where their kernels land: a space
// names its backend, and every axis is checked against what that backend runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::tuner {

// One configuration to measure. Values are the space file's spellings.
struct Candidate {
  std::string weight_format = "gguf";  // gguf (the file's own formats) | f32 | f16 | bf16 | q8_0 | q4_0 | q4_1
                                       // | GPU: fp8_e4m3 | int8 | int4_g128
  std::string kv_dtype = "f32";        // cpu: f32; GPU: bf16 | f16 | fp8_e4m3
  bool fuse_add_rms_norm = true;       // fusions.add_rms_norm: fused | separate
  bool fuse_qkv = true;                // fusions.qkv: fused | separate
  std::string gate_up = "fused";       // fusions.gate_up: fused | separate | epilogue (GPU: SiLU in the GEMM)
  bool rope_in_kv_write = false;       // fusions.rope_kv_write: fused (GPU) | separate
  bool cuda_graphs = false;            // cuda_graphs: true | false
  int threads = 0;                     // kernels.threads (cpu); 0: all cores
  int activation_bits = 0;             // kernels.activation_bits (cpu): 16 | 8; 0: the backend's default
  int decode_split_min_tokens = 0;     // kernels.decode_split_min_tokens (cuda): 32..1024 by 32; 0: the kernel's

  // "q8_0/kv=f32/arn=fused/qkv=separate/gu=fused/rope=separate/graphs=off/t2": unique per candidate.
  std::string key() const;
  // "q8_0 qkv=separate": the non-default choices, for tables and plots.
  std::string short_label() const;
  bool operator==(const Candidate&) const = default;
};

struct MeasureSettings {
  std::vector<int> prefill_tokens{128, 512, 2048};
  std::vector<int> decode_batch{1, 8, 32, 64};
  int decode_context = 256;  // tokens already in each sequence's KV cache at a timed decode step
  int warmup = 2;
  int repeats = 5;
};

struct QualitySettings {
  int tokens = 2048;          // decoders: held-out tokens scored (in windows)
  int window = 512;           // decoders: tokens per teacher-forced window
  std::string text;           // decoders: held-out text file; "" = <model dir>/eval-text-wiki/wiki.utf8
  std::string sentences;      // BERT: one sentence a line, relative to the space file; "" = sentences.txt there
};

struct Policy {
  enum class Kind { kFastestDecodeWithinPplPct, kBestQualityWithinMemoryMb, kFastestWithinCosine };
  Kind kind = Kind::kFastestDecodeWithinPplPct;
  double value = 1.0;
  std::string describe() const;  // "fastest_decode_within_ppl_pct: 1"
};

struct SearchSettings {
  int exhaustive_max = 64;  // spaces up to this many candidates are measured whole; larger ones by NSGA-II
  int population = 8;       // NSGA-II: a multiple of 4, >= 8
  int generations = 4;
  unsigned seed = 1;
};

struct TuneSpace {
  std::string source;   // file the space came from
  std::string backend = "cpu";
  int context = 2048;   // KV memory is reported for this many tokens
  std::vector<std::string> weight_formats{"gguf"};
  std::vector<std::string> kv_dtypes{"f32"};
  std::vector<bool> add_rms_norm{true};
  std::vector<bool> qkv{true};
  std::vector<std::string> gate_up{"fused"};
  std::vector<bool> rope_kv_write{false};
  std::vector<bool> cuda_graphs{false};
  std::vector<int> threads{0};
  std::vector<int> activation_bits{0};
  std::vector<int> decode_split_min_tokens{0};
  MeasureSettings measure;
  QualitySettings quality;
  Policy policy;
  SearchSettings search;

  // Choices per axis, in a fixed order (the NSGA-II decision vector): weight_format, kv_dtype,
  // add_rms_norm, qkv, gate_up, rope_kv_write, cuda_graphs, threads, activation_bits,
  // decode_split_min_tokens.
  std::vector<int64_t> axis_sizes() const;
  int64_t size() const;  // product of axis_sizes
  Candidate at(const std::vector<int64_t>& choice) const;
  Candidate at_index(int64_t flat) const;  // row-major over axis_sizes
  std::vector<Candidate> all() const;
};

// Parses and validates a space. Throws tessera::Error naming the file and the key.
TuneSpace parse_space(const std::string& yaml_text, const std::string& source);
TuneSpace load_space(const std::string& path);

// What the CPU backend runs (for messages and validation).
extern const std::vector<std::string> kCpuWeightFormats;
extern const std::vector<std::string> kGpuWeightFormats;

}  // namespace tessera::tuner
