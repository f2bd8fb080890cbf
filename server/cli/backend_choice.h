// server/cli/backend_choice.h: which Backend a command runs on (`backend: auto | cpu | cuda`), made
// in one place for serve, generate and embed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend/backend.h"
#include "models/weights/weight_store.h"

namespace CLI {
class App;
}

namespace tessera {

struct ModelFiles;
namespace tuner {
struct Profile;
}

struct BackendChoice {
  std::string kind = "auto";  // auto: cuda when a GPU is visible, else cpu | cpu | cuda
  int32_t device = 0;         // cuda
  std::string dtype = "auto"; // cuda: auto (bf16) | bf16 | fp16
  bool cuda_graphs = true;    // cuda: replay decode steps as CUDA graphs
  int32_t threads = 0;        // cpu
  std::string cpu_weights = "native";  // cpu: native | f32
  int32_t cpu_activation_bits = 16;    // cpu: 16 | 8 (block-format matmul activations)
  // cuda: the format of the layers' linear weights: native (the dtype) | int8 | int4_g128 | fp8_e4m3
  // (weight-only, bf16 activations: CudaBackendConfig::linear_weights).
  std::string cuda_weights = "native";
  int32_t cuda_decode_split_min_tokens = 0;  // cuda: CudaBackendConfig::decode_split_min_tokens
  // cuda: the KV cache: native (the dtype) | fp8_e4m3 (CudaBackendConfig::kv_cache_dtype, bf16 only).
  std::string cuda_kv_dtype = "native";
  bool cuda_batch_invariant_decode = false;  // cuda: CudaBackendConfig::batch_invariant_decode
  // cuda: GPUs one model is sharded over (tensor parallelism), devices device .. device + N - 1.
  int32_t tensor_parallel = 1;
};

// cuda_weights' values and the ScalarType each names (native: the activation dtype `dtype`); throws
// naming the field for any other value.
ScalarType cuda_linear_weight_type(const std::string& cuda_weights, ScalarType dtype);
// cuda_kv_dtype's values and the KV cache type each names (native: the activation dtype `dtype`,
// fp8_e4m3: ScalarType::kFp8E4M3); throws naming the field for any other value.
ScalarType cuda_kv_cache_type(const std::string& cuda_kv_dtype, ScalarType dtype);

// Throws tessera::Error with a clear message when cuda is asked for and this binary was built
// without it or no GPU is visible. `auto` logs what it picked and why.
std::unique_ptr<Backend> make_backend(const BackendChoice& choice);
// make_backend's backend alone when choice.tensor_parallel is 1; otherwise one cuda backend per rank,
// rank i on GPU choice.device + i, joined into one tensor-parallel group (rank 0 first). Throws
// naming tensor_parallel when fewer GPUs are visible or the backend is not cuda.
std::vector<std::unique_ptr<Backend>> make_backends(const BackendChoice& choice);

// A tuner profile's backend choices in `choice`, as serve and info apply them: threads and activation
// bits for a cpu profile; dtype, cuda_weights, cuda_kv_dtype, cuda_graphs and the decode split for a
// cuda one. Logs a warning for each value set otherwise that the profile replaces.
void apply_profile_choice(const tuner::Profile& profile, BackendChoice& choice);

// `files`' weights as `backend` (made from `choice`) keeps them: with the int4_g128 calibration
// sidecar overlaid when it is the cuda backend and cuda_weights is int4_g128
// (models/calibrated_weights.h). The model a tuner profile was made for loads through
// tuner::apply_weight_format instead, which does the same for the profile's choice.
WeightStore load_weights_for(const ModelFiles& files, const BackendChoice& choice, const Backend& backend);

// --backend, --device, --tensor-parallel, --dtype, --no-cuda-graphs, --cuda-weights, --cuda-decode-split-min-tokens,
// --cuda-kv-dtype, --cpu-weights, --cpu-activation-bits and --threads on a subcommand.
void add_backend_options(CLI::App& command, BackendChoice& choice);

}  // namespace tessera
