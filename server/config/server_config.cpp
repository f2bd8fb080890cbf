// server/config/server_config.cpp: YAML -> ServerConfig with strict keys, `--set` overrides, validation.
#include "server/config/server_config.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "models/tokenizer/chat_template.h"

namespace tessera {
namespace {

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "null";
}

// Reads one YAML mapping, remembering which keys were read so that finish() can reject the rest.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {
    if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
      TESSERA_FAIL((path_.empty() ? std::string("config") : path_) << ": expected a mapping, got " << scalar_text(node_));
    }
  }

  const YAML::Node* find(const std::string& key) {
    known_.push_back(key);
    if (!node_.IsMap()) return nullptr;
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == key) {
        found_.push_back(it->second);
        return &found_.back();
      }
    }
    return nullptr;
  }

  void get(const std::string& key, std::string& out) {
    const YAML::Node* n = find(key);
    if (!n || n->IsNull()) return;
    if (!n->IsScalar()) type_error(key, "a string", *n);
    out = n->Scalar();
  }

  template <typename Int>
  void get_int(const std::string& key, Int& out) {
    const YAML::Node* n = find(key);
    if (!n || n->IsNull()) return;
    if (!n->IsScalar()) type_error(key, "an integer", *n);
    const std::string& s = n->Scalar();
    Int value{};
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) type_error(key, "an integer", *n);
    out = value;
  }
  void get(const std::string& key, int32_t& out) { get_int(key, out); }
  void get(const std::string& key, int64_t& out) { get_int(key, out); }
  template <typename Int>
  void get(const std::string& key, std::optional<Int>& out) {
    const YAML::Node* n = find(key);
    if (!n || n->IsNull()) return;
    Int value = 0;
    get_int(key, value);
    out = value;
  }

  void get(const std::string& key, double& out) {
    const YAML::Node* n = find(key);
    if (!n || n->IsNull()) return;
    if (!n->IsScalar()) type_error(key, "a number", *n);
    const std::string& s = n->Scalar();
    double value = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) type_error(key, "a number", *n);
    out = value;
  }
  void get(const std::string& key, float& out) {
    double value = out;
    get(key, value);
    out = static_cast<float>(value);
  }

  void get(const std::string& key, bool& out) {
    const YAML::Node* n = find(key);
    if (!n || n->IsNull()) return;
    if (n->IsScalar()) {
      const std::string& s = n->Scalar();
      if (s == "true" || s == "True" || s == "TRUE") { out = true; return; }
      if (s == "false" || s == "False" || s == "FALSE") { out = false; return; }
    }
    type_error(key, "a boolean (true or false)", *n);
  }

  void get(const std::string& key, std::vector<std::string>& out) {
    const YAML::Node* n = find(key);
    if (!n || n->IsNull()) return;
    if (!n->IsSequence()) type_error(key, "a list of strings", *n);
    out.clear();
    for (size_t i = 0; i < n->size(); ++i) {
      const YAML::Node item = (*n)[i];
      if (!item.IsScalar()) {
        TESSERA_FAIL(join_path(path_, key) << "[" << i << "]: expected a string, got " << scalar_text(item));
      }
      out.push_back(item.Scalar());
    }
  }

  std::string path(const std::string& key) const { return join_path(path_, key); }

  // Every key not read above is an error naming its full path.
  void finish() const {
    if (!node_.IsMap()) return;
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "?";
      if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
        std::ostringstream known;
        for (size_t i = 0; i < known_.size(); ++i) known << (i ? ", " : "") << known_[i];
        TESSERA_FAIL("unknown config key '" << join_path(path_, key) << "' (known keys"
                                            << (path_.empty() ? "" : " of '" + path_ + "'") << ": " << known.str()
                                            << ")");
      }
    }
  }

 private:
  [[noreturn]] void type_error(const std::string& key, const char* expected, const YAML::Node& got) const {
    TESSERA_FAIL(join_path(path_, key) << ": expected " << expected << ", got " << scalar_text(got));
  }

  YAML::Node node_;
  std::string path_;
  std::vector<std::string> known_;
  std::vector<YAML::Node> found_;
};

void read_listen(MapReader& parent, const std::string& key, ServerConfig::Listen& out) {
  const YAML::Node* n = parent.find(key);
  if (!n) return;
  MapReader r(*n, parent.path(key));
  r.get("enabled", out.enabled);
  r.get("host", out.host);
  r.get("port", out.port);
  r.finish();
}

