// models/config/model_config.cpp: ModelConfig from HF config.json, sentence-transformers files and
// GGUF metadata, and its validation.
#include "models/config/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/weights/gguf.h"

namespace tessera {
namespace {

using nlohmann::json;

struct ArchName {
  const char* hf_name;
  Architecture arch;
};
constexpr ArchName kHfArchitectures[] = {
    {"LlamaForCausalLM", Architecture::kLlama},  {"LlamaModel", Architecture::kLlama},
    {"MistralForCausalLM", Architecture::kMistral}, {"MistralModel", Architecture::kMistral},
    {"BertModel", Architecture::kBert},          {"BertForMaskedLM", Architecture::kBert},
    {"BertForPreTraining", Architecture::kBert},
};
constexpr ArchName kModelTypes[] = {
    {"llama", Architecture::kLlama}, {"mistral", Architecture::kMistral}, {"bert", Architecture::kBert}};

std::string supported_hf_architectures() {
  std::string out;
  for (const ArchName& a : kHfArchitectures) out += (out.empty() ? "" : ", ") + std::string(a.hf_name);
  return out;
}

// Typed field access on config.json: absent and null read as "not given"; a value of the wrong
// type is an error naming the field.
class JsonFields {
 public:
  JsonFields(const json& doc, const std::string& source) : doc_(doc), source_(source) {}

  const json* find(const std::string& key) const {
    auto it = doc_.find(key);
    if (it == doc_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<int64_t> opt_int(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_integer() && !(v->is_number_unsigned() &&
                                     v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return v->get<int64_t>();
    }
    TESSERA_FAIL(source_ << ": field '" << key << "' must be an integer, got " << v->dump());
  }
  int64_t req_int(const std::string& key) const {
    if (std::optional<int64_t> v = opt_int(key)) return *v;
    TESSERA_FAIL(source_ << ": missing integer field '" << key << "'");
  }
  std::optional<double> opt_float(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number()) return v->get<double>();
    TESSERA_FAIL(source_ << ": field '" << key << "' must be a number, got " << v->dump());
  }
  std::optional<bool> opt_bool(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_boolean()) return v->get<bool>();
    TESSERA_FAIL(source_ << ": field '" << key << "' must be true or false, got " << v->dump());
  }
  std::optional<std::string> opt_string(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_string()) return v->get<std::string>();
    TESSERA_FAIL(source_ << ": field '" << key << "' must be a string, got " << v->dump());
  }
  // eos_token_id is an integer or a list of integers.
  std::vector<int64_t> int_or_list(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return {};
    if (v->is_number_integer()) return {v->get<int64_t>()};
    if (v->is_array()) {
      std::vector<int64_t> out;
      for (const json& item : *v) {
        if (!item.is_number_integer()) TESSERA_FAIL(source_ << ": field '" << key << "' must hold integers, got " << v->dump());
        out.push_back(item.get<int64_t>());
      }
      return out;
    }
    TESSERA_FAIL(source_ << ": field '" << key << "' must be an integer or a list of integers, got " << v->dump());
  }

 private:
  const json& doc_;
  const std::string& source_;
};

Architecture resolve_hf_architecture(const json& config, const std::string& source) {
  auto archs = config.find("architectures");
  if (archs != config.end() && !archs->is_null()) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      TESSERA_FAIL(source << ": field 'architectures' must be a non-empty list of names, got " << archs->dump());
    }
    const auto name = (*archs)[0].get<std::string>();
    for (const ArchName& a : kHfArchitectures) {
      if (name == a.hf_name) return a.arch;
    }
    TESSERA_FAIL(source << ": unsupported architecture '" << name << "'; supported: " << supported_hf_architectures());
  }
  auto type = config.find("model_type");
  if (type != config.end() && type->is_string()) {
    const auto name = type->get<std::string>();
    for (const ArchName& a : kModelTypes) {
      if (name == a.hf_name) return a.arch;
    }
    TESSERA_FAIL(source << ": unsupported model_type '" << name << "'; supported: llama, mistral, bert");
  }
  TESSERA_FAIL(source << ": neither 'architectures' nor 'model_type' says what the model is; supported: "
                      << supported_hf_architectures());
}

