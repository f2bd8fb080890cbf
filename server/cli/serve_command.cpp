// server/cli/serve_command.cpp: `tessera serve --config F [--set k=v]... [--model M]... [--profile P]`:
// loads the models (LLMs and embedding models at once; a tuner profile's choices applied to the model
// it was tuned for), starts the engine loop, the HTTP and gRPC front ends, and on SIGTERM / SIGINT
// drains (/ready 503, new work refused, in-flight requests finish within limits.drain_timeout_s) and
// exits 0. A fatal engine error exits 70 once the failed requests' errors went out
// (limits.exit_on_fatal_error).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "engine/grammar/grammar.h"
#include "engine/scheduler/engine_loop.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tokenizer/chat_template.h"
#include "models/tokenizer/tokenizer.h"
#include "server/cli/backend_choice.h"
#include "server/cli/commands.h"
#include "server/config/server_config.h"
#include "server/frontend/frontend.h"
#include "server/grpc/grpc_server.h"
#include "server/http/http_server.h"
#include "server/metrics/server_metrics.h"
#include "tuner/profile.h"
#include "tuner/random_weights.h"

namespace tessera::cli {
namespace {

struct ServeOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<std::string> models;
  std::string backend;  // --backend: the config's `backend` key
  std::string cuda_weights;  // --cuda-weights: the config's `cuda_weights` key
  std::string cuda_kv_dtype;  // --cuda-kv-dtype: the config's `cuda_kv_dtype` key
  std::string profile;  // --profile: the config's `profile` key
  int32_t tensor_parallel = 0;  // --tensor-parallel: the config's `tensor_parallel` key (0: the config's)
  bool random_weights = false;  // --random-weights: models.N.random_weights for each --model
  std::string tokenizer;        // --tokenizer: models.N.tokenizer for each --model
  bool force = false;   // --force: apply a profile made for another model or device
};

std::optional<ChatTemplate> resolve_chat_template(const ServedModelSpec& spec, const ModelFiles& files) {
  if (!spec.chat_template.empty()) {
    ChatTemplate t;
    t.kind = chat_template_from_name(spec.chat_template);
    return t;
  }
  const ModelChatTemplate shipped = load_chat_template(files);
  if (!shipped.source.empty() && !shipped.detected) {
    spdlog::warn("model {}: its chat template is not one Tessera knows; /v1/chat/completions is refused for it "
                 "(set chat_template in the config)", spec.name);
  }
  return shipped.detected;
}

// The compiler of response formats and tool-call grammars for one LLM. Its stop tokens are the
// model's EOS ids and a chat template's end-of-turn token, the ids that end a sequence. A model the
// grammar engine cannot take is served without constrained output (such requests get a 400).
std::shared_ptr<GrammarCompiler> make_grammar_compiler(const FrontendModel& model) {
  GrammarCompilerConfig config;
  for (int64_t id : model.config.eos_token_ids) config.stop_token_ids.push_back(static_cast<int32_t>(id));
  add_end_of_turn_ids(*model.tokenizer, config.stop_token_ids);
  config.vocab_size = static_cast<int32_t>(std::max<int64_t>(model.config.vocab_size, model.tokenizer->vocab_size()));
  // Half the cores, at most eight: on the H100 host's Xeon, eight threads cut the p99 compile time
  // of the schema corpus on a 128k vocabulary from 2.3 s to 0.3 s, and compiles run on the request's
  // own thread beside the engine's.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  config.threads = std::clamp(cores / 2, 1, 8);
  try {
    return std::make_shared<GrammarCompiler>(*model.tokenizer, config);
  } catch (const std::exception& e) {
    spdlog::warn("model {}: no constrained output (response_format, structured_outputs, tools): {}", model.name,
                 e.what());
    return nullptr;
  }
}

spdlog::level::level_enum log_level(const std::string& name) { return spdlog::level::from_str(name); }

// SIGTERM / SIGINT become a byte on a pipe that the serving thread reads. A handler, not a blocked
// mask + sigwait: threads that exist before main (OpenBLAS's pool) keep the signals unblocked, and
// the kernel may deliver a process signal to any of them.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int signal_number) {
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  const ssize_t written = write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
  (void)written;
}

