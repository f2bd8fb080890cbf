// tuner/profile.cpp: profile.yaml writing and strict reading, identity checks, applying a choice.
#include "tuner/profile.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "common/error.h"
#ifdef TESSERA_HAVE_CUDA
#include "kernels/backend/cuda/cuda_backend.h"
#endif
#include "models/calibrated_weights.h"
#include "models/sha256.h"
#include "models/weights/requantize.h"
#include "tuner/build_commit.h"
#include "tuner/yaml_reader.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.0.0"
#endif

namespace tessera::tuner {

namespace {

const char* fused_word(bool fused) { return fused ? "fused" : "separate"; }

void emit_json(YAML::Emitter& out, const nlohmann::json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emit_json(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& v : j) emit_json(out, v);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    out << j.get<std::string>();
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else if (j.is_number()) {
    out << j.get<double>();
  } else {
    out << YAML::Null;
  }
}

nlohmann::json node_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = n.begin(); it != n.end(); ++it) out[it->first.Scalar()] = node_to_json(it->second);
    return out;
  }
  if (n.IsSequence()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : n) out.push_back(node_to_json(v));
    return out;
  }
  if (!n.IsScalar()) return nullptr;
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted in the file: a string, whatever it looks like
  if (s == "true" || s == "false") return s == "true";
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && end == s.c_str() + s.size()) return i;
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end == s.c_str() + s.size()) return d;
  return s;
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), what << ": cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Profile::metric_labels() const {
  return {{"path", path},
          {"model_sha256", model_sha256.substr(0, 16)},
          {"device", device},
          {"weight_format", choice.weight_format},
          {"kv_dtype", choice.kv_dtype},
          {"fusions", std::string("add_rms_norm=") + fused_word(choice.fuse_add_rms_norm) +
                          ",qkv=" + fused_word(choice.fuse_qkv) + ",gate_up=" + choice.gate_up},
          {"threads", std::to_string(choice.threads)},
          {"activation_bits", choice.activation_bits == 0 ? std::string("default") : std::to_string(choice.activation_bits)},
          {"decode_split_min_tokens",
           choice.decode_split_min_tokens == 0 ? std::string("default") : std::to_string(choice.decode_split_min_tokens)},
          {"commit", tessera_commit.substr(0, 12)}};
}

std::string profile_yaml(const Profile& p) {
  YAML::Emitter out;
  out.SetDoublePrecision(6);  // timings in ms to the microsecond; more digits are noise
  out << YAML::BeginMap;
  out << YAML::Key << "tessera_profile" << YAML::Value << 1;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << p.model_name;
  out << YAML::Key << "sha256" << YAML::Value << p.model_sha256;
  out << YAML::Key << "architecture" << YAML::Value << p.architecture;
  out << YAML::EndMap;
  out << YAML::Key << "device" << YAML::Value << YAML::DoubleQuoted << p.device;
  out << YAML::Key << "backend" << YAML::Value << p.backend;
  out << YAML::Key << "tessera" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "version" << YAML::Value << YAML::DoubleQuoted << p.tessera_version;
  out << YAML::Key << "commit" << YAML::Value << YAML::DoubleQuoted << p.tessera_commit;
  out << YAML::EndMap;
  out << YAML::Key << "created" << YAML::Value << YAML::DoubleQuoted << p.created;
  out << YAML::Key << "space" << YAML::Value << p.space;
  out << YAML::Key << "policy" << YAML::Value << YAML::DoubleQuoted << p.policy;
  out << YAML::Key << "reason" << YAML::Value << YAML::DoubleQuoted << p.reason;
  const Candidate& c = p.choice;
  out << YAML::Key << "choice" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "weight_format" << YAML::Value << c.weight_format;
  out << YAML::Key << "kv_dtype" << YAML::Value << c.kv_dtype;
  out << YAML::Key << "fusions" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "add_rms_norm" << YAML::Value << fused_word(c.fuse_add_rms_norm);
  out << YAML::Key << "qkv" << YAML::Value << fused_word(c.fuse_qkv);
  out << YAML::Key << "gate_up" << YAML::Value << c.gate_up;
  out << YAML::Key << "rope_kv_write" << YAML::Value << fused_word(c.rope_in_kv_write);
  out << YAML::EndMap;
  out << YAML::Key << "cuda_graphs" << YAML::Value << c.cuda_graphs;
  out << YAML::Key << "kernels" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "threads" << YAML::Value << c.threads;
  if (c.activation_bits != 0) out << YAML::Key << "activation_bits" << YAML::Value << c.activation_bits;
  if (c.decode_split_min_tokens != 0) {
    out << YAML::Key << "decode_split_min_tokens" << YAML::Value << c.decode_split_min_tokens;
  }
  out << YAML::EndMap;
  out << YAML::EndMap;
  out << YAML::Key << "measured" << YAML::Value;
  emit_json(out, p.measured.is_null() ? nlohmann::json::object() : p.measured);
  out << YAML::EndMap;
  return std::string("# Tessera tuner profile (tessera tune). Load with `tessera serve --profile` or the config key "
                     "`profile:`.\n") +
         out.c_str() + "\n";
}

