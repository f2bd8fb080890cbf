// bench/engine_bench.cpp: tessera-engine-bench, end-to-end model speed on a backend, as JSON lines.
// Steps run through the Executor the server's engine uses (plan, forward, greedy pick where the
// logits are), on a real model (--model) or a Llama shape with random bf16 weights (--shape): speed does
// not depend on weight values. Cases:
//   decode   batch 1: a 128-token prompt, then 128 greedy tokens: decode tok/s over tokens 2..128
//   prefill  512-token prefill tok/s, and TTFT of a 128-token prompt (prefill + first token); each
//            line's host_ms is the median time until the forward was issued (every kernel launched),
//            and the prefill line's step_ms the median whole step, so host launch time and the wait
//            for the GPU can be told apart
//   offline  B sequences of 128 in / 128 out stepping together (B = 1, 8, 32, 64): total tok/s
//            (B * 256 / wall) and decode tok/s (B * 127 / time after the prefills)
//   speculative  B sequences of 256 tokens (--spec-batches, default 1 and 8): a decode step's time
//            beside a verify step's with k drafts each (--spec-drafts, default 1..4), and the speedup a fixed acceptance profile would give
//            (--acceptance a: each draft kept with probability a once the ones before it were, so
//            a verify yields 1 + a + ... + a^k tokens): random weights keep no draft, so the
//            profile is replayed on the step times. With it the CUDA backend plans decode
//            attention as a speculating server does (CudaBackendConfig::batch_invariant_decode).
// Times are wall clock around whole steps (each ends with the sampled ids on the host), after a warm-up;
// medians of --reps with min and max. --linear-weights keeps the CUDA backend's linear weights in a
// weight-only format (CudaBackendConfig::linear_weights), --kv-cache fp8_e4m3 stores the KV cache as
// e4m3 (CudaBackendConfig::kv_cache_dtype), and --fusions names the fusions beyond the fused graph
// (GraphOptions; by default the served graph, default_graph_options); each line names all three. With
// --tensor-parallel N the model is sharded over N GPUs, its lm_head split by vocabulary unless
// --lm-head replicated, its small all-reduces by the one-shot kernel unless --allreduce nccl.
#include <CLI/CLI.hpp>
#include <cuda_profiler_api.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_output.h"
#include "common/error.h"
#include "engine/follower_ranks.h"
#include "engine/generation.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "models/model_files.h"
#include "models/model_loader.h"

namespace tessera {
namespace {

using bench::Clock;
using bench::seconds;
using bench::Stats;
using bench::stats_of;

struct Shape {
  const char* name;
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab;
  double rope_theta;
  bool tied;
};
constexpr Shape kShapes[] = {
    {"smollm2-135m", 576, 1536, 30, 9, 3, 49152, 100000.0, true},
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 10000.0, false},
    {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 10000.0, false},
    {"llama2-70b", 8192, 28672, 80, 64, 8, 32000, 10000.0, false},
};

// Every tensor of a Llama checkpoint as a bf16 view into one shared random buffer, so a 7B shape
// needs only its largest tensor's bytes of host memory.
struct RandomLlama {
  ModelConfig config;
  WeightStore store;
  std::vector<uint16_t> pool;