// "rope_scaling" (transformers 4.x), or "rope_parameters" (newer configs, which also carry
// rope_theta and say "default" when there is no scaling).
RopeScaling read_rope_scaling(const json& config, const std::string& source) {
  RopeScaling scaling;
  const char* field = "rope_scaling";
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) {
    field = "rope_parameters";
    it = config.find(field);
  }
  if (it == config.end() || it->is_null()) return scaling;
  if (!it->is_object()) TESSERA_FAIL(source << ": field '" << field << "' must be an object or null, got " << it->dump());
  const std::string where = source + " (" + field + ")";
  JsonFields fields(*it, where);
  std::optional<std::string> type = fields.opt_string("rope_type");
  if (!type) type = fields.opt_string("type");
  if (!type) TESSERA_FAIL(source << ": field '" << field << "' has no 'rope_type'");
  if (*type == "default") return scaling;
  if (*type != "llama3") {
    TESSERA_FAIL(source << ": " << field << " type '" << *type << "' is not supported; supported: llama3, default");
  }
  auto required = [&](const char* key) {
    if (std::optional<double> v = fields.opt_float(key)) return *v;
    TESSERA_FAIL(source << ": " << field << " of type llama3 needs field '" << key << "'");
  };
  scaling.kind = RopeScaling::Kind::kLlama3;
  scaling.factor = required("factor");
  scaling.low_freq_factor = required("low_freq_factor");
  scaling.high_freq_factor = required("high_freq_factor");
  if (std::optional<int64_t> v = fields.opt_int("original_max_position_embeddings")) {
    scaling.original_max_position_embeddings = *v;
  } else {
    TESSERA_FAIL(source << ": " << field << " of type llama3 needs field 'original_max_position_embeddings'");
  }
  return scaling;
}

}  // namespace

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama: return "llama";
    case Architecture::kMistral: return "mistral";
    case Architecture::kBert: return "bert";
  }
  return "?";
}

const char* pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::kNone: return "none";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
  }
  return "?";
}

const char* rope_scaling_name(RopeScaling::Kind kind) {
  return kind == RopeScaling::Kind::kLlama3 ? "llama3" : "none";
}

void ModelConfig::validate() const {
  auto positive = [&](const char* field, int64_t value) {
    if (value <= 0) TESSERA_FAIL(source << ": " << field << " = " << value << ", expected a positive integer");
  };
  positive("num_layers", num_layers);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_heads", num_heads);
  positive("num_kv_heads", num_kv_heads);
  positive("head_dim", head_dim);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  if (num_heads % num_kv_heads != 0) {
    TESSERA_FAIL(source << ": num_kv_heads = " << num_kv_heads << ", expected a divisor of num_heads = " << num_heads);
  }
  if (!(norm_eps > 0.0) || !std::isfinite(norm_eps)) {
    TESSERA_FAIL(source << ": norm_eps = " << norm_eps << ", expected a positive number");
  }
  auto token_in_vocab = [&](const char* field, int64_t id) {
    if (id < -1 || id >= vocab_size) {
      TESSERA_FAIL(source << ": " << field << " = " << id << ", expected a token id below vocab_size = " << vocab_size);
    }
  };
  token_in_vocab("bos_token_id", bos_token_id);
  token_in_vocab("pad_token_id", pad_token_id);
  for (int64_t id : eos_token_ids) token_in_vocab("eos_token_ids", id);

  if (arch == Architecture::kBert) {
    if (num_kv_heads != num_heads) {
      TESSERA_FAIL(source << ": num_kv_heads = " << num_kv_heads << ", expected num_heads = " << num_heads << " for BERT");
    }
    if (head_dim * num_heads != hidden_size) {
      TESSERA_FAIL(source << ": head_dim = " << head_dim << ", expected hidden_size / num_heads = " << hidden_size << " / "
                          << num_heads << " for BERT");
    }
    positive("type_vocab_size", type_vocab_size);
    if (hidden_act.empty()) TESSERA_FAIL(source << ": hidden_act is empty, expected an activation name such as gelu");
    if (max_seq_length) positive("max_seq_length", *max_seq_length);
    return;
  }
  // Decoders use rotate-half RoPE over the whole head.
  if (head_dim % 2 != 0) TESSERA_FAIL(source << ": head_dim = " << head_dim << ", expected an even number (RoPE)");
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta)) {
    TESSERA_FAIL(source << ": rope_theta = " << rope_theta << ", expected a positive number");
  }
  if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
    if (!(rope_scaling.factor >= 1.0)) {
      TESSERA_FAIL(source << ": rope_scaling.factor = " << rope_scaling.factor << ", expected >= 1");
    }
    if (!(rope_scaling.low_freq_factor > 0.0) || !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
      TESSERA_FAIL(source << ": rope_scaling.high_freq_factor = " << rope_scaling.high_freq_factor
                          << ", expected more than low_freq_factor = " << rope_scaling.low_freq_factor << " > 0");
    }
    positive("rope_scaling.original_max_position_embeddings", rope_scaling.original_max_position_embeddings);
  }
  if (sliding_window) {
    if (arch != Architecture::kMistral) {
      TESSERA_FAIL(source << ": sliding_window = " << *sliding_window << " is only supported for mistral, not "
                          << architecture_name(arch));
    }
    positive("sliding_window", *sliding_window);
  }
}

