// bench/embed_bench.cpp: tessera-embed-bench, BERT embedding speed on a backend, as JSON lines.
// Every case runs the embedding engine's own round (run_embed_round): the round's inputs packed
// greedily into varlen forwards under --max-batch-tokens, no padding, and the embeddings downloaded to
// the host, which ends every timed run (so GPU time is all in). Weights: random at a BERT shape
// (--shape; speed does not depend on weight values) or a real model (--model). Cases:
//   fixed      B x S random token ids (--batch 128, --seq-len 128), one request of B inputs: sequences/s
//              (and tokens/s); median, p90, min and max of --reps runs
//   latency    1 x S (--seq-len): ms per embedding, median and p90 of --latency-reps runs
//   mixed      --mixed-texts random-id texts (128) with lengths uniform in [--mixed-min, --mixed-max]
//              ([16, 512]) from the LCG below (bench/embed_peers.py draws the same lengths), one request:
//              real (unpadded) tokens/s, all texts packed
//   sentences  (--model) the first --sentences-count lines of --sentences (bench/data/embed_sentences.txt)
//              in requests of each --batches size (1, 32, 256), tokenized with the model's tokenizer
//              and fitted to its max_seq_length by the server's rule: sentences/s over a
//              whole pass, tokenization timed (as sentence-transformers' encode() times it), and
//              forward_only_sentences_per_s with the ids tokenized beforehand
// Every case runs once untimed first (the GPU step workspace grows to the case's largest step then).
//   tessera-embed-bench --shape bert-base [--backend cuda] [--dtype fp16] [--cases fixed latency mixed]
//   tessera-embed-bench --model all-minilm-l6-v2 [--batches 1 32 256]      (commit from $TESSERA_COMMIT)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_output.h"
#include "common/error.h"
#include "engine/scheduler/engine_embed.h"
#include "engine/scheduler/engine_loop.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "models/bert.h"
#include "models/config/encoder_input.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tensor_names.h"
#include "models/tokenizer/tokenizer.h"

namespace tessera {
namespace {

using bench::Clock;
using bench::seconds;
using bench::Stats;
using bench::stats_of;

struct BertShape {
  const char* name;
  int64_t layers, hidden, heads, intermediate, vocab, max_positions;
};
// bert-base is BERT-base uncased; minilm-l6 all-MiniLM-L6-v2's shape; bert-tiny google's 2-layer
// bert_uncased_L-2_H-128_A-2, for quick checks on a CPU.
constexpr BertShape kShapes[] = {
    {"bert-base", 12, 768, 12, 3072, 30522, 512},
    {"minilm-l6", 6, 384, 12, 1536, 30522, 512},
    {"bert-tiny", 2, 128, 2, 512, 30522, 512},
};

// Every tensor of a BERT checkpoint as a bf16 view into one shared random buffer (normal, std 0.02,
// as BERT initialises), LayerNorm weights 1 and biases 0, so activations keep a sane scale.
struct RandomBert {
  ModelConfig config;
  WeightStore store;
  std::vector<uint16_t> pool, ones, zeros;

  explicit RandomBert(const BertShape& s) {
    config.arch = Architecture::kBert;
    config.source = std::string("random ") + s.name;
    config.num_layers = s.layers;
    config.hidden_size = s.hidden;
    config.intermediate_size = s.intermediate;
    config.num_heads = s.heads;
    config.num_kv_heads = s.heads;
    config.head_dim = s.hidden / s.heads;
    config.vocab_size = s.vocab;
    config.max_position_embeddings = s.max_positions;
    config.norm_eps = 1e-12;
    config.type_vocab_size = 2;
    config.hidden_act = "gelu";
    config.pooling = Pooling::kMean;
    config.normalize_embeddings = true;
    config.pad_token_id = 0;
    config.validate();
    pool.resize(static_cast<size_t>(std::max(s.vocab * s.hidden, s.intermediate * s.hidden)));
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (auto& v : pool) {
      const float x = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      v = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    }
    ones.assign(static_cast<size_t>(std::max(s.hidden, s.intermediate)), 0x3f80);
    zeros.assign(ones.size(), 0);
    const int64_t h = s.hidden;
    const TensorNames names(Architecture::kBert);
    using enum TensorKind;
    add(names.weight(kTokenEmbedding), {s.vocab, h});
    add(names.weight(kPositionEmbedding), {s.max_positions, h});
    add(names.weight(kTokenTypeEmbedding), {2, h});
    add_const(names.weight(kEmbeddingNorm), ones, h);
    add_const(names.bias(kEmbeddingNorm), zeros, h);
    for (int64_t l = 0; l < s.layers; ++l) {
      for (TensorKind kind : {kAttnQ, kAttnK, kAttnV, kAttnOut}) add(names.weight(kind, l), {h, h});
      for (TensorKind kind : {kAttnQ, kAttnK, kAttnV, kAttnOut, kAttnOutNorm, kFfnDown, kLayerOutNorm}) {
        add_const(names.bias(kind, l), zeros, h);
      }
      add_const(names.weight(kAttnOutNorm, l), ones, h);
      add_const(names.weight(kLayerOutNorm, l), ones, h);
      add(names.weight(kFfnUp, l), {s.intermediate, h});
      add_const(names.bias(kFfnUp, l), zeros, s.intermediate);
      add(names.weight(kFfnDown, l), {h, s.intermediate});
    }
  }