  explicit RandomLlama(const Shape& s) {
    config.arch = Architecture::kLlama;
    config.source = std::string("random ") + s.name;
    config.num_layers = s.layers;
    config.hidden_size = s.hidden;
    config.intermediate_size = s.intermediate;
    config.num_heads = s.heads;
    config.num_kv_heads = s.kv_heads;
    config.head_dim = s.hidden / s.heads;
    config.vocab_size = s.vocab;
    // Random weights have no trained context; room for the longest ttft prompt.
    config.max_position_embeddings = 32768;
    config.rope_theta = s.rope_theta;
    config.tie_word_embeddings = s.tied;
    config.norm_eps = 1e-5;
    const int64_t largest = std::max({s.vocab * s.hidden, s.intermediate * s.hidden});
    pool.resize(static_cast<size_t>(largest));
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (auto& v : pool) {
      const float x = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      v = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    }
    // Norm weights near 1, so activations keep a sane scale through 32 layers.
    ones.assign(static_cast<size_t>(s.hidden), 0x3f80);
    const int64_t hd = config.head_dim;
    add("model.embed_tokens.weight", {s.vocab, s.hidden});
    if (!s.tied) add("lm_head.weight", {s.vocab, s.hidden});
    add_ones("model.norm.weight", s.hidden);
    for (int64_t l = 0; l < s.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add_ones(p + "input_layernorm.weight", s.hidden);
      add_ones(p + "post_attention_layernorm.weight", s.hidden);
      add(p + "self_attn.q_proj.weight", {s.heads * hd, s.hidden});
      add(p + "self_attn.k_proj.weight", {s.kv_heads * hd, s.hidden});
      add(p + "self_attn.v_proj.weight", {s.kv_heads * hd, s.hidden});
      add(p + "self_attn.o_proj.weight", {s.hidden, s.heads * hd});
      add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden});
      add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden});
      add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate});
    }
  }

 private:
  std::vector<uint16_t> ones;
  void add(const std::string& name, std::vector<int64_t> shape) {
    const int64_t n = shape[0] * shape[1];
    store.add({name, DType::kBF16, std::move(shape),
               std::as_bytes(std::span<const uint16_t>(pool.data(), static_cast<size_t>(n))), "random"});
  }
  void add_ones(const std::string& name, int64_t n) {
    store.add({name, DType::kBF16, {n}, std::as_bytes(std::span<const uint16_t>(ones.data(), static_cast<size_t>(n))),
               "random"});
  }
};


// One step and its greedy tokens, as the server's engine takes them: sampled where the logits are
// when the backend can, else from the logits on the host. `issued`, when given, gets the time the
// forward returned: on a GPU every kernel of the forward has been launched then, and the wait for
// the sampled tokens comes after.
std::vector<int32_t> step_greedy(Generator& gen, Backend& backend, std::span<const Generator::SequenceInput> in,
                                 Clock::time_point* issued = nullptr) {
  const Tensor logits = gen.forward(in);
  if (issued != nullptr) *issued = Clock::now();
  std::vector<int32_t> tokens;
  if (backend.samples_on_device()) {
    const std::vector<SampleSpec> specs(in.size());  // default: greedy, no logprobs
    for (const SampleOutcome& o : backend.sample(logits, specs)) tokens.push_back(o.token);
    return tokens;
  }
  const std::vector<float> flat = backend.download(logits);
  const auto vocab = static_cast<size_t>(logits.dim(1));
  for (size_t row = 0; row < in.size(); ++row) {
    const auto first = flat.begin() + static_cast<std::ptrdiff_t>(row * vocab);
    tokens.push_back(static_cast<int32_t>(std::max_element(first, first + static_cast<std::ptrdiff_t>(vocab)) - first));
  }
  return tokens;
}


std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

