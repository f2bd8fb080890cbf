// server/cli/info_command.cpp: `tessera info --model M [--json] [--backend B] [--profile P]`: what a
// model is (architecture, sizes, tensors by dtype, chat template), read from its files; with --backend,
// also the model loaded on that backend: the device, the memory its weights and KV cache take, and the
// number of KV blocks. `--profile P` prints a tuner profile; with --model it is checked against the
// model (hash) and this machine, and applied when the model is loaded, as `tessera serve` applies it.
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "models/model_files.h"
#include "engine/follower_ranks.h"
#include "models/model_loader.h"
#include "models/tokenizer/chat_template.h"
#include "models/weights/gguf.h"
#include "server/cli/backend_choice.h"
#include "server/cli/commands.h"
#include "tuner/profile.h"

namespace tessera::cli {
namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Tensor counts by storage type: GGUF files list their ggml types (including ones we cannot
// dequantize); safetensors files are mapped and counted.
std::map<std::string, size_t> tensor_counts(const ModelFiles& files, size_t* total) {
  std::map<std::string, size_t> counts;
  if (files.format == ModelFormat::kGguf) {
    for (const GgufTensorInfo& t : files.gguf->tensors()) ++counts[ggml_type_name(t.ggml_type)];
    *total = files.gguf->tensors().size();
    return counts;
  }
  const WeightStore weights = load_weights(files);
  *total = weights.size();
  return weights.count_by_dtype();
}

struct InfoOptions {
  std::string model;
  bool as_json = false;
  BackendChoice backend{""};      // kind "": files only
  int64_t kv_cache_tokens = 16384;  // as the server's limits.kv_cache_tokens
  std::string profile;              // tuner profile to print (and apply with --backend)
  bool force = false;               // apply a profile made for another model or device
};

// The model loaded on the backend: its description, and for a decoder the KV blocks (of 16 tokens)
// of a kv_cache_tokens cache.
struct LoadedReport {
  std::string backend;
  int64_t kv_blocks = 0;
  // The CPU backend's weights by tensor group and the format each is kept in (fp32, or a GGUF block
  // format / fp16 / bf16 read in place by the matmuls).
  std::vector<CpuBackend::WeightGroup> weight_groups;
  std::string graph;  // decoders: the fusions the graph runs with
};

void record_weight_groups(const Backend& backend, LoadedReport& report) {
  if (const auto* cpu = dynamic_cast<const CpuBackend*>(&backend)) report.weight_groups = cpu->weight_groups();
}

LoadedReport load_on_backend(const InfoOptions& o, const ModelFiles& files, const ModelConfig& config,
                             const std::optional<tuner::Profile>& profile) {
  BackendChoice choice = o.backend;
  if (profile) apply_profile_choice(*profile, choice);
  const std::vector<std::unique_ptr<Backend>> backends = make_backends(choice);
  const std::unique_ptr<Backend>& backend = backends.front();
  if (profile) tuner::check_choice_runs_on(profile->choice, backend->name(), profile->path);
  const WeightStore weights = profile ? tuner::apply_weight_format(files, load_weights(files), profile->choice)
                                      : load_weights_for(files, choice, *backend);
  const GraphOptions graph =
      profile ? tuner::choice_graph_options(profile->choice) : default_graph_options(config, *backend);
  LoadedReport report;
  if (config.arch == Architecture::kBert) {
    const auto model = make_encoder(config, weights, *backend, graph);
    report.backend = backend->describe();
    record_weight_groups(*backend, report);
    return report;
  }
  const ShardedModel model =
      ShardedModel::load(backends, [&](Backend& rank) { return make_causal_lm(config, weights, rank, graph); });
  report.graph = graph.describe();
  constexpr int32_t kBlock = 16;
  report.kv_blocks = (o.kv_cache_tokens + kBlock - 1) / kBlock;
  // Each rank's KV cache holds its KV heads' share of every block: the per-GPU memory shows below.
  std::vector<KvCacheStorage> caches;
  for (size_t rank = 0; rank < backends.size(); ++rank) {
    caches.push_back(backends[rank]->create_kv_cache(config.num_layers, static_cast<int32_t>(report.kv_blocks), kBlock,
                                                     static_cast<int32_t>(model.shards[rank]->cache_kv_heads()),
                                                     static_cast<int32_t>(config.head_dim)));
  }
  for (size_t rank = 0; rank < backends.size(); ++rank) {
    if (backends.size() > 1) report.backend += (rank == 0 ? "" : "; ") + ("rank " + std::to_string(rank) + ": ");
    report.backend += backends[rank]->describe();
  }
  record_weight_groups(*backend, report);
  return report;
}

void print_profile(const tuner::Profile& p, const std::vector<std::string>& forced) {
  auto line = [](const char* label, const std::string& value) { std::printf("%-22s %s\n", label, value.c_str()); };
  const tuner::Candidate& c = p.choice;
  line("profile:", p.path);
  line("tuned for:", p.model_name + " (" + p.architecture + ", sha256 " + p.model_sha256 + ")");
  line("device:", p.device + " (backend " + p.backend + ")");
  line("tessera:", p.tessera_version + " at " + p.tessera_commit);
  line("created:", p.created + " from " + p.space);
  line("policy:", p.policy + ": " + p.reason);
  line("weight format:", c.weight_format);
  line("kv dtype:", c.kv_dtype);
  line("fusions:", std::string("add_rms_norm ") + (c.fuse_add_rms_norm ? "fused" : "separate") + ", qkv " +
                       (c.fuse_qkv ? "fused" : "separate") + ", gate_up " + c.gate_up + ", rope_kv_write " +
                       (c.rope_in_kv_write ? "fused" : "separate"));
  line("cuda graphs:", c.cuda_graphs ? "on" : "off");
  line("threads:", c.threads == 0 ? std::string("all cores") : std::to_string(c.threads));
  line("activation bits:", c.activation_bits == 0 ? std::string("the backend's default") : std::to_string(c.activation_bits));
  for (const std::string& why : forced) line("forced:", why);
  std::printf("measured:\n");
  for (const auto& [key, value] : p.measured.items()) std::printf("  %-20s %s\n", key.c_str(), value.dump().c_str());
}

nlohmann::json profile_json(const tuner::Profile& p, const std::vector<std::string>& forced) {
  nlohmann::json out = tuner::yaml_to_json(tuner::profile_yaml(p));
  out["path"] = p.path;
  if (!forced.empty()) out["forced"] = forced;
  return out;
}

// Everything `info` prints about a model, gathered once for either output.
struct ModelReport {
  ModelFiles files;
  ModelConfig config;
  size_t tensor_total = 0;
  std::map<std::string, size_t> by_dtype;
  ModelChatTemplate chat;  // the template the server would use: the one the model ships
  std::string chat_origin;
  std::optional<std::string> chat_name;
  std::string location;
  const char* format = "";
  bool decoder = true;
  std::vector<std::string> forced;  // why the profile does not fit, when --force applies it anyway
  std::optional<LoadedReport> loaded;
};

ModelReport gather(const InfoOptions& o, const std::optional<tuner::Profile>& profile) {
  ModelReport r;
  r.files = locate_model(o.model);
  r.config = load_model_config(r.files);
  r.by_dtype = tensor_counts(r.files, &r.tensor_total);
  const bool gguf = r.files.format == ModelFormat::kGguf;
  r.chat = load_chat_template(r.files);
  r.chat_origin = gguf ? "tokenizer.chat_template" : "tokenizer_config.json";
  if (r.chat.detected) r.chat_name = chat_template_name(r.chat.detected->kind);
  r.decoder = r.config.arch != Architecture::kBert;
  r.location = gguf ? r.files.gguf_path : r.files.dir;
  r.format = gguf ? "gguf" : "safetensors";
  if (profile) {
    r.forced = tuner::check_profile(*profile, model_sha256(r.files), tuner::this_device(profile->backend),
                                    profile->backend, tuner::current_int4_weights_source(profile->choice, r.files),
                                    o.force);
  }
  // --tensor-parallel asks for each GPU's memory: the model loads as with --backend auto.
  if (!o.backend.kind.empty() || o.backend.tensor_parallel > 1) {
    InfoOptions on_backend = o;
    if (on_backend.backend.kind.empty()) on_backend.backend.kind = "auto";
    r.loaded = load_on_backend(on_backend, r.files, r.config, profile);
  }
  return r;
}

void print_json(const ModelReport& r, const std::optional<tuner::Profile>& profile) {
  const ModelConfig& config = r.config;
  nlohmann::json out;
  out["model"] = r.files.name;
  out["path"] = r.location;
  out["format"] = r.format;
  out["architecture"] = architecture_name(config.arch);
  out["num_layers"] = config.num_layers;
  out["hidden_size"] = config.hidden_size;
  out["intermediate_size"] = config.intermediate_size;
  out["num_heads"] = config.num_heads;
  out["num_kv_heads"] = config.num_kv_heads;
  out["head_dim"] = config.head_dim;
  out["vocab_size"] = config.vocab_size;
  out["context_length"] = config.max_position_embeddings;
  out["norm_eps"] = config.norm_eps;
  if (r.decoder) {
    out["rope_theta"] = config.rope_theta;
    out["rope_scaling"] = rope_scaling_name(config.rope_scaling.kind);
    out["tie_word_embeddings"] = config.tie_word_embeddings;
    out["sliding_window"] = config.sliding_window ? nlohmann::json(*config.sliding_window) : nlohmann::json(nullptr);
  } else {
    out["pooling"] = pooling_name(config.pooling);
    out["normalize_embeddings"] = config.normalize_embeddings;
  }
  out["tensors"] = {{"count", r.tensor_total}, {"by_dtype", r.by_dtype}};
  nlohmann::json chat_json;
  chat_json["name"] = r.chat_name ? nlohmann::json(*r.chat_name) : nlohmann::json(nullptr);
  chat_json["source"] = r.chat.source.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.chat_origin);
  if (!r.chat.source.empty() && !r.chat_name) chat_json["first_line"] = first_line(r.chat.source);
  out["chat_template"] = chat_json;
  if (profile) out["profile"] = profile_json(*profile, r.forced);
  if (r.loaded) {
    out["backend"] = {{"description", r.loaded->backend}, {"kv_blocks", r.loaded->kv_blocks}};
    if (!r.loaded->graph.empty()) out["backend"]["graph"] = r.loaded->graph;
    if (!r.loaded->weight_groups.empty()) {
      nlohmann::json groups = nlohmann::json::array();
      for (const auto& g : r.loaded->weight_groups) {
        groups.push_back({{"group", g.group}, {"format", g.format}, {"tensors", g.use.tensors}, {"bytes", g.use.bytes}});
      }
      out["backend"]["weights_in_memory"] = groups;
    }
  }
  std::printf("%s\n", out.dump().c_str());
}

void print_lines(const ModelReport& r, const std::optional<tuner::Profile>& profile) {
  const ModelConfig& config = r.config;
  auto line = [](const char* label, const std::string& value) { std::printf("%-22s %s\n", label, value.c_str()); };
  line("model:", r.files.name);
  line("path:", r.location + " (" + r.format + ")");
  line("architecture:", architecture_name(config.arch));
  line("layers:", std::to_string(config.num_layers));
  line("hidden size:", std::to_string(config.hidden_size));
  line("intermediate size:", std::to_string(config.intermediate_size));
  line("heads / KV heads:", std::to_string(config.num_heads) + " / " + std::to_string(config.num_kv_heads));
  line("head dim:", std::to_string(config.head_dim));
  line("vocab size:", std::to_string(config.vocab_size));
  line("context length:", std::to_string(config.max_position_embeddings));
  char number[64];
  std::snprintf(number, sizeof number, "%g", config.norm_eps);
  line("norm eps:", number);
  if (r.decoder) {
    std::snprintf(number, sizeof number, "%g", config.rope_theta);
    line("rope theta:", number);
    line("rope scaling:", rope_scaling_name(config.rope_scaling.kind));
    line("tied embeddings:", config.tie_word_embeddings ? "yes" : "no");
    line("sliding window:", config.sliding_window ? std::to_string(*config.sliding_window) : "none");
  } else {
    line("pooling:", std::string(pooling_name(config.pooling)) + (config.normalize_embeddings ? ", L2-normalized" : ""));
  }
  std::string counts;
  for (const auto& [dtype, n] : r.by_dtype) counts += (counts.empty() ? "" : ", ") + dtype + " " + std::to_string(n);
  line("tensors:", std::to_string(r.tensor_total) + " (" + counts + ")");
  if (r.chat.source.empty()) {
    line("chat template:", "none");
  } else if (r.chat_name) {
    line("chat template:", *r.chat_name + " (from " + r.chat_origin + ")");
  } else {
    line("chat template:", "unrecognised (from " + r.chat_origin + "; first line: " + first_line(r.chat.source) + ")");
  }
  if (profile) print_profile(*profile, r.forced);
  if (!r.loaded) return;
  line("backend:", r.loaded->backend);
  if (!r.loaded->graph.empty()) line("graph:", r.loaded->graph);
  if (r.decoder) line("kv blocks:", std::to_string(r.loaded->kv_blocks) + " of 16 tokens");
  if (!r.loaded->weight_groups.empty()) std::printf("weights in memory:\n");
  for (const auto& g : r.loaded->weight_groups) {
    char row[256];
    std::snprintf(row, sizeof row, "  %-48s %-5s x%-4lld %9.2f MiB\n", g.group.c_str(), g.format.c_str(),
                  static_cast<long long>(g.use.tensors), static_cast<double>(g.use.bytes) / (1024.0 * 1024.0));
    std::printf("%s", row);
  }
}

void run_info(const InfoOptions& o) {
  TESSERA_CHECK(!o.model.empty() || !o.profile.empty(), "info: give --model, --profile or both");
  std::optional<tuner::Profile> profile;
  if (!o.profile.empty()) profile = tuner::load_profile(o.profile);
  if (o.model.empty()) {
    if (o.as_json) {
      std::printf("%s\n", profile_json(*profile, {}).dump().c_str());
    } else {
      print_profile(*profile, {});
    }
    return;
  }
  const ModelReport report = gather(o, profile);
  if (o.as_json) {
    print_json(report, profile);
  } else {
    print_lines(report, profile);
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print a model's architecture, sizes, tensor dtypes and chat template");
  auto o = std::make_shared<InfoOptions>();
  cmd->add_option("--model,-m", o->model, "Model name in the model directory, a model folder or a .gguf file");
  cmd->add_option("--profile", o->profile, "A tuner profile (tessera tune): printed; with --model checked against "
                                           "it, and with --backend applied as serve applies it")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--force", o->force, "with --profile: apply a profile made for another model or device");
  cmd->add_flag("--json", o->as_json, "Print one JSON object instead of lines");
  add_backend_options(*cmd, o->backend);
  cmd->add_option("--kv-cache-tokens", o->kv_cache_tokens, "with --backend: the KV cache to size, in tokens")
      ->capture_default_str();
  cmd->callback([o] { run_info(*o); });
}

}  // namespace tessera::cli