ModelConfig model_config_from_hf(const json& config, const std::string& source) {
  if (!config.is_object()) TESSERA_FAIL(source << ": expected a JSON object, got " << config.type_name());
  ModelConfig c;
  c.source = source;
  c.arch = resolve_hf_architecture(config, source);
  JsonFields f(config, source);

  c.num_layers = f.req_int("num_hidden_layers");
  c.hidden_size = f.req_int("hidden_size");
  c.intermediate_size = f.req_int("intermediate_size");
  c.num_heads = f.req_int("num_attention_heads");
  c.vocab_size = f.req_int("vocab_size");
  c.max_position_embeddings = f.req_int("max_position_embeddings");
  c.bos_token_id = f.opt_int("bos_token_id").value_or(-1);
  c.eos_token_ids = f.int_or_list("eos_token_id");
  c.pad_token_id = f.opt_int("pad_token_id").value_or(-1);

  if (c.arch == Architecture::kBert) {
    c.num_kv_heads = c.num_heads;
    if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0) {
      TESSERA_FAIL(source << ": hidden_size = " << c.hidden_size << " must split evenly into num_attention_heads = "
                          << c.num_heads);
    }
    c.head_dim = c.hidden_size / c.num_heads;
    c.norm_eps = f.opt_float("layer_norm_eps").value_or(1e-12);  // transformers' BertConfig default
    c.type_vocab_size = f.opt_int("type_vocab_size").value_or(2);
    c.hidden_act = f.opt_string("hidden_act").value_or("gelu");
    const std::string position = f.opt_string("position_embedding_type").value_or("absolute");
    if (position != "absolute") {
      TESSERA_FAIL(source << ": position_embedding_type '" << position << "' is not supported; supported: absolute");
    }
    // Sentence embeddings: mean pooling unless sentence-transformers files say otherwise.
    c.pooling = Pooling::kMean;
    c.validate();
    return c;
  }

  c.num_kv_heads = f.opt_int("num_key_value_heads").value_or(c.num_heads);
  if (std::optional<int64_t> head_dim = f.opt_int("head_dim")) {
    c.head_dim = *head_dim;  // explicit: kept as given, even when hidden_size / num_heads differs
  } else {
    if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0) {
      TESSERA_FAIL(source << ": hidden_size = " << c.hidden_size << " must split evenly into num_attention_heads = "
                          << c.num_heads << " when head_dim is not given");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.norm_eps = f.opt_float("rms_norm_eps").value_or(1e-6);  // transformers' Llama/Mistral default
  c.rope_theta = f.opt_float("rope_theta").value_or(10000.0);
  if (const json* params = f.find("rope_parameters"); params != nullptr && params->is_object() && !f.find("rope_theta")) {
    c.rope_theta = JsonFields(*params, source).opt_float("rope_theta").value_or(c.rope_theta);
  }
  c.rope_scaling = read_rope_scaling(config, source);
  c.tie_word_embeddings = f.opt_bool("tie_word_embeddings").value_or(false);
  c.hidden_act = f.opt_string("hidden_act").value_or("silu");
  if (c.arch == Architecture::kMistral) {
    // null means full attention; an absent key takes transformers' MistralConfig default (4096).
    if (config.contains("sliding_window")) {
      c.sliding_window = f.opt_int("sliding_window");
    } else {
      c.sliding_window = 4096;
    }
  }
  c.validate();
  return c;
}