Profile parse_profile(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    TESSERA_FAIL(source << ": not valid YAML: " << e.what());
  }
  Profile p;
  p.path = source;
  YamlMap top(root, source, "");
  int version = 0;
  top.get("tessera_profile", version);
  if (version != 1) top.fail("tessera_profile", "expected 1 (this build reads version 1 profiles)");
  {
    YamlMap model(top.node("model"), source, "model");
    model.get("name", p.model_name);
    model.get("sha256", p.model_sha256);
    model.get("architecture", p.architecture);
    if (p.model_sha256.size() != 64) model.fail("sha256", "expected 64 hex digits");
    model.finish();
  }
  top.get("device", p.device);
  top.get("backend", p.backend);
  if (p.backend != "cpu" && p.backend != "cuda") top.fail("backend", "expected cpu or cuda, got '" + p.backend + "'");
  {
    YamlMap build(top.node("tessera"), source, "tessera");
    build.get("version", p.tessera_version);
    build.get("commit", p.tessera_commit);
    build.finish();
  }
  top.get("created", p.created);
  top.get("space", p.space);
  top.get("policy", p.policy);
  top.get("reason", p.reason);
  {
    YamlMap choice(top.node("choice"), source, "choice");
    Candidate& c = p.choice;
    choice.get("weight_format", c.weight_format);
    const std::vector<std::string>& formats = p.backend == "cpu" ? kCpuWeightFormats : kGpuWeightFormats;
    if (std::find(formats.begin(), formats.end(), c.weight_format) == formats.end()) {
      choice.fail("weight_format", "'" + c.weight_format + "' is not a " + p.backend + " weight format");
    }
    choice.get("kv_dtype", c.kv_dtype);
    {
      YamlMap fusions(choice.node("fusions"), source, "choice.fusions");
      const auto fused = [&](const char* key, bool& out) {
        std::string word = fused_word(out);
        fusions.get(key, word);
        if (word != "fused" && word != "separate") fusions.fail(key, "expected fused or separate, got '" + word + "'");
        out = word == "fused";
      };
      fused("add_rms_norm", c.fuse_add_rms_norm);
      fused("qkv", c.fuse_qkv);
      fusions.get("gate_up", c.gate_up);
      if (c.gate_up != "fused" && c.gate_up != "separate" && c.gate_up != "epilogue") {
        fusions.fail("gate_up", "expected fused, separate or epilogue, got '" + c.gate_up + "'");
      }
      fused("rope_kv_write", c.rope_in_kv_write);
      fusions.finish();
    }
    choice.get("cuda_graphs", c.cuda_graphs);
    {
      YamlMap kernels(choice.node("kernels"), source, "choice.kernels");
      kernels.get("threads", c.threads);
      kernels.get("activation_bits", c.activation_bits);
      kernels.get("decode_split_min_tokens", c.decode_split_min_tokens);
      kernels.finish();
    }
    choice.finish();
  }
  const YAML::Node measured = top.node("measured");
  if (measured.IsDefined() && !measured.IsNull()) p.measured = node_to_json(measured);
  top.finish();
  return p;
}

