// models/calibrated_weights.cpp: finding, checking and overlaying the int4_g128 calibration sidecar.
#include "models/calibrated_weights.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "models/sha256.h"
#include "models/tensor_names.h"
#include "models/weights/gguf.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormatKey = "tessera.calibration.format";
constexpr const char* kSourceKey = "tessera.calibration.source_sha256";
constexpr const char* kMethodKey = "tessera.calibration.method";

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// blk.N.<part>.weight for the parts the graphs load as WeightUse::kLinear: the only weights a backend
// keeps in int4_g128, so the only ones worth calibrating.
bool is_layer_linear(std::string_view gguf_name) {
  static constexpr std::string_view kParts[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                "ffn_gate", "ffn_up", "ffn_down"};
  constexpr std::string_view kBlock = "blk.", kWeight = ".weight";
  if (!gguf_name.starts_with(kBlock)) return false;
  const size_t layer_end = gguf_name.find('.', kBlock.size());
  if (layer_end == std::string_view::npos || layer_end == kBlock.size()) return false;
  const std::string_view layer = gguf_name.substr(kBlock.size(), layer_end - kBlock.size());
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  const std::string_view rest = gguf_name.substr(layer_end + 1);
  return std::any_of(std::begin(kParts), std::end(kParts), [&](std::string_view part) {
    return rest.size() == part.size() + kWeight.size() && rest.starts_with(part) && rest.ends_with(kWeight);
  });
}

std::string shortened(const std::string& sha) { return sha.substr(0, 16) + "..."; }

}  // namespace

std::optional<CalibrationSidecar> open_calibration_sidecar(const ModelFiles& files) {
  if (files.format != ModelFormat::kGguf) return std::nullopt;
  const std::string path = calibration_sidecar_path(files.gguf_path);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  auto gguf = std::make_shared<const GgufFile>(GgufFile::open(path));
  const std::string format = gguf->get_string(kFormatKey);
  if (format != "int4_g128") {
    TESSERA_FAIL(path << ": metadata key '" << kFormatKey << "' is '" << format << "', expected 'int4_g128'");
  }
  const std::string source = lowercase(gguf->get_string(kSourceKey));
  const std::string model = model_sha256(files);
  if (source != model) {
    TESSERA_FAIL(path << ": calibrated for a different model file: its " << kSourceKey << " is " << shortened(source)
                      << ", and " << files.gguf_path << " has sha256 " << shortened(model)
                      << "; re-run the calibration for this model file, or remove " << path);
  }
  return CalibrationSidecar{path, gguf->get_string(kMethodKey), files_sha256({path}), std::move(gguf)};
}

std::string int4_weights_source(const std::optional<CalibrationSidecar>& sidecar) {
  return sidecar ? "calibrated (sidecar sha256 " + sidecar->sha256.substr(0, 16) + "): " + sidecar->method
                 : "round-to-nearest";
}

WeightStore overlay_calibrated_weights(const ModelFiles& files, WeightStore weights, ScalarType linear_weights) {
  if (linear_weights != ScalarType::kInt4G128) return weights;
  const std::optional<CalibrationSidecar> sidecar = open_calibration_sidecar(files);
  if (!sidecar) return weights;
  const std::string& path = sidecar->path;
  if (sidecar->gguf->tensors().empty()) {
    TESSERA_FAIL(path << ": no tensors (a calibration sidecar holds latent linear weights)");
  }
  auto latents = std::make_shared<const WeightStore>(sidecar->gguf->to_weight_store());
  std::set<std::string> replaced;  // the reader's names
  for (const GgufTensorInfo& info : sidecar->gguf->tensors()) {
    const std::string where = path + ": tensor '" + info.name + "'";
    if (!is_layer_linear(info.name)) {
      TESSERA_FAIL(where << " is not a layer linear weight (blk.N.attn_q, attn_k, attn_v, attn_output, ffn_gate, "
                            "ffn_up or ffn_down .weight), the only weights kept in int4_g128");
    }
    // The sidecar carries the model's llama metadata, so the reader named it as the model's tensor.
    const WeightView& latent = latents->get(gguf_to_hf_tensor_name(info.name));
    if (latent.dtype != DType::kBF16 && latent.dtype != DType::kF16 && latent.dtype != DType::kF32) {
      TESSERA_FAIL(where << " is " << dtype_name(latent.dtype) << "; latent weights are BF16, F16 or F32");
    }
    if (!weights.contains(latent.name)) TESSERA_FAIL(where << " is not in the model " << files.gguf_path);
    const WeightView& own = weights.get(latent.name);
    if (own.shape != latent.shape) {
      TESSERA_FAIL(where << " has shape " << shape_string(latent.shape) << ", and the model's (" << files.gguf_path
                         << ") " << shape_string(own.shape));
    }
    replaced.insert(latent.name);
  }
  auto model = std::make_shared<const WeightStore>(std::move(weights));
  WeightStore out;
  out.keep_alive(model);
  out.keep_alive(latents);
  for (const std::string& name : model->names()) {
    out.add(replaced.count(name) != 0 ? latents->get(name) : model->get(name));
  }
  spdlog::info("int4_g128: {} linear weights from {} ({}); any others are the model's own", replaced.size(),
               fs::path(path).filename().string(), int4_weights_source(sidecar));
  return out;
}

}  // namespace tessera