void read_limits(MapReader& parent, ServerConfig::Limits& out) {
  const YAML::Node* n = parent.find("limits");
  if (!n) return;
  MapReader l(*n, "limits");
  l.get("max_queue_size", out.max_queue_size);
  l.get("max_batch_tokens", out.max_batch_tokens);
  l.get("max_running_sequences", out.max_running_sequences);
  l.get("prefill_chunk_tokens", out.prefill_chunk_tokens);
  l.get("max_prefills_per_step", out.max_prefills_per_step);
  l.get("max_model_len", out.max_model_len);
  l.get("kv_cache_tokens", out.kv_cache_tokens);
  l.get("kv_cache_memory_fraction", out.kv_cache_memory_fraction);
  l.get("max_body_bytes", out.max_body_bytes);
  l.get("request_timeout_s", out.request_timeout_s);
  l.get("drain_timeout_s", out.drain_timeout_s);
  l.get("engine_stall_timeout_s", out.engine_stall_timeout_s);
  l.get("exit_on_fatal_error", out.exit_on_fatal_error);
  l.finish();
}

// vLLM's key names for the drafters' settings.
void read_speculative(MapReader& parent, SpeculativeConfig& out) {
  const YAML::Node* n = parent.find("speculative");
  if (!n) return;
  MapReader sp(*n, "speculative");
  sp.get("method", out.method);
  sp.get("num_speculative_tokens", out.num_speculative_tokens);
  sp.get("disable_by_batch_size", out.disable_by_batch_size);
  sp.get("untimed_row_cost", out.untimed_row_cost);
  sp.get("prompt_lookup_min", out.ngram.min_n);
  sp.get("prompt_lookup_max", out.ngram.max_n);
  sp.get("prompt_lookup_unambiguous_min", out.ngram.unambiguous_min_n);
  sp.get("suffix_decoding_max_tree_depth", out.suffix.max_match);
  sp.get("suffix_decoding_max_cached_requests", out.suffix.max_cached_outputs);
  sp.get("suffix_decoding_min_token_prob", out.suffix.min_share);
  sp.get("draft_model", out.draft_model);
  sp.get("draft_kv_tokens", out.draft_kv_tokens);
  sp.finish();
}

ServedModelSpec::Kind parse_kind(const std::string& text, const std::string& path) {
  if (text == "auto") return ServedModelSpec::Kind::kAuto;
  if (text == "llm") return ServedModelSpec::Kind::kLlm;
  if (text == "embedding") return ServedModelSpec::Kind::kEmbedding;
  TESSERA_FAIL(path << ": expected one of llm, embedding, auto, got '" << text << "'");
}

void read_models(MapReader& parent, std::vector<ServedModelSpec>& out) {
  const YAML::Node* models = parent.find("models");
  if (!models || models->IsNull()) return;
  if (!models->IsSequence()) TESSERA_FAIL("models: expected a list of models, got " << scalar_text(*models));
  for (size_t i = 0; i < models->size(); ++i) {
    const std::string path = "models." + std::to_string(i);
    MapReader m((*models)[i], path);
    ServedModelSpec spec;
    std::string kind = "auto";
    m.get("name", spec.name);
    m.get("path", spec.path);
    m.get("kind", kind);
    m.get("chat_template", spec.chat_template);
    m.get("random_weights", spec.random_weights);
    m.get("tokenizer", spec.tokenizer);
    m.finish();
    spec.kind = parse_kind(kind, path + ".kind");
    if (spec.name.empty()) spec.name = spec.path;
    out.push_back(std::move(spec));
  }
}