Profile load_profile(const std::string& path) { return parse_profile(read_text(path, "profile"), path); }

std::string random_weights_sha256(const ModelFiles& files, uint64_t seed) {
  return sha256_hex("tessera random bf16 weights, seed " + std::to_string(seed) + ", for:\n",
                    {(std::filesystem::path(files.dir) / "config.json").string()});
}

std::string this_device(const std::string& backend) {
  if (backend == "cuda") {
#ifdef TESSERA_HAVE_CUDA
    TESSERA_CHECK(cuda_device_count() > 0, "backend cuda: no CUDA GPU is visible");
    const std::string description = cuda_device_description(0);  // "NVIDIA H100 80GB HBM3 (sm_90, ...)"
    return "cuda: " + description.substr(0, description.find(" ("));
#else
    TESSERA_FAIL("backend cuda: this binary has no CUDA backend (configure with -DTESSERA_CUDA=ON)");
#endif
  }
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string name = line.substr(colon + 1);
    name.erase(0, name.find_first_not_of(" \t"));
    return "cpu: " + name;
  }
  return "cpu: unknown";
}

std::string tessera_version() { return TESSERA_VERSION; }
std::string tessera_commit() { return TESSERA_COMMIT; }

std::string current_int4_weights_source(const Candidate& choice, const ModelFiles& files) {
  return choice.weight_format == "int4_g128" ? int4_weights_source(open_calibration_sidecar(files)) : "";
}

std::vector<std::string> check_profile(const Profile& p, const std::string& sha, const std::string& device,
                                       const std::string& backend, const std::string& int4_weights_source, bool force) {
  std::vector<std::string> problems;
  if (p.model_sha256 != sha) {
    problems.push_back("it was tuned for model " + p.model_name + " with sha256 " + p.model_sha256.substr(0, 16) +
                       "..., and the model served has sha256 " + sha.substr(0, 16) + "...");
  }
  if (p.device != device) {
    problems.push_back("it was tuned on '" + p.device + "', and this machine is '" + device + "'");
  }
  // Profiles from before the field was recorded say nothing about it.
  if (p.choice.weight_format == "int4_g128" && p.measured.contains("weights_source") &&
      p.measured.at("weights_source") != int4_weights_source) {
    problems.push_back("its int4_g128 weights were '" + p.measured.at("weights_source").get<std::string>() +
                       "', and the model's are now '" + int4_weights_source + "'");
  }
  if (!problems.empty() && !force) {
    std::string all;
    for (const std::string& s : problems) all += (all.empty() ? "" : "; ") + s;
    TESSERA_FAIL("profile " << p.path << " does not fit: " << all
                            << " (re-run tessera tune here, or pass --force to apply it anyway)");
  }
  TESSERA_CHECK(p.backend == backend, "profile " << p.path << ": backend " << p.backend << " choices cannot run on the "
                                                 << backend << " backend (re-run tessera tune with backend: "
                                                 << backend << ")");
  return problems;
}

GraphOptions choice_graph_options(const Candidate& c) {
  GraphOptions o;
  o.fuse_add_rms_norm = c.fuse_add_rms_norm;
  o.fuse_qkv = c.fuse_qkv;
  o.fuse_gate_up = c.gate_up != "separate";
  o.gate_up_epilogue = c.gate_up == "epilogue";
  o.rope_in_kv_write = c.rope_in_kv_write;
  return o;
}

