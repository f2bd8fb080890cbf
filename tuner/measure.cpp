// tuner/measure.cpp: Measurer: load a candidate, time prefill and decode steps, score quality.
#include "tuner/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "kernels/backend/cpu/cpu_backend.h"
#ifdef TESSERA_HAVE_CUDA
#include "kernels/backend/cuda/cuda_backend.h"
#endif
#include "kernels/backend/mask_policy.h"
#include "models/calibrated_weights.h"
#include "models/graph_options.h"
#include "models/model_loader.h"
#include "models/tokenizer/tokenizer.h"
#include "models/weights/requantize.h"
#include "tuner/profile.h"
#include "tuner/random_weights.h"

namespace tessera::tuner {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t kKvBlock = 16;

// Runs `step` warmup + repeats times; the timing of the repeats, as the backend clocks them (wall
// time on the CPU, CUDA events on a GPU).
Timing time_shape(int size, const MeasureSettings& s, Backend& backend, const std::function<void()>& step) {
  for (int i = 0; i < s.warmup; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < s.repeats; ++i) ms.push_back(backend.time_ms(step));
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  const double median = n % 2 == 1 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return Timing{size, median, ms.front(), ms.back()};
}

// log softmax of one logits row, in double for the sums.
void log_softmax(const float* logits, int64_t vocab, std::vector<double>& out) {
  out.resize(static_cast<size_t>(vocab));
  const double top = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - top);
  const double log_z = top + std::log(sum);
  for (int64_t i = 0; i < vocab; ++i) out[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - log_z;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lowest precision of the file's weight matrices: what "gguf" (the file's own formats) ranks as.
int file_format_rank(const ModelFiles& files) {
  const WeightStore store = load_weights(files);
  int rank = 4;
  for (const std::string& name : store.names()) {
    const WeightView& w = store.get(name);
    if (w.shape.size() == 2 && dtype_is_float(w.dtype)) rank = std::min(rank, weight_format_rank(w.dtype));
  }
  return rank;
}

}  // namespace

// ---------------------------------------------------------------- Measurement

double Measurement::latency_ms() const {
  if (!decode.empty()) return decode.front().median_ms;
  return prefill.empty() ? 0.0 : prefill.front().median_ms;
}

double Measurement::quality_loss() const {
  if (!quality_measured) return 0.0;
  return decode.empty() && cosine > 0.0 ? 1.0 - cosine : perplexity;
}

double Measurement::memory_mb() const { return static_cast<double>(weight_bytes + kv_bytes) / (1024.0 * 1024.0); }

namespace {
nlohmann::json timings_json(const std::vector<Timing>& timings) {
  nlohmann::json out = nlohmann::json::array();
  for (const Timing& t : timings) {
    out.push_back({{"size", t.size}, {"median_ms", t.median_ms}, {"min_ms", t.min_ms}, {"max_ms", t.max_ms}});
  }
  return out;
}
std::vector<Timing> timings_from(const nlohmann::json& json) {
  std::vector<Timing> out;
  for (const auto& t : json) {
    out.push_back({t.at("size").get<int>(), t.at("median_ms").get<double>(), t.at("min_ms").get<double>(),
                   t.at("max_ms").get<double>()});
  }
  return out;
}
}  // namespace

nlohmann::json Measurement::to_json() const {
  const Candidate& c = candidate;
  nlohmann::json j;
  j["key"] = c.key();
  j["candidate"] = {{"weight_format", c.weight_format},
                    {"kv_dtype", c.kv_dtype},
                    {"add_rms_norm", c.fuse_add_rms_norm ? "fused" : "separate"},
                    {"qkv", c.fuse_qkv ? "fused" : "separate"},
                    {"gate_up", c.gate_up},
                    {"rope_kv_write", c.rope_in_kv_write ? "fused" : "separate"},
                    {"cuda_graphs", c.cuda_graphs},
                    {"threads", c.threads},
                    {"activation_bits", c.activation_bits},
                    {"decode_split_min_tokens", c.decode_split_min_tokens}};
  j["settings"] = settings;
  if (!weights_source.empty()) j["weights_source"] = weights_source;
  if (!ok()) {
    j["error"] = error;
    return j;
  }
  j["prefill"] = timings_json(prefill);
  j["decode"] = timings_json(decode);
  j["perplexity"] = quality_measured ? nlohmann::json(perplexity) : nlohmann::json(nullptr);
  j["kl"] = quality_measured ? nlohmann::json(kl) : nlohmann::json(nullptr);
  j["cosine"] = quality_measured ? nlohmann::json(cosine) : nlohmann::json(nullptr);
  j["weight_bytes"] = weight_bytes;
  j["kv_bytes"] = kv_bytes;
  j["seconds"] = seconds;
  return j;
}