ServerConfig from_yaml(const YAML::Node& root) {
  ServerConfig c;
  MapReader r(root, "");
  read_listen(r, "http", c.http);
  read_listen(r, "grpc", c.grpc);
  read_models(r, c.models);
  if (const YAML::Node* auth = r.find("auth")) {
    MapReader a(*auth, "auth");
    a.get("api_keys", c.auth.api_keys);
    a.get("protect_health", c.auth.protect_health);
    a.get("protect_metrics", c.auth.protect_metrics);
    a.finish();
  }
  read_limits(r, c.limits);
  if (const YAML::Node* debug = r.find("debug")) {
    MapReader d(*debug, "debug");
    d.get("step_delay_ms", c.debug.step_delay_ms);
    d.get("fail_step", c.debug.fail_step);
    d.finish();
  }
  read_speculative(r, c.speculative);
  if (const YAML::Node* metrics = r.find("metrics")) {
    MapReader m(*metrics, "metrics");
    m.get("prefix", c.metrics.prefix);
    m.finish();
  }
  r.get("backend", c.backend);
  r.get("device", c.device);
  r.get("tensor_parallel", c.tensor_parallel);
  r.get("dtype", c.dtype);
  r.get("cuda_graphs", c.cuda_graphs);
  r.get("cuda_weights", c.cuda_weights);
  r.get("cuda_decode_split_min_tokens", c.cuda_decode_split_min_tokens);
  r.get("cuda_kv_dtype", c.cuda_kv_dtype);
  r.get("prefix_caching", c.prefix_caching);
  r.get("cpu_weights", c.cpu_weights);
  r.get("cpu_activation_bits", c.cpu_activation_bits);
  r.get("threads", c.threads);
  r.get("http_threads", c.http_threads);
  r.get("log_level", c.log_level);
  r.get("profile", c.profile);
  r.finish();
  return c;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 7 && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  TESSERA_CHECK(eq != std::string::npos && eq > 0, "--set '" << assignment << "': expected key=value");
  const std::string key = assignment.substr(0, eq);
  const std::string value_text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception& e) {
    TESSERA_FAIL("--set " << key << ": value is not valid YAML: " << e.msg);
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string part; std::getline(ss, part, '.');) {
    TESSERA_CHECK(!part.empty(), "--set '" << key << "': empty key segment");
    parts.push_back(part);
  }
  // yaml-cpp nodes are references: reset() rebinds `cur`, while `cur = x` would overwrite the node.
  YAML::Node cur;
  cur.reset(root);
  std::string walked;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const bool last = i + 1 == parts.size();
    walked = join_path(walked, part);
    if (cur.IsSequence()) {
      TESSERA_CHECK(is_index(part), "--set " << key << ": '" << walked << "' indexes a list; expected a number");
      const size_t index = std::stoul(part);
      TESSERA_CHECK(index <= cur.size(), "--set " << key << ": index " << index << " is past the end of a list of "
                                                  << cur.size());
      if (index == cur.size()) cur.push_back(YAML::Node(YAML::NodeType::Map));
      if (last) {
        cur[index] = value;
      } else {
        YAML::Node next = cur[index];
        cur.reset(next);
      }
      continue;
    }
    if (!cur.IsMap()) {
      TESSERA_CHECK(cur.IsNull(), "--set " << key << ": '" << walked << "' is inside a value that is not a mapping");
      cur = YAML::Node(YAML::NodeType::Map);
    }
    if (last) {
      cur[part] = value;
    } else {
      YAML::Node next = cur[part];
      if (!next.IsDefined() || next.IsNull()) {
        // `models.0.x` on a config without models starts a list; anything else starts a mapping.
        next = is_index(parts[i + 1]) ? YAML::Node(YAML::NodeType::Sequence) : YAML::Node(YAML::NodeType::Map);
        cur[part] = next;
        next.reset(cur[part]);
      }
      cur.reset(next);
    }
  }
}

}  // namespace

const char* model_kind_name(ServedModelSpec::Kind kind) {
  switch (kind) {
    case ServedModelSpec::Kind::kAuto: return "auto";
    case ServedModelSpec::Kind::kLlm: return "llm";
    case ServedModelSpec::Kind::kEmbedding: return "embedding";
  }
  return "?";
}