CudaWeightsChoice cuda_weights_choice(const Candidate& c) {
  const bool quantized = c.weight_format != "bf16" && c.weight_format != "f16";
  return {c.weight_format == "f16" ? "fp16" : "bf16", quantized ? c.weight_format : "native",
          c.kv_dtype == "fp8_e4m3" ? "fp8_e4m3" : "native"};
}

WeightStore apply_weight_format(const ModelFiles& files, WeightStore weights, const Candidate& c) {
  if (c.weight_format == "gguf") return weights;
  // int8 / int4_g128 / fp8_e4m3: the CUDA backend quantizes the linear weights as it loads them; for
  // int4_g128 from the model's calibration sidecar, where it has one.
  if (cuda_weights_choice(c).cuda_weights != "native" &&
      std::find(kGpuWeightFormats.begin(), kGpuWeightFormats.end(), c.weight_format) != kGpuWeightFormats.end()) {
    return overlay_calibrated_weights(files, std::move(weights), *scalar_type_from_name(c.weight_format));
  }
  const std::optional<DType> target = weight_format_from_name(c.weight_format);
  TESSERA_CHECK(target.has_value(), "choice.weight_format: " << c.weight_format << " has no kernels in this build");
  return requantize_weights(std::move(weights), *target);
}

void check_choice_runs_on(const Candidate& c, const std::string& backend, const std::string& source) {
  const auto refuse = [&](const std::string& field, const std::string& why) {
    TESSERA_FAIL(source << ": choice." << field << ": " << why);
  };
  if (backend == "cpu") {
    if (std::find(kCpuWeightFormats.begin(), kCpuWeightFormats.end(), c.weight_format) == kCpuWeightFormats.end()) {
      refuse("weight_format", c.weight_format + " is not a cpu weight format");
    }
    if (c.kv_dtype != "f32") refuse("kv_dtype", "the cpu backend keeps its KV cache in f32, not " + c.kv_dtype);
    if (c.cuda_graphs) refuse("cuda_graphs", "true needs the cuda backend");
    if (c.activation_bits != 0 && c.activation_bits != 8 && c.activation_bits != 16) {
      refuse("kernels.activation_bits", "expected 8 or 16, got " + std::to_string(c.activation_bits));
    }
    if (c.gate_up == "epilogue") refuse("fusions.gate_up", "epilogue is a cuda backend kernel");
    if (c.rope_in_kv_write) refuse("fusions.rope_kv_write", "fused is a cuda backend kernel");
    if (c.decode_split_min_tokens != 0) {
      refuse("kernels.decode_split_min_tokens", "applies to the cuda backend's decode attention");
    }
  } else if (backend == "cuda") {
    if (std::find(kGpuWeightFormats.begin(), kGpuWeightFormats.end(), c.weight_format) == kGpuWeightFormats.end()) {
      refuse("weight_format", c.weight_format + " is not a cuda weight format");
    }
    const std::string activations = c.weight_format == "f16" ? "f16" : "bf16";
    if (c.kv_dtype == "fp8_e4m3" && activations != "bf16") {
      refuse("kv_dtype", "fp8_e4m3 needs bf16 activations (its kernels take bf16), not weight format " + c.weight_format);
    }
    if (c.kv_dtype != activations && c.kv_dtype != "fp8_e4m3") {
      refuse("kv_dtype", "the cuda backend keeps its KV cache in the activation dtype, " + activations + " with weight "
                         "format " + c.weight_format + ", or in fp8_e4m3, not " + c.kv_dtype);
    }
    const int split = c.decode_split_min_tokens;
    if (split != 0 && (split < 32 || split > 1024 || split % 32 != 0)) {
      refuse("kernels.decode_split_min_tokens", "expected a multiple of 32 in [32, 1024], got " + std::to_string(split));
    }
  } else {
    refuse("backend", "unknown backend " + backend);
  }
}

nlohmann::json yaml_to_json(const std::string& yaml_text) { return node_to_json(YAML::Load(yaml_text)); }

}  // namespace tessera::tuner
