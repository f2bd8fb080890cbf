// models/model_files.cpp: finds a model folder or GGUF file from `--model`, and loads its config
// and weights whatever the format.
#include "models/model_files.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/sha256.h"
#include "models/weights/gguf.h"
#include "models/weights/safetensors.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool has_gguf_extension(const fs::path& p) { return lowercase(p.extension().string()) == ".gguf"; }

ModelFiles gguf_model(const std::string& name, const fs::path& file) {
  if (is_calibration_sidecar(file.string())) {
    const std::string sidecar = file.filename().string();
    const std::string model = sidecar.substr(0, sidecar.size() - kInt4CalibrationSuffix.size()) + ".gguf";
    TESSERA_FAIL("model '" << name << "' is a calibration sidecar (int4_g128 latent weights for " << model
                           << "), not a model; pass " << model << " or its folder: the sidecar is read by itself "
                           << "when the linear weights are int4_g128 (--cuda-weights int4_g128)");
  }
  ModelFiles files;
  files.name = name;
  files.dir = file.parent_path().string();
  files.format = ModelFormat::kGguf;
  files.gguf_path = file.string();
  files.gguf = std::make_shared<const GgufFile>(GgufFile::open(files.gguf_path));
  return files;
}

// A folder: HF layout when it has config.json, else exactly one .gguf file that is not a calibration
// sidecar (which lies beside the model it calibrates).
ModelFiles folder_model(const std::string& name, const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / "config.json", ec)) {
    ModelFiles files;
    files.name = name;
    files.dir = dir.string();
    files.format = ModelFormat::kHfSafetensors;
    return files;
  }
  std::vector<fs::path> ggufs;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && has_gguf_extension(entry.path()) && !is_calibration_sidecar(entry.path().string())) {
      ggufs.push_back(entry.path());
    }
  }
  std::sort(ggufs.begin(), ggufs.end());
  if (ggufs.size() == 1) return gguf_model(name, ggufs[0]);
  if (ggufs.empty()) {
    TESSERA_FAIL("model '" << name << "': folder " << dir.string()
                           << " has neither config.json nor a model .gguf file (calibration sidecars, *"
                           << kInt4CalibrationSuffix << ", are not models)");
  }
  std::string list;
  for (const fs::path& p : ggufs) list += (list.empty() ? "" : ", ") + p.filename().string();
  TESSERA_FAIL("model '" << name << "': folder " << dir.string() << " has " << ggufs.size() << " .gguf files (" << list
                         << "); pass the path of the one to use");
}

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) TESSERA_FAIL(path.string() << ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL(path.string() << ": bad JSON: " << e.what());
  }
}

}  // namespace

std::string calibration_sidecar_path(const std::string& gguf_path) {
  const fs::path model(gguf_path);
  return (model.parent_path() / (model.stem().string() + std::string(kInt4CalibrationSuffix))).string();
}

bool is_calibration_sidecar(const std::string& path) {
  return lowercase(fs::path(path).filename().string()).ends_with(kInt4CalibrationSuffix);
}

std::string default_model_dir() {
  if (const char* dir = std::getenv("TESSERA_MODEL_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return (fs::path(home) / ".cache" / "tessera" / "models").string();
  }
  TESSERA_FAIL("cannot find the model directory: neither TESSERA_MODEL_DIR nor HOME is set");
}

ModelFiles locate_model(const std::string& name_or_path) {
  if (name_or_path.empty()) TESSERA_FAIL("--model is empty; give a model name or a path");
  std::error_code ec;
  const fs::path as_path(name_or_path);
  if (fs::is_regular_file(as_path, ec)) {
    if (!has_gguf_extension(as_path)) {
      TESSERA_FAIL("model '" << name_or_path << "' is a file but not a .gguf file; pass a .gguf file or a model folder");
    }
    return gguf_model(name_or_path, as_path);
  }
  if (fs::is_directory(as_path, ec)) return folder_model(name_or_path, as_path);

  const fs::path model_dir = default_model_dir();
  // A bare name only: never resolve "../x" or absolute paths against the model directory.
  const bool bare_name = as_path.is_relative() && name_or_path.find("..") == std::string::npos;
  if (bare_name) {
    const fs::path in_dir = model_dir / as_path;
    if (fs::is_directory(in_dir, ec)) return folder_model(name_or_path, in_dir);
    if (fs::is_regular_file(in_dir, ec) && has_gguf_extension(in_dir)) return gguf_model(name_or_path, in_dir);
  }
  std::string available;
  for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
    if (entry.is_directory(ec)) available += (available.empty() ? "" : ", ") + entry.path().filename().string();
  }
  TESSERA_FAIL("model '" << name_or_path << "' not found: it is not a folder or .gguf path, nor a folder in the model directory "
                         << model_dir.string() << " (set by TESSERA_MODEL_DIR; scripts/fetch-models installs the defaults); "
                         << (available.empty() ? std::string("that directory has no models") : "available: " + available));
}

ModelConfig load_model_config(const ModelFiles& files) {
  if (files.format == ModelFormat::kGguf) {
    if (files.gguf) return model_config_from_gguf(*files.gguf);
    return model_config_from_gguf(GgufFile::open(files.gguf_path));
  }
  const fs::path config_path = fs::path(files.dir) / "config.json";
  ModelConfig config = model_config_from_hf(read_json_file(config_path), config_path.string());
  if (config.arch == Architecture::kBert) {
    apply_sentence_transformers(config, files.dir);
    config.validate();
  }
  return config;
}

WeightStore load_weights(const ModelFiles& files) {
  if (files.format == ModelFormat::kGguf) {
    if (files.gguf) return files.gguf->to_weight_store();
    return GgufFile::open(files.gguf_path).to_weight_store();
  }
  return load_safetensors(files.dir);
}

std::string model_sha256(const ModelFiles& files) {
  std::vector<std::string> paths;
  if (files.format == ModelFormat::kGguf) {
    paths.push_back(files.gguf_path);
  } else {
    for (const auto& entry : fs::directory_iterator(files.dir)) {
      if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
    }
    std::sort(paths.begin(), paths.end());
  }
  TESSERA_CHECK(!paths.empty(), "model hash: no weight files in " << files.dir);
  return files_sha256(paths);
}

}  // namespace tessera