void ServerConfig::validate() const {
  TESSERA_CHECK(metrics.prefix == "tessera" || metrics.prefix == "vllm",
                "metrics.prefix: expected tessera or vllm, got '" << metrics.prefix << "'");
  for (const auto* listen : {&http, &grpc}) {
    const char* which = listen == &http ? "http" : "grpc";
    TESSERA_CHECK(!listen->host.empty(), which << ".host: must not be empty");
    TESSERA_CHECK(listen->port >= 0 && listen->port <= 65535,
                  which << ".port: must be in [0, 65535] (0: chosen by the OS), got " << listen->port);
  }
  TESSERA_CHECK(http.enabled || grpc.enabled, "http.enabled, grpc.enabled: at least one front end must be enabled");
  TESSERA_CHECK(!models.empty(), "models: at least one model is needed (in the config or with --model)");
  std::set<std::string> names;
  for (size_t i = 0; i < models.size(); ++i) {
    const ServedModelSpec& m = models[i];
    TESSERA_CHECK(!m.path.empty(), "models." << i << ".path: must not be empty");
    TESSERA_CHECK(!m.name.empty(), "models." << i << ".name: must not be empty");
    TESSERA_CHECK(names.insert(m.name).second, "models." << i << ".name: '" << m.name << "' is served twice");
    TESSERA_CHECK(!m.random_weights || m.kind != ServedModelSpec::Kind::kEmbedding,
                  "models." << i << ".random_weights: drawn for Llama-family decoders only, not embedding models");
    TESSERA_CHECK(!m.random_weights || profile.empty(),
                  "models." << i << ".random_weights: a tuner profile (profile) applies to a model's own weights");
    if (!m.chat_template.empty()) {
      try {
        chat_template_from_name(m.chat_template);
      } catch (const Error& e) {
        TESSERA_FAIL("models." << i << ".chat_template: " << e.what());
      }
    }
  }
  for (size_t i = 0; i < auth.api_keys.size(); ++i) {
    TESSERA_CHECK(!auth.api_keys[i].empty(), "auth.api_keys[" << i << "]: must not be empty");
  }
  TESSERA_CHECK(limits.max_queue_size >= 1, "limits.max_queue_size: must be >= 1, got " << limits.max_queue_size);
  TESSERA_CHECK(limits.max_batch_tokens.value_or(1) >= 1,
                "limits.max_batch_tokens: must be >= 1, got " << *limits.max_batch_tokens);
  TESSERA_CHECK(limits.max_running_sequences.value_or(1) >= 1,
                "limits.max_running_sequences: must be >= 1, got " << *limits.max_running_sequences);
  TESSERA_CHECK(limits.prefill_chunk_tokens.value_or(0) >= 0,
                "limits.prefill_chunk_tokens: must be >= 0 (0: no cap), got " << *limits.prefill_chunk_tokens);
  TESSERA_CHECK(limits.max_prefills_per_step >= 0,
                "limits.max_prefills_per_step: must be >= 0 (0: no cap), got " << limits.max_prefills_per_step);
  TESSERA_CHECK(limits.max_model_len >= 0, "limits.max_model_len: must be >= 0 (0: the model's), got "
                                               << limits.max_model_len);
  TESSERA_CHECK(limits.kv_cache_memory_fraction >= 0.0 && limits.kv_cache_memory_fraction <= 0.95,
                "limits.kv_cache_memory_fraction: must be in [0, 0.95] (0: use kv_cache_tokens), got "
                    << limits.kv_cache_memory_fraction);
  const int64_t kv_tokens = limits.kv_cache_tokens.value_or(0);
  TESSERA_CHECK(kv_tokens >= 0 && kv_tokens <= (int64_t{1} << 34),
                "limits.kv_cache_tokens: must be in [0, 2^34] (0: 4 x max_model_len), got " << kv_tokens);
  TESSERA_CHECK(limits.max_body_bytes >= 1024, "limits.max_body_bytes: must be >= 1024, got " << limits.max_body_bytes);
  TESSERA_CHECK(limits.request_timeout_s > 0, "limits.request_timeout_s: must be > 0, got " << limits.request_timeout_s);
  TESSERA_CHECK(limits.drain_timeout_s >= 0, "limits.drain_timeout_s: must be >= 0, got " << limits.drain_timeout_s);
  TESSERA_CHECK(limits.engine_stall_timeout_s > 0,
                "limits.engine_stall_timeout_s: must be > 0, got " << limits.engine_stall_timeout_s);
  TESSERA_CHECK(debug.step_delay_ms >= 0, "debug.step_delay_ms: must be >= 0 (0: off), got " << debug.step_delay_ms);
  TESSERA_CHECK(debug.fail_step >= 0, "debug.fail_step: must be >= 0 (0: off), got " << debug.fail_step);
  speculative.validate();
  TESSERA_CHECK(backend == "auto" || backend == "cpu" || backend == "cuda",
                "backend: expected auto, cpu or cuda, got '" << backend << "'");
  TESSERA_CHECK(device >= 0, "device: must be >= 0, got " << device);
  TESSERA_CHECK(tensor_parallel >= 1 && tensor_parallel <= 8,
                "tensor_parallel: must be in [1, 8] (GPUs one model is sharded over), got " << tensor_parallel);
  TESSERA_CHECK(tensor_parallel == 1 || backend != "cpu",
                "tensor_parallel: " << tensor_parallel << " shards a model over GPUs; backend is cpu");
  TESSERA_CHECK(tensor_parallel == 1 || speculative.method != "draft_model",
                "speculative.method: draft_model runs its draft on one GPU, which tensor_parallel "
                    << tensor_parallel << " does not; use ngram or suffix");
  TESSERA_CHECK(dtype == "auto" || dtype == "bf16" || dtype == "fp16",
                "dtype: expected auto, bf16 or fp16, got '" << dtype << "'");
  TESSERA_CHECK(threads >= 0, "threads: must be >= 0 (0: all cores), got " << threads);
  TESSERA_CHECK(cuda_weights == "native" || cuda_weights == "int8" || cuda_weights == "int4_g128" ||
                    cuda_weights == "fp8_e4m3",
                "cuda_weights: expected native, int8, int4_g128 or fp8_e4m3, got '" << cuda_weights << "'");
  TESSERA_CHECK(cuda_weights == "native" || dtype != "fp16",
                "cuda_weights: " << cuda_weights << " needs dtype bf16 or auto (its kernels take bf16 activations), got "
                                 << dtype);
  TESSERA_CHECK(cuda_decode_split_min_tokens == 0 ||
                    (cuda_decode_split_min_tokens >= 32 && cuda_decode_split_min_tokens <= 1024 &&
                     cuda_decode_split_min_tokens % 32 == 0),
                "cuda_decode_split_min_tokens: expected 0 (the kernel's default) or a multiple of 32 in [32, 1024], got "
                    << cuda_decode_split_min_tokens);
  TESSERA_CHECK(cuda_kv_dtype == "native" || cuda_kv_dtype == "fp8_e4m3",
                "cuda_kv_dtype: expected native (the dtype) or fp8_e4m3, got '" << cuda_kv_dtype << "'");
  TESSERA_CHECK(cuda_kv_dtype == "native" || dtype != "fp16",
                "cuda_kv_dtype: " << cuda_kv_dtype << " needs dtype bf16 or auto (its kernels take bf16 activations), got "
                                  << dtype);
  TESSERA_CHECK(cpu_weights == "native" || cpu_weights == "f32",
                "cpu_weights: expected native or f32, got '" << cpu_weights << "'");
  TESSERA_CHECK(cpu_activation_bits == 8 || cpu_activation_bits == 16,
                "cpu_activation_bits: expected 8 or 16, got " << cpu_activation_bits);
  TESSERA_CHECK(http_threads >= 1 && http_threads <= 16384, "http_threads: must be in [1, 16384], got " << http_threads);
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  TESSERA_CHECK(std::find_if(std::begin(kLevels), std::end(kLevels), [&](const char* l) { return log_level == l; }) !=
                    std::end(kLevels),
                "log_level: expected one of trace, debug, info, warn, error, critical, off, got '" << log_level << "'");
}