 private:
  void add(const std::string& name, std::vector<int64_t> shape) {
    const int64_t n = shape[0] * shape[1];
    store.add({name, DType::kBF16, std::move(shape),
               std::as_bytes(std::span<const uint16_t>(pool.data(), static_cast<size_t>(n))), "random"});
  }
  void add_const(const std::string& name, const std::vector<uint16_t>& values, int64_t n) {
    store.add({name, DType::kBF16, {n}, std::as_bytes(std::span<const uint16_t>(values.data(), static_cast<size_t>(n))),
               "random"});
  }
};

// Numerical Recipes' 32-bit LCG; bench/embed_peers.py has the same, so both draw the same lengths.
struct Lcg {
  uint32_t x;
  uint32_t next() {
    x = 1664525u * x + 1013904223u;
    return x;
  }
};

std::vector<int32_t> mixed_lengths(int count, int lo, int hi, uint32_t seed) {
  Lcg g{seed};
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) out.push_back(lo + static_cast<int32_t>((g.next() >> 8) % static_cast<uint32_t>(hi - lo + 1)));
  return out;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  Lcg g{seed * 2654435761u + 7};
  std::vector<int32_t> ids(static_cast<size_t>(n));
  // Past the special and unused ids at the start of BERT's vocabulary; speed does not depend on them.
  for (auto& id : ids) id = static_cast<int32_t>(1000 + (g.next() >> 4) % static_cast<uint32_t>(vocab - 1000));
  return ids;
}


// One request of `inputs` through the engine's round; returns once the embeddings are on the host.
void embed_once(std::vector<EngineLoop::ServedEncoder>& encoders, Backend& backend,
                const std::vector<std::vector<int32_t>>& inputs, int64_t max_batch_tokens) {
  std::vector<std::unique_ptr<EmbedJob>> round;
  round.push_back(std::make_unique<EmbedJob>());
  round[0]->inputs = inputs;
  std::future<EmbedResult> done = round[0]->promise.get_future();
  run_embed_round(round, encoders, backend, max_batch_tokens);
  const EmbedResult r = done.get();
  TESSERA_CHECK(r.error == SubmitError::kNone, "embedding round failed: " << r.message);
  TESSERA_CHECK(r.embeddings.size() == inputs.size(), "embedding round returned " << r.embeddings.size() << " of "
                                                                                  << inputs.size() << " embeddings");
}

int64_t count_forwards(const std::vector<std::vector<int32_t>>& inputs, int64_t budget) {
  int64_t forwards = 0, tokens = 0;
  for (const auto& in : inputs) {
    const auto n = static_cast<int64_t>(in.size());
    if (tokens == 0 || tokens + n > budget) {
      ++forwards;
      tokens = 0;
    }
    tokens += n;
  }
  return forwards;
}

// [CLS] ... [SEP] of each text, fitted to the model's limit by the server's rule (truncated keeping [SEP]).
std::vector<std::vector<int32_t>> encode_fitted(const Tokenizer& tokenizer, const std::vector<std::string>& texts,
                                                size_t begin, size_t end, const EncoderInputLimit& limit) {
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = begin; i < end; ++i) ids.push_back(tokenizer.encode(texts[i], /*add_special=*/true).ids);
  fit_encoder_inputs(ids, limit, /*truncate=*/true, tokenizer);
  return ids;
}