void install_stop_signals() {
  TESSERA_CHECK(pipe2(g_signal_pipe, O_CLOEXEC) == 0, "serve: cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int wait_stop_signal() {
  unsigned char byte = 0;
  for (;;) {
    const ssize_t n = read(g_signal_pipe[0], &byte, 1);
    if (n == 1) return byte;
    if (n < 0 && errno == EINTR) continue;
    return SIGTERM;  // the pipe cannot close while we run; treat anything else as a stop
  }
}

// A stop signal's number, or 0 when none came within `timeout`.
int wait_stop_signal_for(std::chrono::milliseconds timeout) {
  struct pollfd fd {};
  fd.fd = g_signal_pipe[0];
  fd.events = POLLIN;
  const int n = ::poll(&fd, 1, static_cast<int>(timeout.count()));
  return n > 0 ? wait_stop_signal() : 0;
}

// Every HTTP and gRPC connection holds a descriptor; the usual soft limit of 1,024 would refuse
// connections long before http_threads or the queue does. The hard limit is the operator's.
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) spdlog::debug("open file limit {} -> {}", before, limit.rlim_max);
}

ServerConfig load_serve_config(const ServeOptions& options) {
  std::vector<std::string> overrides = options.overrides;
  if (!options.backend.empty()) overrides.push_back("backend=" + options.backend);
  if (!options.cuda_weights.empty()) overrides.push_back("cuda_weights=" + options.cuda_weights);
  if (!options.cuda_kv_dtype.empty()) overrides.push_back("cuda_kv_dtype=" + options.cuda_kv_dtype);
  if (!options.profile.empty()) overrides.push_back("profile=" + options.profile);
  if (options.tensor_parallel > 0) overrides.push_back("tensor_parallel=" + std::to_string(options.tensor_parallel));
  if (!options.models.empty()) {
    overrides.insert(overrides.begin(), "models=[]");
    for (size_t i = 0; i < options.models.size(); ++i) {
      overrides.insert(overrides.begin() + 1 + i, "models." + std::to_string(i) + ".path=" + options.models[i]);
      const std::string model = "models." + std::to_string(i);
      if (options.random_weights) overrides.push_back(model + ".random_weights=true");
      if (!options.tokenizer.empty()) overrides.push_back(model + ".tokenizer=" + options.tokenizer);
    }
  }
  return options.config_path.empty() ? parse_server_config("{}", "defaults", overrides)
                                      : load_server_config(options.config_path, overrides);
}

std::string resolve_dtype(const ServerConfig& config) {
  if (config.dtype != "auto") return config.dtype;
  // fp16 keeps embeddings within cosine 0.99999 of fp32 (bf16: 0.9998 on MiniLM); LLMs get bf16's range.
  bool only_encoders = !config.models.empty();
  for (const ServedModelSpec& spec : config.models) {
    only_encoders = only_encoders && load_model_config(locate_model(spec.path)).arch == Architecture::kBert;
  }
  // Quantized linear weights and an fp8 KV cache need bf16 activations (their kernels' input),
  // embedding models or not.
  const std::string dtype =
      only_encoders && config.cuda_weights == "native" && config.cuda_kv_dtype == "native" ? "fp16" : "bf16";
  if (config.backend != "cpu") spdlog::info("dtype auto: {}{}", dtype, only_encoders ? " (embedding models only)" : "");
  return dtype;
}

BackendChoice choose_backend(const ServerConfig& config, const std::optional<tuner::Profile>& profile) {
  BackendChoice choice{config.backend, config.device, resolve_dtype(config), config.cuda_graphs, config.threads,
                       config.cpu_weights, config.cpu_activation_bits, config.cuda_weights,
                       config.cuda_decode_split_min_tokens, config.cuda_kv_dtype};
  // A speculating server's verify rows must give the tokens plain decoding gives.
  choice.cuda_batch_invariant_decode = config.speculative.enabled();
  choice.tensor_parallel = config.tensor_parallel;
  if (profile) apply_profile_choice(*profile, choice);
  return choice;
}

