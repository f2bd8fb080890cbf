// models/model_files.h: finds a model on disk from `--model NAME|PATH` and loads its parts
// (config, weights) whatever the format.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "models/config/model_config.h"
#include "models/weights/weight_store.h"

namespace tessera {

class GgufFile;

enum class ModelFormat { kHfSafetensors, kGguf };

struct ModelFiles {
  std::string name;        // as given on the command line
  std::string dir;         // folder holding the model
  ModelFormat format = ModelFormat::kHfSafetensors;
  std::string gguf_path;   // format == kGguf
  std::shared_ptr<const GgufFile> gguf;  // opened once, shared by config, weights and tokenizer
};

// A GGUF model's int4_g128 calibration sidecar (models/calibrated_weights.h) lies beside it:
// <dir>/<stem>.int4_g128.gguf for the model file <dir>/<stem>.gguf.
inline constexpr std::string_view kInt4CalibrationSuffix = ".int4_g128.gguf";
std::string calibration_sidecar_path(const std::string& gguf_path);
// Whether the file name ends in .int4_g128.gguf (in any case): a sidecar, never a model.
bool is_calibration_sidecar(const std::string& path);

// The model directory: $TESSERA_MODEL_DIR or ~/.cache/tessera/models.
std::string default_model_dir();

// `name_or_path` is a folder in the model dir, a folder path, or a .gguf file path. A folder's GGUF
// model is its one .gguf file besides calibration sidecars (*.int4_g128.gguf), which are never models.
// Throws tessera::Error listing what was looked for when nothing matches.
ModelFiles locate_model(const std::string& name_or_path);

ModelConfig load_model_config(const ModelFiles& files);  // config.json (+ sentence-transformers files) or GGUF
// The weights as the files hold them. A CUDA backend keeping linear weights in int4_g128 loads them
// through overlay_calibrated_weights (models/calibrated_weights.h) too.
WeightStore load_weights(const ModelFiles& files);

// The model's identity, which tuner profiles and calibration sidecars are bound to: sha256 of the
// GGUF file, or of the safetensors files in name order.
std::string model_sha256(const ModelFiles& files);

}  // namespace tessera