struct Options {
  std::string shape;
  std::string model;
  std::string backend = "cuda";
  std::string dtype = "fp16";
  int threads = 0;
  std::vector<std::string> cases;
  int batch = 128;
  int seq_len = 128;
  int reps = 10;
  int latency_reps = 100;
  int warmup = 3;
  int mixed_texts = 128;
  int mixed_min = 16;
  int mixed_max = 512;
  uint32_t seed = 11;
  int64_t max_batch_tokens = 65536;
  bool cuda_graphs = true;
  std::string sentences = "bench/data/embed_sentences.txt";
  int sentences_count = 1024;
  std::vector<int> batches{1, 32, 256};
};

struct Context {
  const Options& o;
  Backend& backend;
  std::vector<EngineLoop::ServedEncoder> encoders;  // the one model, as the engine holds it
  std::string model_name;
  std::string device;
  const Tokenizer* tokenizer = nullptr;
  EncoderInputLimit limit;

  void emit(nlohmann::json line) const {
    line["bench"] = "tessera_embed";
    line["impl"] = "tessera";
    line["model"] = model_name;
    line["backend"] = backend.name();
    const ScalarType t = backend.activation_type();
    line["dtype"] = t == ScalarType::kF16 ? "fp16" : t == ScalarType::kBF16 ? "bf16" : "fp32";
    line["device"] = device;
    line["max_batch_tokens"] = o.max_batch_tokens;
    line["cuda_graphs"] = o.backend == "cuda" && o.cuda_graphs;
    bench::print_json_line(std::move(line));
  }

  // Seconds of each of `reps` timed runs of one request, after `warmup` untimed ones.
  std::vector<double> time_runs(const std::vector<std::vector<int32_t>>& inputs, int reps, int warmup) {
    for (int i = 0; i < std::max(1, warmup); ++i) embed_once(encoders, backend, inputs, o.max_batch_tokens);
    std::vector<double> secs;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      embed_once(encoders, backend, inputs, o.max_batch_tokens);
      secs.push_back(seconds(t0, Clock::now()));
    }
    return secs;
  }
};

void case_fixed(Context& c) {
  const Options& o = c.o;
  std::vector<std::vector<int32_t>> inputs;
  for (int b = 0; b < o.batch; ++b) inputs.push_back(random_ids(o.seq_len, c.encoders[0].config.vocab_size, 100 + b));
  const Stats s = stats_of(c.time_runs(inputs, o.reps, o.warmup));
  const double tokens = double(o.batch) * o.seq_len;
  c.emit({{"case", "fixed"}, {"batch", o.batch}, {"seq_len", o.seq_len}, {"value", o.batch / s.median},
          {"unit", "seq/s"}, {"median", o.batch / s.median}, {"p90", o.batch / s.p90}, {"min", o.batch / s.max},
          {"max", o.batch / s.min}, {"tokens_per_s", tokens / s.median}, {"median_ms", s.median * 1000},
          {"forwards", count_forwards(inputs, o.max_batch_tokens)}, {"reps", o.reps}});
}

void case_latency(Context& c) {
  const Options& o = c.o;
  const std::vector<std::vector<int32_t>> inputs{random_ids(o.seq_len, c.encoders[0].config.vocab_size, 7)};
  const Stats s = stats_of(c.time_runs(inputs, o.latency_reps, std::max(o.warmup, 10)));
  c.emit({{"case", "latency"}, {"batch", 1}, {"seq_len", o.seq_len}, {"value", s.median * 1000}, {"unit", "ms"},
          {"median", s.median * 1000}, {"p90", s.p90 * 1000}, {"min", s.min * 1000}, {"max", s.max * 1000},
          {"reps", o.latency_reps}});
}

void case_mixed(Context& c) {
  const Options& o = c.o;
  const std::vector<int32_t> lengths = mixed_lengths(o.mixed_texts, o.mixed_min, o.mixed_max, o.seed);
  std::vector<std::vector<int32_t>> inputs;
  int64_t real = 0;
  int32_t longest = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    inputs.push_back(random_ids(lengths[i], c.encoders[0].config.vocab_size, 1000 + static_cast<uint32_t>(i)));
    real += lengths[i];
    longest = std::max(longest, lengths[i]);
  }
  const Stats s = stats_of(c.time_runs(inputs, o.reps, o.warmup));
  c.emit({{"case", "mixed"}, {"texts", o.mixed_texts}, {"min_len", o.mixed_min}, {"max_len", o.mixed_max},
          {"seed", o.seed}, {"real_tokens", real}, {"longest", longest},
          {"padded_tokens", int64_t{longest} * o.mixed_texts}, {"value", double(real) / s.median},
          {"unit", "tok/s"}, {"median", double(real) / s.median}, {"p90", double(real) / s.p90},
          {"min", double(real) / s.max}, {"max", double(real) / s.min}, {"median_ms", s.median * 1000},
          {"forwards", count_forwards(inputs, o.max_batch_tokens)}, {"packing", "varlen, no padding"},
          {"reps", o.reps}});
}