// The served model a tuner profile applies to, and the labels its metrics carry.
struct ProfileTarget {
  std::optional<size_t> model;  // index into config.models; none without a profile
  std::vector<std::pair<std::string, std::string>> labels;
};

// The profile applies to the served model it was tuned for (by weight hash); with --force, to the
// first model when none matches.
ProfileTarget target_profile(const tuner::Profile& profile, const ServerConfig& config, const Backend& backend,
                             bool force) {
  ProfileTarget target;
  std::string first_sha;
  for (size_t i = 0; i < config.models.size() && !target.model; ++i) {
    const std::string sha = model_sha256(locate_model(config.models[i].path));
    if (i == 0) first_sha = sha;
    if (sha == profile.model_sha256) target.model = i;
  }
  TESSERA_CHECK(!config.models.empty(), "profile: no model is served to apply it to");
  const ModelFiles profiled_files = locate_model(config.models[target.model.value_or(0)].path);
  const std::vector<std::string> forced =
      tuner::check_profile(profile, target.model ? profile.model_sha256 : first_sha, tuner::this_device(backend.name()),
                           backend.name(), tuner::current_int4_weights_source(profile.choice, profiled_files), force);
  for (const std::string& why : forced) spdlog::warn("profile {} applied with --force: {}", profile.path, why);
  if (!target.model) target.model = 0;
  tuner::check_choice_runs_on(profile.choice, backend.name(), profile.path);
  target.labels = profile.metric_labels();
  target.labels.emplace_back("model", config.models[*target.model].name);
  return target;
}

// Every served model, loaded onto the backend, as the engine and the front ends each take it.
struct LoadedModels {
  std::vector<EngineLoop::ServedLm> lms;
  std::vector<EngineLoop::ServedEncoder> encoders;
  std::vector<FrontendModel> frontend_models;
  std::string names;  // comma-separated, in config order
};

// LLM or embedding model by architecture; a `kind` in the config must agree.
ModelKind served_kind(const ServedModelSpec& spec, size_t index, const ModelConfig& model_config) {
  const ModelKind kind = model_config.arch == Architecture::kBert ? ModelKind::kEmbedding : ModelKind::kLlm;
  if (spec.kind != ServedModelSpec::Kind::kAuto) {
    const ModelKind asked = spec.kind == ServedModelSpec::Kind::kLlm ? ModelKind::kLlm : ModelKind::kEmbedding;
    TESSERA_CHECK(asked == kind, "models." << index << ".kind: " << spec.path << " is a "
                                          << architecture_name(model_config.arch) << " model, which Tessera serves as "
                                          << model_kind_name(kind) << ", not " << model_kind_name(asked));
  }
  return kind;
}

// The backends models load onto: rank 0's, which the engine drives, then the other ranks of a
// tensor-parallel group, which hold the other shards of each LLM (encoders run on rank 0 alone).
struct RankBackends {
  Backend& first;
  std::span<const std::unique_ptr<Backend>> others;
};

// The weights a served model runs with: drawn from a fixed seed (models.N.random_weights), the
// profile's weight format of its files, or its files as the backend keeps them.
WeightStore served_weights(const ServedModelSpec& spec, const ModelConfig& config, const ModelFiles& files,
                           const BackendChoice& backend_choice, const Backend& backend, const tuner::Profile* profile) {
  if (spec.random_weights) {
    spdlog::warn("{}: random weights (models.*.random_weights): for timing only, its text means nothing", spec.name);
    return tuner::random_llama_weights(config, /*seed=*/1);
  }
  if (profile) return tuner::apply_weight_format(files, load_weights(files), profile->choice);
  return load_weights_for(files, backend_choice, backend);
}