// One run of B sequences: each prefilled (all B in one step, split under max_batch_tokens), then
// `new_tokens - 1` decode steps with all B together. Returns {prefill seconds, decode seconds}; with
// decode_issue_seconds, also each decode step's time until its forward was issued (the GPU waits
// that long for the host between two steps).
std::pair<double, double> run_batch(const ShardedModel& model, Backend& backend, int batch, int prompt_tokens, int new_tokens,
                                    int max_batch_tokens, uint32_t seed,
                                    std::vector<double>* decode_issue_seconds = nullptr) {
  GeneratorConfig gc;
  gc.block_size = 16;
  gc.num_blocks = batch * ((prompt_tokens + new_tokens) / 16 + 2);
  Generator gen(model.first(), backend, gc, model.followers);
  if (new_tokens > 1) {  // as the server does at start: decode graphs captured before the first step
    WarmUpConfig w;
    w.max_batch_tokens = max_batch_tokens;
    w.max_batch_seqs = batch;
    w.max_context = prompt_tokens + new_tokens;
    gen.warm_up(w);
  }
  const MaskPolicy causal = MaskPolicy::causal();
  std::vector<std::vector<int32_t>> seqs;
  for (int b = 0; b < batch; ++b) seqs.push_back(prompt_of(prompt_tokens, model.first().config().vocab_size, seed + b));
  std::vector<int32_t> next(static_cast<size_t>(batch));
  const auto t0 = Clock::now();
  // Prefill: as many whole prompts per step as the token budget takes.
  for (int b0 = 0; b0 < batch;) {
    std::vector<Generator::SequenceInput> in;
    int step_tokens = 0;
    int b = b0;
    for (; b < batch && (in.empty() || step_tokens + prompt_tokens <= max_batch_tokens); ++b) {
      in.push_back({static_cast<SeqId>(b + 1), seqs[static_cast<size_t>(b)], &causal});
      step_tokens += prompt_tokens;
    }
    const std::vector<int32_t> tokens = step_greedy(gen, backend, in);
    for (int i = b0; i < b; ++i) next[static_cast<size_t>(i)] = tokens[static_cast<size_t>(i - b0)];
    b0 = b;
  }
  const auto t1 = Clock::now();
  for (int t = 1; t < new_tokens; ++t) {
    std::vector<Generator::SequenceInput> in;
    for (int b = 0; b < batch; ++b) {
      in.push_back({static_cast<SeqId>(b + 1), std::span<const int32_t>(&next[static_cast<size_t>(b)], 1), &causal});
    }
    const auto step_start = Clock::now();
    Clock::time_point issued;
    next = step_greedy(gen, backend, in, &issued);
    if (decode_issue_seconds != nullptr) decode_issue_seconds->push_back(seconds(step_start, issued));
  }
  const auto t2 = Clock::now();
  for (int b = 0; b < batch; ++b) gen.release(static_cast<SeqId>(b + 1));
  return {seconds(t0, t1), seconds(t1, t2)};
}

// Each timed prefill step: the whole step (until the sampled token is on the host), and the part of
// it until the forward was issued. A host-bound step (a small model, where launching the kernels
// takes longer than running them) has the two close; a GPU-bound one has the second far below.
struct PrefillTimes {
  std::vector<double> step_seconds;
  std::vector<double> issue_seconds;
};

// Batch-1 prefill of `reps` prompts in one Generator, each timed, after as many untimed ones. A small
// model's prefill takes about 2 ms: timed from a cold start (a new Generator and its KV cache per
// run), one process of the same binary measured 210k tok/s and the next 290k on SmolLM2's shape,
// while back-to-back runs keep the GPU busy and its clocks up.
PrefillTimes prefill_seconds(const ShardedModel& model, Backend& backend, int prompt_tokens, int reps) {
  GeneratorConfig gc;
  gc.block_size = 16;
  gc.num_blocks = prompt_tokens / 16 + 2;
  Generator gen(model.first(), backend, gc, model.followers);
  const MaskPolicy causal = MaskPolicy::causal();
  PrefillTimes times;
  for (int r = 0; r < 2 * reps; ++r) {
    const std::vector<int32_t> prompt = prompt_of(prompt_tokens, model.first().config().vocab_size, 50 + r);
    const Generator::SequenceInput in{1, prompt, &causal};
    const auto t0 = Clock::now();
    Clock::time_point issued;
    step_greedy(gen, backend, std::span<const Generator::SequenceInput>(&in, 1), &issued);
    if (r >= reps) {
      times.step_seconds.push_back(seconds(t0, Clock::now()));
      times.issue_seconds.push_back(seconds(t0, issued));
    }
    gen.release(1);
  }
  return times;
}

// Median milliseconds of one step of `batch` sequences of kSpecContext tokens, each row its last
// token and `drafts` draft tokens (0: a decode step), sampled as the engine samples a verify. The
// sequences are truncated back after each step, so every step sees the same context.
constexpr int kSpecContext = 256;