namespace {

json read_st_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) TESSERA_FAIL(path.string() << ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    TESSERA_FAIL(path.string() << ": bad JSON: " << e.what());
  }
}

// sentence_bert_config.json in `folder`: its max_seq_length, nullopt when the file or the key is
// absent (or null, as sentence-transformers writes an unset one).
std::optional<int64_t> read_max_seq_length(const std::filesystem::path& folder) {
  const std::filesystem::path path = folder / "sentence_bert_config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  const json st = read_st_json(path);
  if (!st.is_object()) TESSERA_FAIL(path.string() << ": expected a JSON object");
  const auto it = st.find("max_seq_length");
  if (it == st.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < 1) {
    TESSERA_FAIL(path.string() << ": max_seq_length = " << it->dump() << ", expected a positive integer");
  }
  return it->get<int64_t>();
}

}  // namespace

void apply_sentence_transformers(ModelConfig& config, const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path modules_path = fs::path(model_dir) / "modules.json";
  if (!fs::exists(modules_path)) {
    // Not packaged as sentence-transformers modules: a sentence_bert_config.json beside config.json
    // still says how long its inputs may be.
    if (std::optional<int64_t> v = read_max_seq_length(model_dir)) config.max_seq_length = v;
    return;
  }
  const json modules = read_st_json(modules_path);
  if (!modules.is_array()) TESSERA_FAIL(modules_path.string() << ": expected a list of modules");
  // Module paths are folders inside the model; never follow one out of it.
  auto inside = [&](const std::string& path, const char* module) {
    if (fs::path(path).is_absolute() || path.find("..") != std::string::npos) {
      TESSERA_FAIL(modules_path.string() << ": " << module << " module path '" << path
                                         << "' is not a folder inside the model");
    }
    return fs::path(model_dir) / path;
  };
  bool normalize = false;
  std::optional<Pooling> pooling;
  std::optional<int64_t> max_seq_length;
  for (const json& module : modules) {
    if (!module.is_object() || !module.contains("type") || !module["type"].is_string()) {
      TESSERA_FAIL(modules_path.string() << ": each module needs a string 'type', got " << module.dump());
    }
    const auto type = module["type"].get<std::string>();
    const std::string path = module.value("path", "");
    if (type == "sentence_transformers.models.Transformer") {
      // The Transformer module keeps its sentence_bert_config.json in its own folder ("" = the root).
      max_seq_length = read_max_seq_length(inside(path, "Transformer"));
      continue;
    }
    if (type == "sentence_transformers.models.Normalize") {
      normalize = true;
      continue;
    }
    if (type != "sentence_transformers.models.Pooling") {
      TESSERA_FAIL(modules_path.string() << ": module '" << type
                                         << "' is not supported (supported: Transformer, Pooling, Normalize)");
    }
    if (path.empty()) {
      TESSERA_FAIL(modules_path.string() << ": Pooling module path '" << path << "' is not a folder inside the model");
    }
    const fs::path pooling_path = inside(path, "Pooling") / "config.json";
    const json pooling_config = read_st_json(pooling_path);
    if (!pooling_config.is_object()) TESSERA_FAIL(pooling_path.string() << ": expected a JSON object");
    std::vector<std::string> modes;
    for (const auto& [key, value] : pooling_config.items()) {
      if (key.rfind("pooling_mode_", 0) == 0 && value.is_boolean() && value.get<bool>()) modes.push_back(key);
    }
    if (pooling_config.contains("pooling_mode") && pooling_config["pooling_mode"].is_string()) {
      modes.push_back("pooling_mode_" + pooling_config["pooling_mode"].get<std::string>() + "_tokens");
    }
    if (modes.size() != 1) {
      TESSERA_FAIL(pooling_path.string() << ": expected exactly one pooling mode set to true, found " << modes.size());
    }
    if (modes[0] == "pooling_mode_mean_tokens") {
      pooling = Pooling::kMean;
    } else if (modes[0] == "pooling_mode_cls_token" || modes[0] == "pooling_mode_cls_tokens") {
      pooling = Pooling::kCls;
    } else {
      TESSERA_FAIL(pooling_path.string() << ": pooling mode '" << modes[0]
                                         << "' is not supported; supported: pooling_mode_mean_tokens, pooling_mode_cls_token");
    }
  }
  if (pooling) config.pooling = *pooling;
  config.normalize_embeddings = normalize;
  config.max_seq_length = max_seq_length;
}