// Builds a model's graph on the backend (an LLM's shard on each rank); its weights are copied into
// the backend, then released. `profile`: the profile tuned for this model, whose weight format and
// graph options it runs.
void build_graph(const FrontendModel& model, const ServedModelSpec& spec, const ModelFiles& files,
                 const BackendChoice& backend_choice, const RankBackends& ranks, const tuner::Profile* profile,
                 LoadedModels& loaded) {
  Backend& backend = ranks.first;
  WeightStore weights = served_weights(spec, model.config, files, backend_choice, backend, profile);
  const GraphOptions graph =
      profile ? tuner::choice_graph_options(profile->choice) : default_graph_options(model.config, backend);
  if (profile) {
    spdlog::info("profile {}: {} runs weight format {}, {}, threads {}, activation bits {}", profile->path,
                 model.name, profile->choice.weight_format, graph.describe(),
                 profile->choice.threads == 0 ? std::string("all cores") : std::to_string(profile->choice.threads),
                 backend_choice.cpu_activation_bits);
  } else if (model.kind == ModelKind::kLlm) {
    spdlog::info("{} runs {} (no profile)", model.name, graph.describe());
  }
  if (model.kind == ModelKind::kLlm) {
    loaded.lms.push_back({model.name, model.config, make_causal_lm(model.config, weights, backend, graph),
                          model.tokenizer, nullptr, {}});
    for (const std::unique_ptr<Backend>& rank : ranks.others) {
      loaded.lms.back().other_ranks.push_back({make_causal_lm(model.config, weights, *rank, graph), rank.get()});
    }
  } else {
    loaded.encoders.push_back({model.name, model.config, make_encoder(model.config, weights, backend, graph),
                               model.tokenizer});
  }
}

// speculative.draft_model's model on the backend, in the served models' weight format.
std::unique_ptr<CausalLm> load_draft_model(const std::string& path, const BackendChoice& backend_choice,
                                           Backend& backend) {
  const ModelFiles files = locate_model(path);
  const ModelConfig config = load_model_config(files);
  TESSERA_CHECK(config.arch != Architecture::kBert,
                "speculative.draft_model: " << path << " is an embedding model, not one that generates");
  auto model = make_causal_lm(config, load_weights_for(files, backend_choice, backend), backend,
                              default_graph_options(config, backend));
  spdlog::info("speculative draft model {} ({}, {} layers) from {}", path, architecture_name(config.arch),
               config.num_layers, files.dir);
  return model;
}

LoadedModels load_models(const ServerConfig& config, const BackendChoice& backend_choice, const RankBackends& ranks,
                         const std::optional<tuner::Profile>& profile, std::optional<size_t> profiled_model) {
  Backend& backend = ranks.first;
  LoadedModels loaded;
  for (size_t i = 0; i < config.models.size(); ++i) {
    const ServedModelSpec& spec = config.models[i];
    const auto t0 = Clock::now();
    const ModelFiles files = locate_model(spec.path);
    // The tokenizer and chat template: the model's own, or models.N.tokenizer's.
    const ModelFiles text_files = spec.tokenizer.empty() ? files : locate_model(spec.tokenizer);
    FrontendModel model;
    model.name = spec.name;
    model.config = load_model_config(files);
    model.tokenizer = load_tokenizer(text_files);
    TESSERA_CHECK(spec.tokenizer.empty() || model.tokenizer->vocab_size() <= model.config.vocab_size,
                  "models." << i << ".tokenizer: " << spec.tokenizer << " has " << model.tokenizer->vocab_size()
                            << " tokens, more than the model's vocab_size " << model.config.vocab_size);
    model.kind = served_kind(spec, i, model.config);
    if (model.kind == ModelKind::kLlm) {
      model.chat_template = resolve_chat_template(spec, text_files);
      // /tokenizer_info shows the template the model ships; an override by name has no Jinja source.
      if (spec.chat_template.empty()) model.chat_template_source = load_chat_template(text_files).source;
      model.grammar_compiler = make_grammar_compiler(model);
    }
    build_graph(model, spec, files, backend_choice, ranks, profiled_model == i ? &*profile : nullptr, loaded);
    if (model.kind == ModelKind::kLlm && config.speculative.method == "draft_model") {
      loaded.lms.back().draft_model = load_draft_model(config.speculative.draft_model, backend_choice, backend);
    }
    spdlog::info("loaded {} ({}, {}, {}) from {} in {:.1f}s", spec.name, model_kind_name(model.kind),
                 architecture_name(model.config.arch),
                 model.chat_template ? chat_template_name(model.chat_template->kind) : "no chat template", files.dir,
                 std::chrono::duration<double>(Clock::now() - t0).count());
    loaded.frontend_models.push_back(std::move(model));
    loaded.names += (loaded.names.empty() ? "" : ",") + spec.name;
  }
  return loaded;
}

