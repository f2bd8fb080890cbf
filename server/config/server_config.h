// server/config/server_config.h: ServerConfig, what `tessera serve` runs with: configs/server.yaml
// plus `--set dotted.key=value` overrides, validated where it is built. Unknown keys anywhere are
// errors naming the key path; wrong types name the key and the expected type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/scheduler/engine_config.h"
#include "kernels/backend/tensor.h"

namespace tessera {

struct ServedModelSpec {
  enum class Kind { kAuto, kLlm, kEmbedding };  // kAuto: from the architecture (BERT -> embedding)
  std::string name;           // served model name (the OpenAI `model` field); default: the ref
  std::string path;           // `--model`-style ref: a folder in the model dir, a folder path, a .gguf
  Kind kind = Kind::kAuto;
  std::string chat_template;  // "" = detect from the model; else chatml|llama2|mistral|llama3
  // Weights drawn from a fixed seed instead of read (tuner/random_weights.h), so that a shape folder
  // holding only a config.json serves: for timing a Llama-family model whose checkpoint is not at
  // hand (a 70B on a machine whose disk cannot hold it). Its text means nothing.
  bool random_weights = false;
  // Where the tokenizer and chat template come from: "" = the model itself; else a `path`-style ref
  // (a shape folder has none). Its vocabulary must fit within the model's.
  std::string tokenizer;
};
const char* model_kind_name(ServedModelSpec::Kind kind);  // "auto", "llm", "embedding"

struct ServerConfig {
  struct Listen {
    bool enabled = true;
    std::string host = "127.0.0.1";
    int32_t port = 0;  // 0: the OS picks (the chosen port is logged)
  };
  struct Auth {
    std::vector<std::string> api_keys;  // empty: no key needed. Else `Authorization: Bearer <key>`
    bool protect_health = false;        // /health, /ready and gRPC health need a key too
    bool protect_metrics = false;       // /metrics needs a key too
  };
  // The KV cache when the config sizes it neither way: vLLM's gpu_memory_utilization default on a
  // GPU (16k tokens left 66 GiB of an H100 idle under a 7B model), and what the CPU always had.
  static constexpr double kDefaultGpuKvFraction = 0.9;
  static constexpr int64_t kDefaultCpuKvTokens = 16384;
  // The step's shape when the config leaves it unset: the CPU's, and the GPU's as measured on an
  // H100 serving the 7B shape (docs/backends.md names the benchmark).
  struct StepDefaults {
    int32_t max_batch_tokens;
    int32_t max_running_sequences;
    int32_t prefill_chunk_tokens;  // 0: the whole step budget
  };
  static constexpr StepDefaults kCpuStepDefaults{2048, 128, 0};
  static constexpr StepDefaults kGpuStepDefaults{2048, 256, 0};
  struct Limits {
    int32_t max_queue_size = 256;
    // Unset: kGpuStepDefaults on a GPU, kCpuStepDefaults on the CPU.
    std::optional<int32_t> max_batch_tokens;       // tokens per engine step (decodes + prefill chunks)
    std::optional<int32_t> max_running_sequences;  // sequences decoding at once
    std::optional<int32_t> prefill_chunk_tokens;   // one sequence's prompt tokens per step; 0: no cap
    int32_t max_prefills_per_step = 0;             // sequences prefilling in one step; 0: no cap
    int32_t max_model_len = 0;            // 0: each model's own context length
    // KV cache capacity per LLM, in tokens; 0: 4 x max_model_len. Unset, and with no
    // kv_cache_memory_fraction either: kDefaultGpuKvFraction of the free memory on a GPU, and on the
    // CPU kDefaultCpuKvTokens (at most 4 x max_model_len).
    std::optional<int64_t> kv_cache_tokens;
    // > 0 (cuda): size each LLM's KV cache from this fraction of the device memory free after the
    // weights load, shared evenly by the LLMs; replaces kv_cache_tokens.
    double kv_cache_memory_fraction = 0.0;
    int64_t max_body_bytes = 8 << 20;     // HTTP request bodies
    double request_timeout_s = 600.0;     // per request deadline (a client's shorter one wins)
    double drain_timeout_s = 30.0;        // SIGTERM: time in-flight requests get to finish
    // /health and /ready turn 503 when work is pending and no engine step finished for this long.
    double engine_stall_timeout_s = 60.0;
    // A fatal engine error (a sticky device error) ends the process with exit code 70 (EX_SOFTWARE) once the
    // failed requests' final events went out, so that systemd / Kubernetes restart it; false: stay
    // up with /health and /ready 503.
    bool exit_on_fatal_error = true;
  };