ModelConfig model_config_from_gguf(const GgufFile& gguf) {
  ModelConfig c;
  c.source = gguf.path();
  const std::string arch = gguf.get_string("general.architecture");
  if (arch != "llama") {
    TESSERA_FAIL(gguf.path() << ": unsupported architecture '" << arch << "' (general.architecture); supported: llama");
  }
  c.arch = Architecture::kLlama;
  const std::string p = arch + ".";
  c.num_layers = gguf.get_int(p + "block_count");
  c.hidden_size = gguf.get_int(p + "embedding_length");
  c.intermediate_size = gguf.get_int(p + "feed_forward_length");
  c.num_heads = gguf.get_int(p + "attention.head_count");
  c.num_kv_heads = gguf.find_int(p + "attention.head_count_kv").value_or(c.num_heads);
  c.max_position_embeddings = gguf.get_int(p + "context_length");
  c.norm_eps = gguf.get_float(p + "attention.layer_norm_rms_epsilon");
  c.rope_theta = gguf.find_float(p + "rope.freq_base").value_or(10000.0);
  c.hidden_act = "silu";

  if (std::optional<int64_t> vocab = gguf.find_int(p + "vocab_size")) {
    c.vocab_size = *vocab;
  } else {
    auto tokens = gguf.metadata().find("tokenizer.ggml.tokens");
    if (tokens == gguf.metadata().end() || !std::holds_alternative<GgufArray>(tokens->second.value)) {
      TESSERA_FAIL(gguf.path() << ": neither '" << p << "vocab_size' nor the array 'tokenizer.ggml.tokens' gives the vocab size");
    }
    c.vocab_size = static_cast<int64_t>(std::get<GgufArray>(tokens->second.value).size());
  }

  // head_dim: attention.key_length when given; rope.dimension_count is the rotated width, which
  // must be the whole head here (no partial rotary).
  const std::optional<int64_t> key_length = gguf.find_int(p + "attention.key_length");
  const std::optional<int64_t> rope_dims = gguf.find_int(p + "rope.dimension_count");
  if (key_length) {
    c.head_dim = *key_length;
  } else if (rope_dims) {
    c.head_dim = *rope_dims;
  } else {
    if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0) {
      TESSERA_FAIL(gguf.path() << ": " << p << "embedding_length = " << c.hidden_size << " must split evenly into "
                               << p << "attention.head_count = " << c.num_heads);
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (rope_dims && *rope_dims != c.head_dim) {
    TESSERA_FAIL(gguf.path() << ": " << p << "rope.dimension_count = " << *rope_dims << ", expected the head dim "
                             << c.head_dim << " (partial rotary embeddings are not supported)");
  }
  if (std::optional<std::string> scaling = gguf.find_string(p + "rope.scaling.type");
      scaling && *scaling != "none") {
    TESSERA_FAIL(gguf.path() << ": " << p << "rope.scaling.type = '" << *scaling << "' is not supported; supported: none");
  }

  bool has_output = false;
  for (const GgufTensorInfo& t : gguf.tensors()) {
    has_output = has_output || t.name == "output.weight";
    if (t.name == "rope_freqs.weight") {
      // llama.cpp stores Llama-3 RoPE scaling as per-frequency factors, not as parameters.
      TESSERA_FAIL(gguf.path() << ": tensor 'rope_freqs.weight' (RoPE frequency factors) is not supported; "
                                  "load this model from its HF config.json with rope_scaling instead");
    }
  }
  c.tie_word_embeddings = !has_output;

  c.bos_token_id = gguf.find_int("tokenizer.ggml.bos_token_id").value_or(-1);
  if (std::optional<int64_t> eos = gguf.find_int("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {*eos};
  c.pad_token_id = gguf.find_int("tokenizer.ggml.padding_token_id").value_or(-1);
  c.validate();
  return c;
}

}  // namespace tessera