// The CPU's KV cache when the config sizes it neither way: kDefaultCpuKvTokens, but no more than the
// engine's own default of 4 sequences of the longest max_model_len.
void size_default_cpu_kv_cache(const ServerConfig& config, const std::vector<EngineLoop::ServedLm>& lms,
                               EngineConfig& engine_config) {
  int64_t longest = 0;
  for (const auto& lm : lms) {
    const int64_t context = lm.config.max_position_embeddings;
    longest = std::max<int64_t>(longest, config.limits.max_model_len > 0 ? config.limits.max_model_len : context);
  }
  const int64_t tokens = std::min<int64_t>(ServerConfig::kDefaultCpuKvTokens, 4 * longest);
  if (tokens > 0) engine_config.kv_num_blocks = static_cast<int32_t>((tokens + engine_config.kv_block_size - 1) /
                                                                    engine_config.kv_block_size);
}

// Every LLM gets the same number of blocks, sized by the largest per-token KV footprint, from
// limits.kv_cache_memory_fraction of the device's free memory, or from kDefaultGpuKvFraction of it
// on a GPU when the config sizes the cache neither way.
void size_kv_cache(const ServerConfig& config, Backend& backend, const std::vector<EngineLoop::ServedLm>& lms,
                   EngineConfig& engine_config) {
  if (lms.empty()) return;
  const std::optional<int64_t> free_bytes = backend.free_device_bytes();
  double fraction = config.limits.kv_cache_memory_fraction;
  if (fraction <= 0.0 && !config.limits.kv_cache_tokens) {
    if (!free_bytes) return size_default_cpu_kv_cache(config, lms, engine_config);
    fraction = ServerConfig::kDefaultGpuKvFraction;
  }
  if (fraction <= 0.0) return;
  TESSERA_CHECK(free_bytes.has_value(), "limits.kv_cache_memory_fraction: applies to the cuda backend; this server "
                                        "runs on " << backend.name() << " (use limits.kv_cache_tokens)");
  // Per rank: a tensor-parallel rank holds its KV heads' share of every block.
  int64_t token_bytes = 0;
  for (const auto& lm : lms) {
    token_bytes = std::max<int64_t>(token_bytes, 2 * lm.config.num_layers * lm.model->cache_kv_heads() *
                                                     lm.config.head_dim * scalar_type_bytes(backend.kv_cache_type()));
  }
  const double budget = fraction * static_cast<double>(*free_bytes) / static_cast<double>(lms.size());
  const int64_t blocks = static_cast<int64_t>(budget / static_cast<double>(token_bytes * engine_config.kv_block_size));
  TESSERA_CHECK(blocks >= 1, "limits.kv_cache_memory_fraction " << fraction << " of " << *free_bytes
                                                                 << " free bytes holds no KV block");
  engine_config.kv_num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  spdlog::info("kv cache: {} tokens per LLM ({} blocks of {}, {:.2f} GiB each) from {:.0f}% of {:.1f} GiB free",
               static_cast<int64_t>(engine_config.kv_num_blocks) * engine_config.kv_block_size,
               engine_config.kv_num_blocks, engine_config.kv_block_size,
               static_cast<double>(engine_config.kv_num_blocks) * engine_config.kv_block_size * token_bytes / (1 << 30),
               fraction * 100, static_cast<double>(*free_bytes) / (1 << 30));
}