  // Test switches for the health check and the fatal-error exit (EngineFaults); off by default.
  struct Debug {
    int32_t step_delay_ms = 0;  // every engine step sleeps this long
    int64_t fail_step = 0;      // N > 0: the N-th engine step fails as a backend error would
  };

  struct Metrics {
    std::string prefix = "tessera";  // series named "<prefix>:...": tessera | vllm (vLLM dashboards unchanged)
  };

  Listen http{true, "127.0.0.1", 8080};
  Listen grpc{true, "127.0.0.1", 50051};
  std::vector<ServedModelSpec> models;
  Auth auth;
  Limits limits;
  Metrics metrics;
  Debug debug;
  // Speculative decoding: speculative.method (none | ngram | suffix),
  // num_speculative_tokens, prompt_lookup_min / prompt_lookup_max (vLLM's names).
  SpeculativeConfig speculative;
  std::string backend = "auto";   // auto (cuda when a GPU is visible, else cpu) | cpu | cuda
  int32_t device = 0;             // cuda: the GPU index (the first, with tensor_parallel)
  int32_t tensor_parallel = 1;    // cuda: GPUs each LLM is sharded over: devices device .. device + N - 1
  std::string dtype = "auto";     // cuda: activations, weights and KV cache: auto | bf16 | fp16
  bool cuda_graphs = true;        // cuda: capture decode steps into CUDA graphs and replay them
  std::string cuda_weights = "native";  // cuda: linear weights: native | int8 | int4_g128 | fp8_e4m3
  int32_t cuda_decode_split_min_tokens = 0;  // cuda: decode attention's shortest split; 0: the kernel's default
  std::string cuda_kv_dtype = "native";  // cuda: the KV cache: native (the dtype) | fp8_e4m3 (needs bf16)
  bool prefix_caching = true;     // reuse the KV blocks of earlier prompts (engine/kv_cache/prefix_cache_key.h)
  std::string cpu_weights = "native";  // cpu: native (GGUF blocks, f16, bf16 kept as stored) | f32
  int32_t cpu_activation_bits = 16;    // cpu: precision of block-format matmul activations: 16 | 8
  int32_t threads = 0;            // cpu backend threads; 0: OMP_NUM_THREADS or all cores
  int32_t http_threads = 2048;    // HTTP connection threads at most, started on demand (one per open connection)
  std::string log_level = "info"; // trace|debug|info|warn|error|critical|off
  std::string profile;            // tuner profile path; "" = none

  // Throws tessera::Error naming the field and the allowed values.
  void validate() const;
  // The engine's config for a backend on `device`: the step's unset sizes take that device's defaults.
  EngineConfig engine_config(DeviceKind device = DeviceKind::kCpu) const;
};

// Parses YAML text (`source` names it in errors), applies overrides ("a.b.c=value"; the value is
// parsed as YAML, so `auth.api_keys=[k1,k2]` and `models.0.path=/x` work; a list index may equal the
// list size to append), then validates. Throws tessera::Error.
ServerConfig parse_server_config(const std::string& yaml_text, const std::string& source,
                                 const std::vector<std::string>& overrides = {});
// Reads the file, then as parse_server_config.
ServerConfig load_server_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace tessera
