// server/cli/backend_choice.cpp: make_backend and the CLI options that choose it.
#include "server/cli/backend_choice.h"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "kernels/backend/cpu/cpu_backend.h"
#ifdef TESSERA_HAVE_CUDA
#include "kernels/backend/cuda/cuda_backend.h"
#endif
#include "models/calibrated_weights.h"
#include "models/model_files.h"
#include "tuner/profile.h"

namespace tessera {

ScalarType cuda_linear_weight_type(const std::string& cuda_weights, ScalarType dtype) {
  if (cuda_weights == "native") return dtype;
  if (cuda_weights == "int8") return ScalarType::kInt8PerRow;
  if (cuda_weights == "int4_g128") return ScalarType::kInt4G128;
  if (cuda_weights == "fp8_e4m3") return ScalarType::kFp8E4M3PerRow;
  TESSERA_FAIL("cuda_weights: expected native, int8, int4_g128 or fp8_e4m3, got '" << cuda_weights << "'");
}

ScalarType cuda_kv_cache_type(const std::string& cuda_kv_dtype, ScalarType dtype) {
  if (cuda_kv_dtype == "native") return dtype;
  if (cuda_kv_dtype == "fp8_e4m3") return ScalarType::kFp8E4M3;
  TESSERA_FAIL("cuda_kv_dtype: expected native or fp8_e4m3, got '" << cuda_kv_dtype << "'");
}

std::unique_ptr<Backend> make_backend(const BackendChoice& choice) {
  TESSERA_CHECK(choice.kind == "auto" || choice.kind == "cpu" || choice.kind == "cuda",
                "backend: expected auto, cpu or cuda, got '" << choice.kind << "'");
  cuda_linear_weight_type(choice.cuda_weights, ScalarType::kBF16);  // the values, before any backend is made
  cuda_kv_cache_type(choice.cuda_kv_dtype, ScalarType::kBF16);
  std::string kind = choice.kind;
#ifdef TESSERA_HAVE_CUDA
  if (kind == "auto") {
    const int gpus = cuda_device_count();
    kind = gpus > 0 ? "cuda" : "cpu";
    spdlog::info("backend auto: {}", gpus > 0 ? "cuda (" + std::to_string(gpus) + " GPU(s) visible)"
                                              : std::string("cpu (no CUDA GPU visible)"));
  }
  if (kind == "cuda") {
    CudaBackendConfig config;
    config.device = choice.device;
    TESSERA_CHECK(choice.dtype == "auto" || choice.dtype == "bf16" || choice.dtype == "fp16",
                  "dtype: expected auto, bf16 or fp16, got '" << choice.dtype << "'");
    config.dtype = choice.dtype == "fp16" ? ScalarType::kF16 : ScalarType::kBF16;
    config.cuda_graphs = choice.cuda_graphs;
    config.linear_weights = cuda_linear_weight_type(choice.cuda_weights, config.dtype);
    config.decode_split_min_tokens = choice.cuda_decode_split_min_tokens;
    config.batch_invariant_decode = choice.cuda_batch_invariant_decode;
    TESSERA_CHECK(config.linear_weights == config.dtype || config.dtype == ScalarType::kBF16,
                  "cuda_weights: " << choice.cuda_weights << " needs dtype bf16 (its kernels take bf16 activations), got "
                                   << choice.dtype);
    config.kv_cache_dtype = cuda_kv_cache_type(choice.cuda_kv_dtype, config.dtype);
    TESSERA_CHECK(*config.kv_cache_dtype == config.dtype || config.dtype == ScalarType::kBF16,
                  "cuda_kv_dtype: " << choice.cuda_kv_dtype
                                    << " needs dtype bf16 (its kernels take bf16 activations), got " << choice.dtype);
    return std::make_unique<CudaBackend>(config);
  }
#else
  TESSERA_CHECK(kind != "cuda", "backend: cuda is not built into this binary (configure with -DTESSERA_CUDA=ON); "
                                "use cpu");
  if (kind == "auto") spdlog::info("backend auto: cpu (this binary has no CUDA backend)");
#endif
  // Weights quantized for the GPU's kernels mean nothing to the CPU backend: refused when asked for
  // explicitly, only noted when `auto` found no GPU (a GPU server's config run elsewhere).
  if (choice.cuda_weights != "native") {
    TESSERA_CHECK(choice.kind == "auto", "cuda_weights: " << choice.cuda_weights
                                                          << " applies to the cuda backend only; backend is cpu");
    spdlog::warn("cuda_weights {} ignored: the backend is cpu", choice.cuda_weights);
  }
  if (choice.cuda_kv_dtype != "native") {
    TESSERA_CHECK(choice.kind == "auto", "cuda_kv_dtype: " << choice.cuda_kv_dtype
                                                           << " applies to the cuda backend only; backend is cpu");
    spdlog::warn("cuda_kv_dtype {} ignored: the backend is cpu (its KV cache is f32)", choice.cuda_kv_dtype);
  }
  TESSERA_CHECK(choice.cpu_weights == "native" || choice.cpu_weights == "f32",
                "cpu_weights: expected native or f32, got '" << choice.cpu_weights << "'");
  TESSERA_CHECK(choice.cpu_activation_bits == 8 || choice.cpu_activation_bits == 16,
                "cpu_activation_bits: expected 8 or 16, got " << choice.cpu_activation_bits);
  return std::make_unique<CpuBackend>(CpuBackendOptions{.num_threads = choice.threads,
                                                        .keep_weight_formats = choice.cpu_weights == "native",
                                                        .activation_bits = choice.cpu_activation_bits});
}

std::vector<std::unique_ptr<Backend>> make_backends(const BackendChoice& choice) {
  std::vector<std::unique_ptr<Backend>> backends;
  TESSERA_CHECK(choice.tensor_parallel >= 1, "tensor_parallel: must be >= 1, got " << choice.tensor_parallel);
  if (choice.tensor_parallel == 1) {
    backends.push_back(make_backend(choice));
    return backends;
  }
  TESSERA_CHECK(choice.kind != "cpu", "tensor_parallel " << choice.tensor_parallel
                                                         << ": shards a model over GPUs; the backend is cpu");
#ifdef TESSERA_HAVE_CUDA
  const int gpus = cuda_device_count();
  TESSERA_CHECK(choice.device + choice.tensor_parallel <= gpus,
                "tensor_parallel " << choice.tensor_parallel << ": needs GPUs " << choice.device << ".."
                                   << choice.device + choice.tensor_parallel - 1 << ", and " << gpus
                                   << " are visible");
  std::vector<CudaBackend*> ranks;
  for (int32_t rank = 0; rank < choice.tensor_parallel; ++rank) {
    BackendChoice one = choice;
    one.kind = "cuda";
    one.device = choice.device + rank;
    backends.push_back(make_backend(one));
    ranks.push_back(static_cast<CudaBackend*>(backends.back().get()));
  }
  CudaBackend::form_group(ranks);
  spdlog::info("tensor parallel: {} ranks on GPUs {}..{}", choice.tensor_parallel, choice.device,
               choice.device + choice.tensor_parallel - 1);
  return backends;
#else
  TESSERA_FAIL("tensor_parallel " << choice.tensor_parallel
                                  << ": shards a model over GPUs; this binary has no CUDA backend");
#endif
}

void apply_profile_choice(const tuner::Profile& profile, BackendChoice& choice) {
  const tuner::Candidate& c = profile.choice;
  if (profile.backend == "cpu") {
    if (choice.threads != 0 && choice.threads != c.threads) {
      spdlog::warn("profile {}: threads {} replaces the configured {}", profile.path, c.threads, choice.threads);
    }
    choice.threads = c.threads;
    if (c.activation_bits != 0) choice.cpu_activation_bits = c.activation_bits;
  } else if (profile.backend == "cuda") {
    const tuner::CudaWeightsChoice weights = tuner::cuda_weights_choice(c);
    if (choice.cuda_weights != "native" && choice.cuda_weights != weights.cuda_weights) {
      spdlog::warn("profile {}: cuda_weights {} replaces the configured {}", profile.path, weights.cuda_weights,
                   choice.cuda_weights);
    }
    if (choice.cuda_kv_dtype != "native" && choice.cuda_kv_dtype != weights.cuda_kv_dtype) {
      spdlog::warn("profile {}: cuda_kv_dtype {} replaces the configured {}", profile.path, weights.cuda_kv_dtype,
                   choice.cuda_kv_dtype);
    }
    choice.dtype = weights.dtype;
    choice.cuda_weights = weights.cuda_weights;
    choice.cuda_kv_dtype = weights.cuda_kv_dtype;
    choice.cuda_graphs = c.cuda_graphs;
    choice.cuda_decode_split_min_tokens = c.decode_split_min_tokens;
  }
}

WeightStore load_weights_for(const ModelFiles& files, const BackendChoice& choice, const Backend& backend) {
  // cuda_weights means nothing to the cpu backend (make_backend ignores it where `auto` found no GPU).
  const ScalarType linear_weights = backend.device() == DeviceKind::kCuda
                                        ? cuda_linear_weight_type(choice.cuda_weights, backend.activation_type())
                                        : backend.activation_type();
  return overlay_calibrated_weights(files, load_weights(files), linear_weights);
}

void add_backend_options(CLI::App& command, BackendChoice& choice) {
  command.add_option("--backend", choice.kind, "auto (cuda when a GPU is visible), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  command.add_option("--device", choice.device, "cuda: GPU index")->capture_default_str();
  command.add_option("--tensor-parallel", choice.tensor_parallel,
                     "cuda: shard the model over this many GPUs (from --device on)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  command.add_option("--dtype", choice.dtype, "cuda: auto (bf16), bf16 or fp16")
      ->check(CLI::IsMember({"auto", "bf16", "fp16"}))
      ->capture_default_str();
  command.add_flag("--no-cuda-graphs{false}", choice.cuda_graphs,
                   "cuda: run decode steps and one-text embeddings eagerly (no CUDA graphs)");
  command.add_option("--cuda-weights", choice.cuda_weights,
                     "cuda: the layers' linear weights: native (the dtype), or weight-only int8, int4_g128 or fp8_e4m3 "
                     "(bf16 activations; embeddings and lm_head stay in the dtype)")
      ->check(CLI::IsMember({"native", "int8", "int4_g128", "fp8_e4m3"}))
      ->capture_default_str();
  command.add_option("--cuda-decode-split-min-tokens", choice.cuda_decode_split_min_tokens,
                     "cuda: decode attention's shortest split-KV chunk in tokens, a multiple of 32 (0: the kernel's "
                     "default, 64); `tessera tune` measures it as kernels.decode_split_min_tokens")
      ->capture_default_str();
  command.add_option("--cuda-kv-dtype", choice.cuda_kv_dtype,
                     "cuda: the paged KV cache: native (the dtype) or fp8_e4m3 (half the bytes, bf16 activations)")
      ->check(CLI::IsMember({"native", "fp8_e4m3"}))
      ->capture_default_str();
  command.add_option("--cpu-weights", choice.cpu_weights, "cpu: native (as stored) or f32 (dequantized at load)")
      ->check(CLI::IsMember({"native", "f32"}))
      ->capture_default_str();
  command.add_option("--cpu-activation-bits", choice.cpu_activation_bits,
                     "cpu: 16 or 8 (llama.cpp's, faster prefill, 96.6% top-1 agreement with fp32 on SmolLM2)")
      ->check(CLI::IsMember({8, 16}))
      ->capture_default_str();
  command.add_option("--threads", choice.threads, "cpu: threads (0: OMP_NUM_THREADS or all cores)")
      ->capture_default_str();
}

}  // namespace tessera