const char* kv_cache_type_name(ScalarType type) {
  return type == ScalarType::kBF16       ? "bfloat16"
         : type == ScalarType::kF16      ? "float16"
         : type == ScalarType::kFp8E4M3 ? "fp8_e4m3"
                                          : "float32";
}

void warm_up(EngineLoop& engine, const EngineConfig& engine_config) {
  for (const auto& [name, report] : engine.warm_up()) {
    if (report.seconds <= 0.0) continue;  // the backend needs no warm-up
    spdlog::info("{}: warmed up in {:.2f}s: step workspace sized for {} tokens, decode graphs for {} shapes "
                 "(batch sizes {})",
                 name, report.seconds, engine_config.max_batch_tokens, report.decode_shapes,
                 fmt::join(report.decode_batches, ","));
    if (!report.decode_step_seconds.empty()) {
      std::vector<std::string> times;
      for (size_t i = 0; i < report.decode_batches.size(); ++i) {
        times.push_back(fmt::format("{}: {:.3f}", report.decode_batches[i], report.decode_step_seconds[i] * 1e3));
      }
      spdlog::info("{}: decode step ms by batch size, which sets how many drafts a step verifies: {}", name,
                   fmt::join(times, ", "));
    }
  }
  // Loading frees its temporaries (GGUF parsing, tokenizer building) between live chunks of malloc's
  // heap, where their pages stay resident: 14 MB for SmolLM2 on the CPU backend. Hand them back.
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// The HTTP and gRPC servers the config enables, and where they listen.
struct FrontEnds {
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<GrpcServer> grpc;
  std::string listening;  // " http=host:port grpc=host:port"
};

FrontEnds start_front_ends(const ServerConfig& config, Frontend& frontend, ServerMetrics& metrics) {
  FrontEnds front_ends;
  if (config.http.enabled) {
    front_ends.http = std::make_unique<HttpServer>(config, frontend, &metrics);
    const int port = front_ends.http->start();
    front_ends.listening += " http=" + config.http.host + ":" + std::to_string(port);
  }
  if (config.grpc.enabled) {
    front_ends.grpc = start_grpc_server(config, frontend);
    front_ends.listening += " grpc=" + config.grpc.host + ":" + std::to_string(front_ends.grpc->port());
  }
  return front_ends;
}

// EX_SOFTWARE: what a fatal engine error exits with, so that a supervisor restarts the process.
constexpr int kFatalEngineExitCode = 70;
// How often the serve loop looks at the engine's heartbeat (gRPC health, the fatal-error exit).
constexpr std::chrono::milliseconds kHealthWatchInterval{200};
// After a fatal engine error, how long the failed requests' final events get to reach their clients.
constexpr std::chrono::milliseconds kFatalFlushLimit{800};

// The engine failed for good and limits.exit_on_fatal_error is set: let the error events that
// ended the in-flight requests go out, then exit non-zero without running destructors (the engine
// thread has ended; the device may be unusable).
[[noreturn]] void exit_after_fatal_error(FrontEnds& front_ends) {
  const auto flush_end = Clock::now() + kFatalFlushLimit;
  HttpServer* http = front_ends.http.get();
  while (http && http->active_requests() > 0 && Clock::now() < flush_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (front_ends.grpc) {
    const auto left = std::max(Clock::duration::zero(), flush_end - Clock::now());
    front_ends.grpc->shutdown(std::chrono::duration_cast<std::chrono::milliseconds>(left));
  }
  spdlog::error("exiting with code {} so that the process is restarted (limits.exit_on_fatal_error)",
                kFatalEngineExitCode);
  spdlog::shutdown();
  std::fflush(nullptr);
  std::_Exit(kFatalEngineExitCode);
}

// Logs health changes and feeds gRPC health; on a fatal engine error counts it and exits when
// configured to. Returns whether the engine is healthy now.
bool watch_engine(const ServerConfig& config, EngineLoop& engine, ServerMetrics& metrics, FrontEnds& front_ends,
                  bool was_healthy, bool& fatal_seen) {
  const EngineHealth health = engine.health(Clock::now());
  const bool healthy = health.healthy();
  if (front_ends.grpc) front_ends.grpc->set_engine_healthy(healthy);
  if (healthy && !was_healthy) spdlog::info("engine healthy again");
  if (!healthy && was_healthy) spdlog::error("unhealthy (/health 503): {}", health.reason());
  const bool fatal = !health.fatal_error.empty() || !health.thread_alive;
  if (fatal && !fatal_seen) {
    fatal_seen = true;
    metrics.on_engine_fatal_error();
    if (config.limits.exit_on_fatal_error) exit_after_fatal_error(front_ends);
    spdlog::error("the engine stopped; staying up with /health and /ready 503 (limits.exit_on_fatal_error false)");
  }
  return healthy;
}

// Serves until SIGTERM / SIGINT (returned), watching the engine between signals.
int serve_until_stop_signal(const ServerConfig& config, EngineLoop& engine, ServerMetrics& metrics,
                            FrontEnds& front_ends) {
  bool healthy = true;
  bool fatal_seen = false;
  for (;;) {
    if (const int signal_number = wait_stop_signal_for(kHealthWatchInterval); signal_number != 0) return signal_number;
    healthy = watch_engine(config, engine, metrics, front_ends, healthy, fatal_seen);
  }
}

// A second signal during the drain means "now": exit at once, without waiting for streams.
void exit_on_second_signal() {
  std::thread([] {
    wait_stop_signal();
    spdlog::warn("second signal during drain: exiting without waiting");
    std::fflush(nullptr);
    std::_Exit(1);
  }).detach();
}

// /ready 503 and new work refused; in-flight requests get up to limits.drain_timeout_s to finish
// and reach their clients; whatever is left then is cut.
void drain(const ServerConfig& config, int signal_number, Frontend& frontend, EngineLoop& engine,
           FrontEnds& front_ends) {
  const auto drain_start = Clock::now();
  const auto drain_limit = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config.limits.drain_timeout_s));
  spdlog::info("{}: draining (/ready 503, new requests refused), up to {:.0f}s for in-flight requests",
               signal_number == SIGTERM ? "SIGTERM" : "SIGINT", config.limits.drain_timeout_s);
  exit_on_second_signal();
  frontend.begin_drain();
  engine.stop_accepting();
  if (front_ends.grpc) front_ends.grpc->begin_drain();
  const auto left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::max(Clock::duration::zero(),
                                                                          drain_start + drain_limit - Clock::now()));
  };
  const bool engine_idle = engine.wait_idle(left());
  // The engine's last events still have to reach their clients (SSE [DONE], gRPC final message).
  HttpServer* http = front_ends.http.get();
  while (http && http->active_requests() > 0 && left().count() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const EngineStats stats = engine.stats();
  if (!engine_idle || (http && http->active_requests() > 0)) {
    spdlog::warn("drain timeout: {} running, {} waiting, {} HTTP requests still open are cut", stats.running,
                 stats.waiting, http ? http->active_requests() : 0);
  }
  if (front_ends.grpc) front_ends.grpc->shutdown(left());
  if (http) http->stop();
  spdlog::info("drained in {:.2f}s; exiting", std::chrono::duration<double>(Clock::now() - drain_start).count());
}