void case_sentences(Context& c) {
  const Options& o = c.o;
  TESSERA_CHECK(c.tokenizer != nullptr, "the sentences case needs --model (a tokenizer)");
  std::ifstream in(o.sentences);
  TESSERA_CHECK(in.good(), "--sentences: cannot read " << o.sentences << " (run from the repo root, or give the path)");
  std::vector<std::string> sentences;
  for (std::string line; std::getline(in, line) && static_cast<int>(sentences.size()) < o.sentences_count;) {
    if (!line.empty()) sentences.push_back(line);
  }
  TESSERA_CHECK(!sentences.empty(), o.sentences << " holds no sentences");
  const size_t n = sentences.size();
  const std::vector<std::vector<int32_t>> all_ids = encode_fitted(*c.tokenizer, sentences, 0, n, c.limit);
  int64_t tokens = 0;
  for (const auto& ids : all_ids) tokens += static_cast<int64_t>(ids.size());
  for (const int b : o.batches) {
    const size_t step = static_cast<size_t>(std::max(1, b));
    // One pass: every sentence once, in requests of b; tokenized inside the pass or before it.
    // Returns the pass's seconds; adds the time spent tokenizing to *tokenize_s.
    auto pass = [&](bool tokenize, double* tokenize_s) {
      const auto t0 = Clock::now();
      for (size_t at = 0; at < n; at += step) {
        const size_t end = std::min(n, at + step);
        std::vector<std::vector<int32_t>> inputs;
        if (tokenize) {
          const auto tt = Clock::now();
          inputs = encode_fitted(*c.tokenizer, sentences, at, end, c.limit);
          *tokenize_s += seconds(tt, Clock::now());
        } else {
          inputs.assign(all_ids.begin() + static_cast<ptrdiff_t>(at), all_ids.begin() + static_cast<ptrdiff_t>(end));
        }
        embed_once(c.encoders, c.backend, inputs, o.max_batch_tokens);
      }
      return seconds(t0, Clock::now());
    };
    double unused = 0;
    for (int w = 0; w < std::max(1, o.warmup); ++w) pass(false, &unused);
    std::vector<double> with_tok, forward_only, tokenizing;
    const int reps = std::max(1, o.reps / 2);
    for (int r = 0; r < reps; ++r) {
      double tok_s = 0;
      with_tok.push_back(pass(true, &tok_s));
      tokenizing.push_back(tok_s);
      forward_only.push_back(pass(false, &unused));
    }
    const Stats s = stats_of(with_tok), f = stats_of(forward_only), t = stats_of(tokenizing);
    c.emit({{"case", "sentences"}, {"batch", b}, {"sentences", n}, {"tokens", tokens}, {"value", double(n) / s.median},
            {"unit", "sentences/s"}, {"median", double(n) / s.median}, {"p90", double(n) / s.p90},
            {"min", double(n) / s.max}, {"max", double(n) / s.min}, {"forward_only_sentences_per_s", double(n) / f.median},
            {"tokenize_ms_per_pass", t.median * 1000}, {"max_seq_length", c.limit.tokens}, {"reps", reps}});
  }
}