// On the CUDA backend, under `ncu --profile-from-start off`, only the timed steps are profiled.
double speculative_step_ms(const ShardedModel& model, Backend& backend, bool cuda, int batch, int drafts, int reps) {
  GeneratorConfig gc;
  gc.block_size = 16;
  gc.num_blocks = batch * ((kSpecContext + 16) / 16 + 2);
  gc.prefix_caching = false;  // truncation takes back the step's positions
  Generator gen(model.first(), backend, gc, model.followers);
  WarmUpConfig w;
  w.max_batch_tokens = kSpecContext;
  w.max_batch_seqs = batch * 8;  // rows: each sequence's last token and up to 7 drafts
  w.max_context = kSpecContext + 16;
  w.verify_shapes = true;
  gen.warm_up(w);
  const MaskPolicy causal = MaskPolicy::causal();
  for (int b = 0; b < batch; ++b) {
    const std::vector<int32_t> prompt = prompt_of(kSpecContext, model.first().config().vocab_size, 300 + b);
    const Generator::SequenceInput in{static_cast<SeqId>(b + 1), prompt, &causal};
    step_greedy(gen, backend, std::span(&in, 1));
  }
  const std::vector<int32_t> row = prompt_of(drafts + 1, model.first().config().vocab_size, 7);
  std::vector<double> secs;
  for (int r = 0; r < 2 * reps; ++r) {
    if (cuda && r == reps) (void)cudaProfilerStart();
    std::vector<Generator::SequenceInput> in;
    for (int b = 0; b < batch; ++b) in.push_back({static_cast<SeqId>(b + 1), row, &causal, drafts > 0, drafts});
    const auto t0 = Clock::now();
    Tensor earlier;
    const Tensor logits = gen.forward(in, &earlier);
    for (const Tensor& t : {logits, earlier}) {
      if (!t.defined() || t.dim(0) == 0) continue;
      if (backend.samples_on_device()) {
        (void)backend.sample(t, std::vector<SampleSpec>(static_cast<size_t>(t.dim(0))));
      } else {
        (void)backend.download(t);
      }
    }
    if (r >= reps) secs.push_back(seconds(t0, Clock::now()));
    for (int b = 0; b < batch; ++b) gen.truncate(static_cast<SeqId>(b + 1), kSpecContext);
  }
  if (cuda) (void)cudaProfilerStop();
  return stats_of(secs).median * 1000;
}

struct Options {
  std::string shape;
  std::string model;
  std::string backend = "cuda";
  std::vector<std::string> cases{"decode", "prefill", "offline"};
  std::vector<int> batches{1, 8, 32, 64};
  int reps = 3;
  int max_batch_tokens = 8192;
  int ttft_tokens = 128;             // the prompt of the ttft case
  std::string linear_weights = "bf16";
  std::string kv_cache = "native";   // cuda: the paged KV cache in the dtype, or fp8_e4m3
  std::vector<std::string> fusions;  // gate_up_epilogue, rope_kv_write, none; empty: as served
  double acceptance = 0.6;           // speculative: the replayed acceptance profile
  std::vector<int> spec_batches{1, 8};         // speculative: batch sizes
  std::vector<int> spec_drafts{1, 2, 3, 4};    // speculative: draft counts of the verify steps timed
  int tensor_parallel = 1;           // cuda: GPUs the model is sharded over
  std::string lm_head = "split";     // over the ranks by vocabulary, or replicated on each
  std::string allreduce = "oneshot"; // small all-reduces by the one-shot kernel, or all by NCCL
};

ScalarType linear_weights_of(const std::string& name) {
  if (name == "int8") return ScalarType::kInt8PerRow;
  if (name == "int4_g128") return ScalarType::kInt4G128;
  if (name == "fp8_e4m3") return ScalarType::kFp8E4M3PerRow;
  TESSERA_CHECK(name == "bf16", "--linear-weights: expected bf16, int8, fp8_e4m3 or int4_g128, got '" << name << "'");
  return ScalarType::kBF16;
}