void run_serve(const ServeOptions& options) {
  const ServerConfig config = load_serve_config(options);
  spdlog::set_level(log_level(config.log_level));
  raise_open_file_limit();
  std::optional<tuner::Profile> profile;
  if (!config.profile.empty()) profile = tuner::load_profile(config.profile);
  const BackendChoice backend_choice = choose_backend(config, profile);
  const std::vector<std::unique_ptr<Backend>> backends = make_backends(backend_choice);
  Backend& backend = *backends.front();
  const ProfileTarget profile_target =
      profile ? target_profile(*profile, config, backend, options.force) : ProfileTarget{};
  const RankBackends ranks{backend, std::span(backends).subspan(1)};
  LoadedModels models = load_models(config, backend_choice, ranks, profile, profile_target.model);

  std::vector<std::string> metric_models;
  for (const auto& lm : models.lms) metric_models.push_back(lm.name);
  for (const auto& enc : models.encoders) metric_models.push_back(enc.name);
  ServerMetrics metrics(ServerInfo{TESSERA_VERSION, models.names, backend.name(), config.profile, config.metrics.prefix,
                                   profile_target.labels},
                        metric_models);
  EngineConfig engine_config = config.engine_config(backend.device());
  size_kv_cache(config, backend, models.lms, engine_config);
  const std::string first_lm = models.lms.empty() ? std::string() : models.lms.front().name;
  EngineLoop engine(engine_config, backend, std::move(models.lms), std::move(models.encoders), &metrics);
  if (!first_lm.empty()) {
    metrics.set_cache_info(CacheInfo{engine_config.kv_block_size, engine.kv_num_blocks(first_lm),
                                     kv_cache_type_name(backend.kv_cache_type()), engine_config.prefix_caching});
  }
  warm_up(engine, engine_config);
  engine.start();

  Frontend frontend(config, &engine, &metrics);
  for (FrontendModel& m : models.frontend_models) frontend.add_model(std::move(m));
  FrontEnds front_ends = start_front_ends(config, frontend, metrics);
  install_stop_signals();
  // One machine-readable line on stdout, so scripts and tests that asked for port 0 find the ports.
  std::printf("tessera: listening%s models=%s\n", front_ends.listening.c_str(), models.names.c_str());
  std::fflush(stdout);
  spdlog::info("serving {} on{} (backend {}, api keys {})", models.names, front_ends.listening, backend.describe(),
               config.auth.api_keys.empty() ? "off" : "on");
  drain(config, serve_until_stop_signal(config, engine, metrics, front_ends), frontend, engine, front_ends);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve models over the OpenAI-compatible HTTP API and gRPC");
  cmd->add_option("--config", options->config_path, "Server config (YAML), e.g. configs/server.yaml")
      ->check(CLI::ExistingFile);
  cmd->add_option("--backend", options->backend, "auto, cpu or cuda (the config's `backend` key)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--cuda-weights", options->cuda_weights,
                  "native, int8, int4_g128 or fp8_e4m3: the layers' linear weights on cuda (the config's `cuda_weights` key)")
      ->check(CLI::IsMember({"native", "int8", "int4_g128", "fp8_e4m3"}));
  cmd->add_option("--cuda-kv-dtype", options->cuda_kv_dtype,
                  "native or fp8_e4m3: the paged KV cache on cuda (the config's `cuda_kv_dtype` key)")
      ->check(CLI::IsMember({"native", "fp8_e4m3"}));
  cmd->add_option("--profile", options->profile, "Tuner profile (tessera tune's profile.yaml; the config's `profile` key)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--random-weights", options->random_weights,
                "With --model: draw each model's weights from a fixed seed (a shape folder with a config.json "
                "serves; for timing, its text means nothing)");
  cmd->add_option("--tokenizer", options->tokenizer,
                  "With --model: take the tokenizer and chat template from this model (a shape folder has none)");
  cmd->add_option("--tensor-parallel", options->tensor_parallel,
                  "Shard each LLM over this many GPUs (the config's `tensor_parallel` key)")
      ->check(CLI::Range(1, 8));
  cmd->add_flag("--force", options->force, "Apply a profile tuned for another model (hash) or device");
  cmd->add_option("--set", options->overrides, "Override a config key: dotted.key=value (repeatable)");
  cmd->add_option("--model", options->models,
                  "Serve this model instead of the config's (repeatable): a name in the model dir, a folder or a "
                  ".gguf file; LLM or embedding model by architecture");
  cmd->callback([options] { run_serve(*options); });
}

}  // namespace tessera::cli