EngineConfig ServerConfig::engine_config(DeviceKind device) const {
  const StepDefaults& step = device == DeviceKind::kCuda ? kGpuStepDefaults : kCpuStepDefaults;
  EngineConfig e;
  e.max_queue_size = limits.max_queue_size;
  e.max_batch_tokens = limits.max_batch_tokens.value_or(step.max_batch_tokens);
  e.max_running_sequences = limits.max_running_sequences.value_or(step.max_running_sequences);
  e.prefill.chunk_tokens = limits.prefill_chunk_tokens.value_or(step.prefill_chunk_tokens);
  e.prefill.max_per_step = limits.max_prefills_per_step;
  e.max_model_len = limits.max_model_len;
  e.prefix_caching = prefix_caching;
  e.stall_timeout_s = limits.engine_stall_timeout_s;
  e.faults.step_delay_ms = debug.step_delay_ms;
  e.faults.fail_step = debug.fail_step;
  e.speculative = speculative;
  if (limits.kv_cache_tokens.value_or(0) > 0) {  // whole blocks, rounded up
    e.kv_num_blocks = static_cast<int32_t>((*limits.kv_cache_tokens + e.kv_block_size - 1) / e.kv_block_size);
  }
  return e;
}

ServerConfig parse_server_config(const std::string& yaml_text, const std::string& source,
                                 const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    TESSERA_FAIL(source << ": not valid YAML: " << e.what());
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  TESSERA_CHECK(root.IsMap(), source << ": expected a mapping at the top level");
  for (const std::string& o : overrides) apply_override(root, o);
  ServerConfig config;
  try {
    config = from_yaml(root);
    config.validate();
  } catch (const Error& e) {
    TESSERA_FAIL(source << ": " << e.what());
  }
  return config;
}

ServerConfig load_server_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "cannot read config file " << path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_server_config(text.str(), path, overrides);
}

}  // namespace tessera