Measurement Measurement::from_json(const nlohmann::json& j) {
  try {
    Measurement m;
    const nlohmann::json& c = j.at("candidate");
    m.candidate.weight_format = c.at("weight_format").get<std::string>();
    m.candidate.kv_dtype = c.at("kv_dtype").get<std::string>();
    m.candidate.fuse_add_rms_norm = c.at("add_rms_norm").get<std::string>() == "fused";
    m.candidate.fuse_qkv = c.at("qkv").get<std::string>() == "fused";
    m.candidate.gate_up = c.at("gate_up").get<std::string>();
    m.candidate.rope_in_kv_write = c.at("rope_kv_write").get<std::string>() == "fused";
    m.candidate.cuda_graphs = c.at("cuda_graphs").get<bool>();
    m.candidate.threads = c.at("threads").get<int>();
    m.candidate.activation_bits = c.at("activation_bits").get<int>();
    m.candidate.decode_split_min_tokens = c.value("decode_split_min_tokens", 0);  // absent before the axis existed
    m.settings = j.at("settings").get<std::string>();
    m.weights_source = j.value("weights_source", "");  // int4_g128 records only
    if (j.contains("error")) {
      m.error = j.at("error").get<std::string>();
      return m;
    }
    m.prefill = timings_from(j.at("prefill"));
    m.decode = timings_from(j.at("decode"));
    m.quality_measured = !j.at("perplexity").is_null();
    if (m.quality_measured) {
      m.perplexity = j.at("perplexity").get<double>();
      m.kl = j.at("kl").get<double>();
      m.cosine = j.at("cosine").get<double>();
    }
    m.weight_bytes = j.at("weight_bytes").get<int64_t>();
    m.kv_bytes = j.at("kv_bytes").get<int64_t>();
    m.seconds = j.at("seconds").get<double>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL("candidate record: " << e.what());
  }
}

bool requantizes(const Candidate& candidate) {
  // The GPU weight-only formats (int8, int4_g128, fp8_e4m3) are applied by the CUDA backend at load.
  return candidate.weight_format != "gguf" && weight_format_from_name(candidate.weight_format).has_value();
}

std::string default_eval_text_path() { return default_model_dir() + "/eval-text-wiki/wiki.utf8"; }

// ---------------------------------------------------------------- Measurer

struct Measurer::Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<CausalLm> lm;
  std::unique_ptr<Encoder> encoder;
  int64_t weight_bytes = 0;
};

namespace {
// A store of the same views, keeping `shared` alive (requantize_weights consumes its argument).
WeightStore share_views(const std::shared_ptr<const WeightStore>& shared) {
  WeightStore out;
  out.keep_alive(shared);
  for (const std::string& name : shared->names()) out.add(shared->get(name));
  return out;
}
}  // namespace