int run(const Options& o) {
  std::unique_ptr<Backend> backend;
  std::string device;
  if (o.backend == "cuda") {
    CudaBackendConfig config;
    config.dtype = o.dtype == "bf16" ? ScalarType::kBF16 : ScalarType::kF16;
    config.linear_weights = config.dtype;  // unquantized
    config.cuda_graphs = o.cuda_graphs;
    auto cuda = std::make_unique<CudaBackend>(config);
    device = cuda->device_description();
    backend = std::move(cuda);
  } else {
    backend = std::make_unique<CpuBackend>(o.threads);
    device = "cpu";
  }
  Context c{o, *backend, {}, "", device, nullptr, {}};
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> cases = o.cases;
  if (!o.model.empty()) {
    const ModelFiles files = locate_model(o.model);
    const ModelConfig config = load_model_config(files);
    TESSERA_CHECK(config.arch == Architecture::kBert, o.model << " is not an encoder (bert)");
    tokenizer = load_tokenizer(files);
    c.encoders.push_back({o.model, config, make_encoder(config, load_weights(files), *backend), nullptr});
    c.model_name = o.model;
    c.tokenizer = tokenizer.get();
    c.limit = encoder_input_limit(config);
    if (cases.empty()) cases = {"sentences"};
  } else {
    const BertShape* shape = nullptr;
    for (const BertShape& s : kShapes) {
      if (o.shape == s.name) shape = &s;
    }
    TESSERA_CHECK(shape != nullptr, "--shape: expected bert-base, minilm-l6 or bert-tiny, got '" << o.shape << "'");
    RandomBert random(*shape);
    c.encoders.push_back({shape->name, random.config, make_encoder(random.config, random.store, *backend), nullptr});
    c.model_name = std::string(shape->name) + " (random weights)";
    c.limit = encoder_input_limit(random.config);
    if (cases.empty()) cases = {"fixed", "latency", "mixed"};
  }
  const int64_t positions = c.encoders[0].config.max_position_embeddings;
  TESSERA_CHECK(o.seq_len >= 1 && o.seq_len <= positions, "--seq-len " << o.seq_len << " is outside [1, " << positions << "]");
  TESSERA_CHECK(o.mixed_min >= 1 && o.mixed_min <= o.mixed_max && o.mixed_max <= positions,
                "--mixed-min/--mixed-max: need 1 <= min <= max <= " << positions);
  std::fprintf(stderr, "embed-bench: %s on %s\n", c.model_name.c_str(), backend->describe().c_str());
  for (const std::string& name : cases) {
    if (name == "fixed") {
      case_fixed(c);
    } else if (name == "latency") {
      case_latency(c);
    } else if (name == "mixed") {
      case_mixed(c);
    } else if (name == "sentences") {
      case_sentences(c);
    } else {
      TESSERA_FAIL("--cases: unknown case '" << name << "' (fixed, latency, mixed, sentences)");
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Options o;
  CLI::App app{"tessera-embed-bench: BERT embedding throughput and latency through the embedding engine, as JSON lines"};
  auto* shape = app.add_option("--shape", o.shape, "Random weights at a BERT shape: bert-base, minilm-l6, bert-tiny");
  auto* model = app.add_option("--model", o.model, "A real encoder (name in the model dir, or a folder)");
  shape->excludes(model);
  app.add_option("--backend", o.backend, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}))->capture_default_str();
  app.add_option("--dtype", o.dtype, "cuda: bf16 or fp16")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
  app.add_flag("--no-cuda-graphs{false}", o.cuda_graphs, "cuda: run one-text forwards eagerly (no CUDA graphs)");
  app.add_option("--threads", o.threads, "cpu backend threads (0: all)")->capture_default_str();
  app.add_option("--cases", o.cases, "fixed, latency, mixed (default with --shape), sentences (default with --model)");
  app.add_option("--batch", o.batch, "fixed: texts per request")->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "fixed and latency: tokens per text")->capture_default_str();
  app.add_option("--reps", o.reps, "timed runs of fixed and mixed (sentences: half as many passes)")->capture_default_str();
  app.add_option("--latency-reps", o.latency_reps, "timed runs of latency")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed runs before each case (latency: at least 10)")->capture_default_str();
  app.add_option("--mixed-texts", o.mixed_texts, "mixed: texts")->capture_default_str();
  app.add_option("--mixed-min", o.mixed_min, "mixed: shortest length")->capture_default_str();
  app.add_option("--mixed-max", o.mixed_max, "mixed: longest length")->capture_default_str();
  app.add_option("--seed", o.seed, "mixed: LCG seed of the lengths")->capture_default_str();
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "tokens per packed forward (the engine's limit)")
      ->capture_default_str();
  app.add_option("--sentences", o.sentences, "sentences: one sentence a line")->capture_default_str();
  app.add_option("--sentences-count", o.sentences_count, "sentences: how many lines to embed per pass")
      ->capture_default_str();
  app.add_option("--batches", o.batches, "sentences: request sizes")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.shape.empty() && o.model.empty()) {
    std::fprintf(stderr, "give --shape or --model\n");
    return 2;
  }
  try {
    return tessera::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed-bench: %s\n", e.what());
    return 1;
  }
}
