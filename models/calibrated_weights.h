// models/calibrated_weights.h: the int4_g128 calibration sidecar. Quantizing a small model's linear
// weights to int4_g128 by round-to-nearest (what the CUDA backend does at load) loses too much quality,
// so an offline tool trains "latent" weights whose round-to-nearest quantization is good, and writes
// them beside the model. Whenever the linear weights are kept in int4_g128, the latents replace the
// model's own before the backend quantizes them.
//
// The sidecar of <dir>/<stem>.gguf is <dir>/<stem>.int4_g128.gguf: a GGUF file carrying the model's
// metadata (so its tensor names map, and its q/k rows un-permute, exactly as the model's), plus
//   tessera.calibration.format         "int4_g128"
//   tessera.calibration.source_sha256  sha256 of the model .gguf file's bytes, lowercase hex
//   tessera.calibration.method         free text: how it was made
// and some of the model's layer linears (blk.N.attn_q / attn_k / attn_v / attn_output / ffn_gate /
// ffn_up / ffn_down .weight) in BF16, F16 or F32, with the model's shapes and layout. HF safetensors
// models have no sidecar. Its file name (calibration_sidecar_path) is in models/model_files.h, which
// never takes a sidecar for a model.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kernels/backend/tensor.h"
#include "models/model_files.h"
#include "models/weights/weight_store.h"

namespace tessera {

class GgufFile;

// A sidecar whose metadata fits its model.
struct CalibrationSidecar {
  std::string path;
  std::string method;  // tessera.calibration.method
  std::string sha256;  // of the sidecar file itself: which latent weights these are
  std::shared_ptr<const GgufFile> gguf;
};

// The sidecar beside `files`' GGUF file, with tessera.calibration.format and .source_sha256 checked
// against the model (throws tessera::Error naming the file and the key); nullopt when there is none
// (safetensors models never have one).
std::optional<CalibrationSidecar> open_calibration_sidecar(const ModelFiles& files);

// Where int4_g128 linear weights come from, for the tuner's records and the profile's binding:
// "calibrated (sidecar sha256 <16 hex digits>): <method>" with a sidecar, else "round-to-nearest"
// (the model's own weights, quantized at load).
std::string int4_weights_source(const std::optional<CalibrationSidecar>& sidecar);

// The one place that decides whether a sidecar is used: when `linear_weights` (the format the backend
// keeps the layers' linear weights in) is int4_g128 and the model has a sidecar, `weights` with the
// sidecar's tensors in place of the model's, after checking each is a layer linear weight the model
// has, with the model's shape (throws naming the file and the tensor otherwise), and one info line
// logged. Otherwise `weights` unchanged: other formats ignore the sidecar.
WeightStore overlay_calibrated_weights(const ModelFiles& files, WeightStore weights, ScalarType linear_weights);

}  // namespace tessera