// The graph the model runs: without --fusions the one it is served with (default_graph_options);
// with it the fused graph plus the fusions named ("none": neither).
GraphOptions graph_options_of(const Options& o, const ModelConfig& config, const Backend& backend) {
  GraphOptions g = o.fusions.empty() ? default_graph_options(config, backend) : GraphOptions{};
  g.split_lm_head = o.lm_head == "split";
  for (const std::string& f : o.fusions) {
    if (f == "gate_up_epilogue") {
      g.gate_up_epilogue = true;
    } else if (f == "rope_kv_write") {
      g.rope_in_kv_write = true;
    } else {
      TESSERA_CHECK(f == "none" && o.fusions.size() == 1,
                    "--fusions: expected none, or gate_up_epilogue and/or rope_kv_write, got '" << f << "'");
    }
  }
  return g;
}

// What every result line names besides its numbers.
struct RunLabels {
  std::string device;
  std::string model_name;
  std::string graph;
};

void emit(nlohmann::json line, const RunLabels& labels, const Options& o) {
  line["bench"] = "tessera_engine";
  line["model"] = labels.model_name;
  line["device"] = labels.device;
  line["linear_weights"] = o.linear_weights;
  line["kv_cache"] = o.kv_cache;
  line["graph"] = labels.graph;
  line["tensor_parallel"] = o.tensor_parallel;
  if (o.tensor_parallel > 1) line["allreduce"] = o.allreduce;
  bench::print_json_line(std::move(line));
}

// The backends of o.tensor_parallel ranks (one unless sharded), rank 0 first; `device` names the GPU.
std::vector<std::unique_ptr<Backend>> make_bench_backends(const Options& o, std::string& device) {
  std::vector<std::unique_ptr<Backend>> backends;
  if (o.backend != "cuda") {
    TESSERA_CHECK(o.linear_weights == "bf16", "--linear-weights: " << o.linear_weights << " is a CUDA backend format");
    TESSERA_CHECK(o.kv_cache == "native", "--kv-cache: " << o.kv_cache << " is a CUDA backend format");
    TESSERA_CHECK(o.tensor_parallel == 1, "--tensor-parallel: shards a model over GPUs; the backend is cpu");
    backends.push_back(std::make_unique<CpuBackend>());
    device = "cpu";
    return backends;
  }
  TESSERA_CHECK(o.tensor_parallel <= cuda_device_count(), "--tensor-parallel " << o.tensor_parallel << ": "
                                                                               << cuda_device_count() << " GPUs are visible");
  std::vector<CudaBackend*> ranks;
  for (int rank = 0; rank < o.tensor_parallel; ++rank) {
    CudaBackendConfig config;
    config.device = rank;
    config.linear_weights = linear_weights_of(o.linear_weights);
    if (o.kv_cache == "fp8_e4m3") config.kv_cache_dtype = ScalarType::kFp8E4M3;
    config.batch_invariant_decode = std::find(o.cases.begin(), o.cases.end(), "speculative") != o.cases.end();
    config.oneshot_allreduce = o.allreduce == "oneshot";
    auto cuda = std::make_unique<CudaBackend>(config);
    ranks.push_back(cuda.get());
    if (rank == 0) device = cuda->device_description();
    backends.push_back(std::move(cuda));
  }
  if (o.tensor_parallel > 1) CudaBackend::form_group(ranks);
  return backends;
}