Measurer::Measurer(const std::string& model, const TuneSpace& space, std::string space_dir,
                   std::optional<uint64_t> random_weights_seed)
    : space_(space) {
#ifndef TESSERA_HAVE_CUDA
  TESSERA_CHECK(space_.backend == "cpu", space_.source << ": backend: cuda: this binary has no CUDA backend (configure "
                                                          "with -DTESSERA_CUDA=ON)");
#endif
  files_ = locate_model(model);
  config_ = load_model_config(files_);
  const int max_prefill = *std::max_element(space_.measure.prefill_tokens.begin(), space_.measure.prefill_tokens.end());
  if (random_weights_seed) {
    TESSERA_CHECK(files_.format == ModelFormat::kHfSafetensors,
                  "--random-weights: " << model << " is a GGUF file; give a folder with the model's config.json");
    TESSERA_CHECK(!is_encoder(), "--random-weights: " << model << " is an encoder; random weights are for decoders "
                                 "(whose latency and memory they show)");
    TESSERA_CHECK(std::find(space_.weight_formats.begin(), space_.weight_formats.end(), "gguf") ==
                      space_.weight_formats.end(),
                  space_.source << ": weight_format: gguf (the file's own formats) means nothing with --random-weights");
    TESSERA_CHECK(max_prefill + 1 <= config_.max_position_embeddings,
                  space_.source << ": measure.prefill_tokens: " << max_prefill << " tokens exceed the model's "
                                << config_.max_position_embeddings << " positions");
    const auto t0 = Clock::now();
    random_weights_ = std::make_shared<const WeightStore>(random_llama_weights(config_, *random_weights_seed));
    std::fprintf(stderr, "tune: random bf16 weights (seed %llu) drawn in %.1f s\n",
                 static_cast<unsigned long long>(*random_weights_seed),
                 std::chrono::duration<double>(Clock::now() - t0).count());
    // The timed steps' token ids, drawn from the same seed (they do not change the time).
    for (uint64_t i = 0; i < 4096; ++i) {
      eval_tokens_.push_back(static_cast<int32_t>((*random_weights_seed * 0x9e3779b97f4a7c15ULL + i * 2654435761ULL) %
                                                  static_cast<uint64_t>(config_.vocab_size)));
    }
  } else {
    tokenizer_ = load_tokenizer(files_);
    if (std::find(space_.weight_formats.begin(), space_.weight_formats.end(), "gguf") != space_.weight_formats.end()) {
      format_rank_of_file_ = file_format_rank(files_);
    }
  }
  if (random_weights_seed) {
    // Nothing more to read: no tokenizer, no held-out text.
  } else if (is_encoder()) {
    TESSERA_CHECK(max_prefill <= config_.max_position_embeddings,
                  space_.source << ": measure.prefill_tokens: " << max_prefill << " tokens exceed this encoder's "
                                << config_.max_position_embeddings << " positions");
    // Relative to the space file, like the default beside it.
    std::filesystem::path sentences = space_.quality.sentences.empty() ? "sentences.txt" : space_.quality.sentences;
    if (sentences.is_relative()) sentences = std::filesystem::path(space_dir) / sentences;
    const std::string path = sentences.string();
    std::ifstream sentences_in(path);
    TESSERA_CHECK(sentences_in.good(), space_.source << ": quality.sentences: cannot read " << path);
    std::istringstream lines(read_file(path));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] == '#') continue;
      sentences_.push_back(tokenizer_->encode(line, /*add_special=*/true).ids);
      if (static_cast<int64_t>(sentences_.back().size()) > config_.max_position_embeddings) {
        sentences_.back().resize(static_cast<size_t>(config_.max_position_embeddings));
      }
    }
    TESSERA_CHECK(sentences_.size() >= 2, path << ": quality.sentences needs at least 2 sentences");
  } else {
    TESSERA_CHECK(max_prefill + 1 <= config_.max_position_embeddings,
                  space_.source << ": measure.prefill_tokens: " << max_prefill << " tokens exceed the model's "
                                << config_.max_position_embeddings << " positions");
    const std::string path = space_.quality.text.empty() ? default_eval_text_path() : space_.quality.text;
    std::ifstream in(path);
    TESSERA_CHECK(in.good(), "quality.text: " << path << " is missing (run scripts/fetch-models: it installs the "
                                                 "hash-checked held-out text from PyPI exllamav2==0.3.2)");
    // Wikipedia prose without the <doc ...> markup lines; enough characters for the tokens asked for.
    std::string text, line;
    const size_t want_chars = static_cast<size_t>(space_.quality.tokens) * 8 + 4096;
    while (text.size() < want_chars && std::getline(in, line)) {
      if (line.rfind("<doc", 0) == 0 || line.rfind("</doc>", 0) == 0) continue;
      text += line + "\n";
    }
    eval_tokens_ = tokenizer_->encode(text, /*add_special=*/false).ids;
    TESSERA_CHECK(static_cast<int64_t>(eval_tokens_.size()) >= space_.quality.tokens,
                  path << ": " << eval_tokens_.size() << " tokens, fewer than quality.tokens " << space_.quality.tokens);
  }
  nlohmann::json settings = {{"context", space_.context},
                             {"prefill_tokens", space_.measure.prefill_tokens},
                             {"decode_batch", space_.measure.decode_batch},
                             {"decode_context", space_.measure.decode_context},
                             {"warmup", space_.measure.warmup},
                             {"repeats", space_.measure.repeats},
                             {"quality_tokens", space_.quality.tokens},
                             {"quality_window", space_.quality.window},
                             {"reference", reference_candidate().key()}};
  if (random_weights_seed) settings["random_weights_seed"] = *random_weights_seed;
  if (space_.backend == "cuda" && std::find(space_.weight_formats.begin(), space_.weight_formats.end(), "int4_g128") !=
                                      space_.weight_formats.end()) {
    // Opened here, so a sidecar made for another model file stops the tune before anything is
    // measured. Random weights have no files, so no sidecar.
    std::optional<CalibrationSidecar> sidecar;
    if (!random_weights_) sidecar = open_calibration_sidecar(files_);
    int4_weights_source_ = tessera::int4_weights_source(sidecar);
    // Resuming reuses no record measured with other latent weights, or none (round-to-nearest adds
    // nothing, so records from before sidecars existed stay valid).
    if (sidecar) {
      settings["int4_g128_sidecar"] = {{"method", sidecar->method}, {"sha256", sidecar->sha256}};
    }
  }
  settings_ = settings.dump();
}