int run(const Options& o) {
  std::string device;
  const std::vector<std::unique_ptr<Backend>> backends = make_bench_backends(o, device);
  Backend* backend = backends.front().get();
  ShardedModel model;
  RunLabels labels{device, o.model, ""};
  auto load = [&](const ModelConfig& config, const WeightStore& weights) {
    const GraphOptions graph = graph_options_of(o, config, *backend);
    labels.graph = graph.describe();
    model = ShardedModel::load(backends, [&](Backend& rank) { return make_causal_lm(config, weights, rank, graph); });
  };
  if (!o.model.empty()) {
    const ModelFiles files = locate_model(o.model);
    load(load_model_config(files), load_weights(files));
  } else {
    const Shape* shape = nullptr;
    for (const Shape& s : kShapes) {
      if (o.shape == s.name) shape = &s;
    }
    TESSERA_CHECK(shape != nullptr, "--shape: expected smollm2-135m, tinyllama-1.1b, llama2-7b or llama2-70b, got '" << o.shape << "'");
    RandomLlama random(*shape);
    load(random.config, random.store);
    labels.model_name = std::string(shape->name) + " (random bf16)";
  }
  std::fprintf(stderr, "engine-bench: %s on %s (%s; %s)\n", labels.model_name.c_str(), device.c_str(),
               backend->describe().c_str(), labels.graph.c_str());
  auto want = [&](const char* c) { return std::find(o.cases.begin(), o.cases.end(), c) != o.cases.end(); };
  run_batch(model, *backend, 1, 128, 8, o.max_batch_tokens, 1);  // warm-up: plans, workspaces, caches

  if (want("decode")) {
    std::vector<double> tps, ttft, issue;
    for (int r = 0; r < o.reps; ++r) {
      const auto [prefill_s, decode_s] = run_batch(model, *backend, 1, 128, 128, o.max_batch_tokens, 10 + r, &issue);
      tps.push_back(127.0 / decode_s);
      ttft.push_back(prefill_s * 1000);
    }
    const Stats s = stats_of(tps);
    // step_ms: a decode step at the median rate; host_ms: the median step's time until its forward
    // was issued, during which the GPU has nothing of this sequence's to run.
    emit({{"case", "decode"}, {"batch", 1}, {"prompt_tokens", 128}, {"new_tokens", 128}, {"value", s.median},
          {"unit", "tok/s"}, {"median", s.median}, {"min", s.min}, {"max", s.max}, {"reps", o.reps},
          {"step_ms", 1000 / s.median}, {"host_ms", stats_of(issue).median * 1000}},
         labels, o);
  }
  if (want("prefill")) {
    for (const auto& [name, tokens] : {std::pair{"prefill", 512}, std::pair{"ttft", o.ttft_tokens}}) {
      const PrefillTimes times = prefill_seconds(model, *backend, tokens, 4 * o.reps);
      const Stats s = stats_of(times.step_seconds);
      // host_ms: the median time until the forward was issued (PrefillTimes), beside the whole step's.
      const double host_ms = stats_of(times.issue_seconds).median * 1000;
      if (std::string(name) == "prefill") {
        emit({{"case", "prefill"}, {"batch", 1}, {"prompt_tokens", tokens}, {"value", tokens / s.median},
              {"unit", "tok/s"}, {"median", tokens / s.median}, {"min", tokens / s.max}, {"max", tokens / s.min},
              {"reps", 4 * o.reps}, {"step_ms", s.median * 1000}, {"host_ms", host_ms}},
             labels, o);
      } else {
        emit({{"case", "ttft"}, {"batch", 1}, {"prompt_tokens", tokens}, {"value", s.median * 1000}, {"unit", "ms"},
              {"median", s.median * 1000}, {"min", s.min * 1000}, {"max", s.max * 1000}, {"reps", 4 * o.reps},
              {"host_ms", host_ms}},
             labels, o);
      }
    }
  }
  if (want("offline")) {
    for (int b : o.batches) {
      std::vector<double> total, decode;
      for (int r = 0; r < std::max(1, o.reps - 1); ++r) {
        const auto [prefill_s, decode_s] = run_batch(model, *backend, b, 128, 128, o.max_batch_tokens, 100 + r);
        total.push_back(b * 256.0 / (prefill_s + decode_s));
        decode.push_back(b * 127.0 / decode_s);
      }
      const Stats t = stats_of(total), d = stats_of(decode);
      emit({{"case", "offline_total"}, {"batch", b}, {"prompt_tokens", 128}, {"new_tokens", 128}, {"value", t.median},
            {"unit", "tok/s"}, {"median", t.median}, {"min", t.min}, {"max", t.max}},
           labels, o);
      emit({{"case", "offline_decode"}, {"batch", b}, {"prompt_tokens", 128}, {"new_tokens", 128}, {"value", d.median},
            {"unit", "tok/s"}, {"median", d.median}, {"min", d.min}, {"max", d.max}},
           labels, o);
    }
  }
  if (want("speculative")) {
    const bool cuda = o.backend == "cuda";
    for (int b : o.spec_batches) {
      const double decode_ms = speculative_step_ms(model, *backend, cuda, b, 0, 4 * o.reps);
      for (int k : o.spec_drafts) {
        double tokens = 1.0, kept = 1.0;
        for (int j = 0; j < k; ++j) {
          kept *= o.acceptance;
          tokens += kept;  // a verify of k drafts yields 1 + a + ... + a^k tokens
        }
        const double verify_ms = speculative_step_ms(model, *backend, cuda, b, k, 4 * o.reps);
        const double speedup = tokens * decode_ms / verify_ms;
        emit({{"case", "speculative"}, {"batch", b}, {"drafts", k}, {"context", kSpecContext},
              {"acceptance", o.acceptance}, {"decode_step_ms", decode_ms}, {"verify_step_ms", verify_ms},
              {"tokens_per_verify", tokens}, {"value", speedup}, {"unit", "x"}, {"median", speedup},
              {"reps", 4 * o.reps}},
             labels, o);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  // Stdout carries only JSON lines: the library's log lines go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("engine-bench"));
  tessera::Options o;
  CLI::App app{"tessera-engine-bench: end-to-end decode, prefill and batched throughput as JSON lines"};
  auto* shape = app.add_option("--shape", o.shape, "Random bf16 weights at a Llama shape: smollm2-135m, tinyllama-1.1b, llama2-7b, llama2-70b");
  auto* model = app.add_option("--model", o.model, "A real model (name in the model dir, folder or .gguf)");
  shape->excludes(model);
  app.add_option("--backend", o.backend, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}))->capture_default_str();
  app.add_option("--cases", o.cases, "decode, prefill, offline, speculative")->capture_default_str();
  app.add_option("--batches", o.batches, "offline batch sizes")->capture_default_str();
  app.add_option("--reps", o.reps, "repeats per case (median reported)")->capture_default_str();
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "prefill tokens per step")->capture_default_str();
  app.add_option("--ttft-tokens", o.ttft_tokens, "the ttft case's prompt, in one step")
      ->check(CLI::Range(1, 32768))
      ->capture_default_str();
  app.add_option("--acceptance", o.acceptance, "speculative: the chance a draft is kept once the ones before it were")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--spec-batches", o.spec_batches, "speculative: batch sizes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--spec-drafts", o.spec_drafts, "speculative: draft counts of the verify steps timed")
      ->check(CLI::Range(1, 7))
      ->capture_default_str();
  app.add_option("--linear-weights", o.linear_weights, "cuda: the layers' linear weights: bf16, int8, fp8_e4m3, int4_g128")
      ->check(CLI::IsMember({"bf16", "int8", "fp8_e4m3", "int4_g128"}))
      ->capture_default_str();
  app.add_option("--kv-cache", o.kv_cache, "cuda: the paged KV cache: native (the activation dtype) or fp8_e4m3")
      ->check(CLI::IsMember({"native", "fp8_e4m3"}))
      ->capture_default_str();
  app.add_option("--tensor-parallel", o.tensor_parallel, "cuda: shard the model over this many GPUs")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--fusions", o.fusions,
                 "the fusions beyond the fused graph: gate_up_epilogue, rope_kv_write, or none (default: those the "
                 "backend runs, as served)")
      ->check(CLI::IsMember({"gate_up_epilogue", "rope_kv_write", "none"}));
  app.add_option("--allreduce", o.allreduce, "with --tensor-parallel: small all-reduces by the one-shot kernel, or all by NCCL")
      ->check(CLI::IsMember({"oneshot", "nccl"}))
      ->capture_default_str();
  app.add_option("--lm-head", o.lm_head, "with --tensor-parallel: the lm_head split over the GPUs by vocabulary, or replicated")
      ->check(CLI::IsMember({"split", "replicated"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.shape.empty() && o.model.empty()) {
    std::fprintf(stderr, "give --shape or --model\n");
    return 2;
  }
  try {
    return tessera::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine-bench: %s\n", e.what());
    return 1;
  }
}