Measurer::~Measurer() = default;

bool Measurer::is_encoder() const { return config_.arch == Architecture::kBert; }

Candidate Measurer::reference_candidate() const {
  const auto rank = [&](const std::string& f) {
    if (f == "gguf") return format_rank_of_file_;
    if (const std::optional<DType> dtype = weight_format_from_name(f)) return weight_format_rank(*dtype);
    return f == "int4_g128" ? weight_format_rank(DType::kQ4_0) : weight_format_rank(DType::kQ8_0);  // int8, fp8_e4m3
  };
  Candidate c;
  c.weight_format = *std::max_element(space_.weight_formats.begin(), space_.weight_formats.end(),
                                      [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  c.kv_dtype = space_.kv_dtypes.front();
  const auto prefer = [](const std::vector<bool>& v, bool want) {
    return std::find(v.begin(), v.end(), want) != v.end() ? want : v.front();
  };
  c.fuse_add_rms_norm = prefer(space_.add_rms_norm, true);
  c.fuse_qkv = prefer(space_.qkv, true);
  c.gate_up = std::find(space_.gate_up.begin(), space_.gate_up.end(), "fused") != space_.gate_up.end()
                  ? "fused" : space_.gate_up.front();
  c.rope_in_kv_write = prefer(space_.rope_kv_write, false);
  c.cuda_graphs = prefer(space_.cuda_graphs, false);
  c.threads = *std::max_element(space_.threads.begin(), space_.threads.end());
  if (std::find(space_.threads.begin(), space_.threads.end(), 0) != space_.threads.end()) c.threads = 0;
  c.activation_bits = *std::max_element(space_.activation_bits.begin(), space_.activation_bits.end());
  c.decode_split_min_tokens = space_.decode_split_min_tokens.front();  // a schedule: no effect on the numbers
  return c;
}

std::unique_ptr<Measurer::Loaded> Measurer::load(const Candidate& c) const {
  auto loaded = std::make_unique<Loaded>();
  const CpuBackend* cpu = nullptr;
  if (space_.backend == "cpu") {
    CpuBackendOptions options{.num_threads = c.threads};
    if (c.activation_bits != 0) options.activation_bits = c.activation_bits;
    auto backend = std::make_unique<CpuBackend>(options);
    cpu = backend.get();
    loaded->backend = std::move(backend);
  } else {
#ifdef TESSERA_HAVE_CUDA
    check_choice_runs_on(c, "cuda", space_.source);
    CudaBackendConfig config;
    config.dtype = c.weight_format == "f16" ? ScalarType::kF16 : ScalarType::kBF16;
    config.linear_weights = *scalar_type_from_name(c.weight_format);
    config.cuda_graphs = c.cuda_graphs;
    config.decode_split_min_tokens = c.decode_split_min_tokens;
    if (c.kv_dtype == "fp8_e4m3") config.kv_cache_dtype = ScalarType::kFp8E4M3;
    loaded->backend = std::make_unique<CudaBackend>(config);
#endif
  }
  WeightStore store;
  if (random_weights_) {
    // Drawn weights have no files, so no calibration sidecar: only the format conversion applies.
    store = share_views(random_weights_);
    if (requantizes(c)) store = requantize_weights(std::move(store), *weight_format_from_name(c.weight_format));
  } else {
    store = apply_weight_format(files_, load_weights(files_), c);  // as serve loads a profile's choice
  }
  if (is_encoder()) {
    loaded->encoder = make_encoder(config_, store, *loaded->backend, choice_graph_options(c));
  } else {
    loaded->lm = make_causal_lm(config_, store, *loaded->backend, choice_graph_options(c));
  }
  if (cpu != nullptr) {
    for (const auto& [format, use] : cpu->weight_formats()) loaded->weight_bytes += use.bytes;
  } else {
#ifdef TESSERA_HAVE_CUDA
    loaded->weight_bytes = static_cast<const CudaBackend&>(*loaded->backend).weight_bytes();
#endif
  }
  return loaded;
}

void Measurer::time_decoder(Loaded& loaded, Measurement& m) const {
  Backend& backend = *loaded.backend;
  const MeasureSettings& s = space_.measure;
  const int max_prefill = *std::max_element(s.prefill_tokens.begin(), s.prefill_tokens.end());
  const int max_batch = *std::max_element(s.decode_batch.begin(), s.decode_batch.end());
  const int32_t seq_blocks = (s.decode_context + 1 + kKvBlock - 1) / kKvBlock;
  const int32_t blocks = std::max((max_prefill + kKvBlock - 1) / kKvBlock, max_batch * seq_blocks);
  KvCacheStorage cache = backend.create_kv_cache(config_.num_layers, blocks, kKvBlock,
                                                 static_cast<int32_t>(config_.num_kv_heads),
                                                 static_cast<int32_t>(config_.head_dim));
  std::vector<int32_t> block_ids(static_cast<size_t>(blocks));
  std::iota(block_ids.begin(), block_ids.end(), 0);
  const MaskPolicy causal = MaskPolicy::causal();
  // Token values do not change the time; held-out tokens keep the activations realistic.
  const auto token = [&](size_t i) { return eval_tokens_[i % eval_tokens_.size()]; };

  // One engine step as Executor::run makes it: the plan and the token ids go up in one copy, the
  // forward runs through run_step (decode steps replay a CUDA graph where the backend has them), and
  // greedy tokens are taken where the logits are.
  const auto step = [&](std::span<const AttentionPlan::Sequence> seqs, std::span<const int32_t> ids) {
    AttentionPlan plan = AttentionPlan::build(seqs, kKvBlock);
    ForwardBatch batch;
    batch.token_ids = ids;
    batch.device_token_ids = backend.prepare_step(plan, ids);
    batch.plan = &plan;
    const std::vector<int32_t> rows = plan.last_rows();
    const Tensor logits = backend.run_step(&cache, [&] { return loaded.lm->forward(batch, &cache, rows); });
    if (backend.samples_on_device()) {
      (void)backend.sample(logits, std::vector<SampleSpec>(static_cast<size_t>(logits.dim(0))));
    } else {
      (void)backend.download(logits);
    }
  };
  for (int length : s.prefill_tokens) {
    std::vector<int32_t> ids(static_cast<size_t>(length));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = token(i);
    const std::span<const int32_t> table(block_ids.data(), static_cast<size_t>((length + kKvBlock - 1) / kKvBlock));
    const AttentionPlan::Sequence seq{length, length, &causal, table};
    m.prefill.push_back(time_shape(length, s, backend, [&] { step(std::span(&seq, 1), ids); }));
  }
  for (int batch_size : s.decode_batch) {
    std::vector<AttentionPlan::Sequence> seqs;
    std::vector<int32_t> ids;
    for (int b = 0; b < batch_size; ++b) {
      const std::span<const int32_t> table(block_ids.data() + static_cast<size_t>(b) * seq_blocks,
                                           static_cast<size_t>(seq_blocks));
      seqs.push_back({1, s.decode_context + 1, &causal, table});
      ids.push_back(token(static_cast<size_t>(b)));
    }
    m.decode.push_back(time_shape(batch_size, s, backend, [&] { step(seqs, ids); }));
  }
  // KV at the configured context, in the cache's element type (f32 on the CPU; on the GPU the
  // activation type, or one byte a value for an fp8_e4m3 cache).
  m.kv_bytes = 2 * config_.num_layers * static_cast<int64_t>(space_.context) * config_.num_kv_heads *
               config_.head_dim * scalar_type_bytes(backend.kv_cache_type());
}

void Measurer::time_encoder(Loaded& loaded, Measurement& m) const {
  Backend& backend = *loaded.backend;
  const MaskPolicy bidirectional = MaskPolicy::bidirectional();
  std::vector<int32_t> pool;
  for (const auto& s : sentences_) pool.insert(pool.end(), s.begin(), s.end());
  for (int length : space_.measure.prefill_tokens) {
    std::vector<int32_t> ids(static_cast<size_t>(length));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = pool[i % pool.size()];
    const AttentionPlan::Sequence seq{length, length, &bidirectional, {}};
    m.prefill.push_back(time_shape(length, space_.measure, backend, [&] {
      AttentionPlan plan = AttentionPlan::build(std::span(&seq, 1), 0);
      backend.prepare_plan(plan);
      ForwardBatch batch;
      batch.token_ids = ids;
      batch.plan = &plan;
      (void)backend.download(loaded.encoder->embed(batch));
    }));
  }
  m.kv_bytes = 0;
}

void Measurer::score(Loaded& loaded, Measurement& m, bool keep_reference) {
  Backend& backend = *loaded.backend;
  if (is_encoder()) {
    const MaskPolicy bidirectional = MaskPolicy::bidirectional();
    std::vector<int32_t> ids;
    std::vector<AttentionPlan::Sequence> seqs;
    for (const auto& s : sentences_) {
      ids.insert(ids.end(), s.begin(), s.end());
      seqs.push_back({static_cast<int32_t>(s.size()), static_cast<int32_t>(s.size()), &bidirectional, {}});
    }
    AttentionPlan plan = AttentionPlan::build(seqs, 0);
    backend.prepare_plan(plan);
    ForwardBatch batch;
    batch.token_ids = ids;
    batch.plan = &plan;
    const std::vector<float> emb = backend.download(loaded.encoder->embed(batch));
    if (keep_reference) reference_ = emb;
    TESSERA_CHECK(reference_.size() == emb.size(), "quality: no reference embeddings to compare with");
    const size_t dim = emb.size() / sentences_.size();
    double sum = 0.0;
    for (size_t i = 0; i < sentences_.size(); ++i) {
      double dot = 0, na = 0, nb = 0;
      for (size_t d = 0; d < dim; ++d) {
        const double a = emb[i * dim + d], b = reference_[i * dim + d];
        dot += a * b, na += a * a, nb += b * b;
      }
      sum += dot / std::sqrt(std::max(na * nb, 1e-30));
    }
    m.cosine = sum / static_cast<double>(sentences_.size());
    return;
  }
  const int window = space_.quality.window;
  const int windows = space_.quality.tokens / window;
  const int64_t vocab = config_.vocab_size;
  const size_t row = static_cast<size_t>(vocab);
  if (keep_reference) reference_.assign(static_cast<size_t>(windows) * (window - 1) * row, 0.0f);
  TESSERA_CHECK(!reference_.empty(), "quality: no reference log-probs to compare with");
  const MaskPolicy causal = MaskPolicy::causal();
  std::vector<int32_t> rows(static_cast<size_t>(window));
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<double> logp;
  double nll = 0.0, kl = 0.0;
  int64_t predictions = 0;
  // On the GPU each window is a prompt written to a paged KV cache and read back through it, as the
  // server runs a prompt: so a candidate's kv_dtype (an fp8_e4m3 cache rounds every K and V the
  // attention reads) shows in its perplexity and KL. Read straight from the QKV projection instead,
  // K and V never touch the cache and every kv_dtype would score the same. (With a cache in the
  // activation dtype both ways read the same values.) The CPU keeps the cache-less form its
  // recorded CI numbers were measured with; its cache is f32 either way.
  const bool paged = space_.backend == "cuda";
  const int32_t window_blocks = (window + kKvBlock - 1) / kKvBlock;
  std::optional<KvCacheStorage> cache;
  std::vector<int32_t> table(static_cast<size_t>(window_blocks));
  std::iota(table.begin(), table.end(), 0);
  if (paged) {
    cache = backend.create_kv_cache(config_.num_layers, window_blocks, kKvBlock,
                                    static_cast<int32_t>(config_.num_kv_heads), static_cast<int32_t>(config_.head_dim));
  }
  for (int w = 0; w < windows; ++w) {
    const std::span<const int32_t> ids(eval_tokens_.data() + static_cast<size_t>(w) * window, static_cast<size_t>(window));
    const AttentionPlan::Sequence seq{window, window, &causal, paged ? std::span<const int32_t>(table)
                                                                     : std::span<const int32_t>()};
    AttentionPlan plan = AttentionPlan::build(std::span(&seq, 1), paged ? kKvBlock : 0);
    backend.prepare_plan(plan);
    ForwardBatch batch;
    batch.token_ids = ids;
    batch.plan = &plan;
    const std::vector<float> logits =
        backend.download(loaded.lm->forward(batch, cache ? &*cache : nullptr, rows));
    for (int p = 0; p + 1 < window; ++p) {
      log_softmax(logits.data() + static_cast<size_t>(p) * row, vocab, logp);
      nll -= logp[static_cast<size_t>(ids[static_cast<size_t>(p) + 1])];
      float* ref = reference_.data() + (static_cast<size_t>(w) * (window - 1) + static_cast<size_t>(p)) * row;
      if (keep_reference) {
        for (size_t i = 0; i < row; ++i) ref[i] = static_cast<float>(logp[i]);
      } else {
        double d = 0.0;
        for (size_t i = 0; i < row; ++i) {
          const double lr = ref[i];
          d += std::exp(lr) * (lr - logp[i]);
        }
        kl += d;
      }
      ++predictions;
    }
  }
  m.perplexity = std::exp(nll / static_cast<double>(predictions));
  // Rounding of the stored fp32 log-probs can leave a hair below 0 for an identical distribution.
  m.kl = std::max(0.0, kl / static_cast<double>(predictions));
}

void Measurer::compute_reference() {
  if (!measures_quality()) return;
  const Candidate ref = reference_candidate();
  std::unique_ptr<Loaded> loaded = load(ref);
  Measurement ignored;
  score(*loaded, ignored, /*keep_reference=*/true);
}

Measurement Measurer::measure(const Candidate& candidate) {
  const auto t0 = Clock::now();
  Measurement m;
  m.candidate = candidate;
  m.settings = settings_;
  if (candidate.weight_format == "int4_g128") m.weights_source = int4_weights_source_;
  const bool is_reference = candidate == reference_candidate();
  TESSERA_CHECK(is_reference || has_reference(), "measure " << candidate.key() << ": the reference is not measured yet");
  try {
    std::unique_ptr<Loaded> loaded = load(candidate);
    m.weight_bytes = loaded->weight_bytes;
    if (is_encoder()) {
      time_encoder(*loaded, m);
    } else {
      time_decoder(*loaded, m);
    }
    if (measures_quality()) {
      score(*loaded, m, is_reference);
    } else {
      m.quality_measured = false;
    }
  } catch (const Error& e) {
    if (is_reference) throw;  // nothing can be compared without it
    m = Measurement{};
    m.candidate = candidate;
    m.settings = settings_;
    if (candidate.weight_format == "int4_g128") m.weights_source = int4_weights_source_;
    m.error = e.what();
  }
  m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return m;
}

}  // namespace tessera::tuner
