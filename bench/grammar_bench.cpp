// bench/grammar_bench.cpp: the grammar engine over a JSON-schema corpus (tests/grammar/
// make_schema_corpus.py), per vocabulary: compile time per schema, and the time to fill one token's
// bitmask while a seeded "random model" walks each grammar to its end (a uniformly random allowed
// token; after a few steps, mostly the tokens that close a string or container, and the stop token
// as soon as it is allowed). One JSON line per vocabulary and measure, with the slowest schemas.
// Masks run on one thread; compiles too unless --compile-threads.
//   tessera-grammar-bench --corpus FILE --tokenizer PATH [--tokenizer PATH ...]
//                         [--outputs FILE] [--seed N] [--max-steps N] [--compile-threads N] [--compact]
// PATH: a model name, folder or .gguf (a vocabulary-only GGUF such as llama.cpp's
// ggml-vocab-llama-bpe.gguf works). --outputs writes each walk of the first tokenizer as a JSON line
// {name, output, terminated, steps} for tests/grammar/test_schema_corpus.py.
#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_output.h"
#include "engine/grammar/grammar.h"
#include "models/model_files.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/tokenizer.h"
#include "models/weights/gguf.h"

namespace tessera {
namespace {

using json = nlohmann::ordered_json;

struct CorpusEntry {
  std::string name;
  std::string schema;
};

struct Walk {
  std::string output;
  bool terminated = false;
  int steps = 0;
};

std::vector<CorpusEntry> read_corpus(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in, "cannot read the corpus " << path);
  std::vector<CorpusEntry> corpus;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json entry = json::parse(line);
    corpus.push_back({entry.at("name").get<std::string>(), entry.at("schema").dump()});
  }
  return corpus;
}

std::string cpu_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// Nearest rank, as bench_output.h's stats_of; p in [0, 100].
double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size()) / 100.0));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

json summary(const std::vector<double>& ms) {
  double sum = 0;
  for (const double v : ms) sum += v;
  return {{"median_ms", percentile(ms, 50)}, {"p99_ms", percentile(ms, 99)},
          {"max_ms", *std::max_element(ms.begin(), ms.end())}, {"mean_ms", sum / static_cast<double>(ms.size())},
          {"count", ms.size()}};
}

// After a few free steps the random model heads for the end: the first of these characters whose
// one-character token is allowed closes a string (or an email's local part), then the innermost
// array or object, or moves on to the next member, or past a run of digits in a pattern (Llama 3's
// thousand number tokens would otherwise keep a "[0-9]+" going).
constexpr std::string_view kClosingOrder = "\"@]},:.-";

// The n schemas that took longest to compile, slowest first: {name: ms}.
json slowest(const std::vector<CorpusEntry>& corpus, const std::vector<double>& ms, size_t n) {
  std::vector<size_t> order(ms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] > ms[b]; });
  json out = json::array();
  for (size_t i = 0; i < std::min(n, order.size()); ++i) out.push_back({corpus[order[i]].name, ms[order[i]]});
  return out;
}

class Vocabulary {
 public:
  explicit Vocabulary(const std::string& path) : files_(locate_model(path)), tokenizer_(load_tokenizer(files_)) {
    TESSERA_CHECK(files_.gguf, path << ": the bench reads the stop token from GGUF metadata");
    const auto eos = tok::read_gguf_tokenizer_data(*files_.gguf).eos_id;
    TESSERA_CHECK(eos.has_value(), path << " names no EOS token");
    stop_token_ = *eos;
    for (const char c : kClosingOrder) {
      const auto ids = tokenizer_->encode(std::string(1, c), false).ids;
      if (ids.size() == 1) closing_tokens_.push_back(ids[0]);
    }
  }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  int32_t stop_token() const { return stop_token_; }
  const std::vector<int32_t>& closing_tokens() const { return closing_tokens_; }

 private:
  ModelFiles files_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int32_t stop_token_ = -1;
  std::vector<int32_t> closing_tokens_;  // in kClosingOrder's order
};

bool is_allowed(const std::vector<int32_t>& row, int32_t token) {
  return (static_cast<uint32_t>(row[token / 32]) >> (token % 32)) & 1u;
}

std::vector<int32_t> allowed_tokens(const std::vector<int32_t>& row) {
  std::vector<int32_t> ids;
  for (size_t word = 0; word < row.size(); ++word) {
    for (auto bits = static_cast<uint32_t>(row[word]); bits; bits &= bits - 1) {
      ids.push_back(static_cast<int32_t>(word * 32 + std::countr_zero(bits)));
    }
  }
  return ids;
}

int32_t choose(const std::vector<int32_t>& row, const std::vector<int32_t>& allowed, const Vocabulary& vocab,
               int step, std::mt19937_64& rng) {
  if (is_allowed(row, vocab.stop_token())) return vocab.stop_token();
  constexpr int kFreeSteps = 16;   // uniformly random before this
  constexpr double kWander = 0.1;  // after it, still uniformly random this often
  if (step >= kFreeSteps && std::uniform_real_distribution<double>(0, 1)(rng) >= kWander) {
    for (const int32_t token : vocab.closing_tokens()) {
      if (is_allowed(row, token)) return token;
    }
  }
  return allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
}

Walk walk(GrammarMatcher& matcher, const Vocabulary& vocab, int words, int max_steps, uint64_t seed,
          std::vector<double>& mask_ms) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> row(words), ids;
  Walk result;
  for (; result.steps < max_steps && !matcher.is_terminated(); ++result.steps) {
    const auto start = bench::Clock::now();
    matcher.fill_next_token_bitmask(row);
    mask_ms.push_back(1e3 * bench::seconds(start, bench::Clock::now()));
    const auto allowed = allowed_tokens(row);
    if (allowed.empty()) break;
    const int32_t token = choose(row, allowed, vocab, result.steps, rng);
    TESSERA_CHECK(matcher.accept_token(token), "the matcher refused token " << token << " it allowed");
    if (token != vocab.stop_token()) ids.push_back(token);
  }
  result.terminated = matcher.is_terminated();
  result.output = vocab.tokenizer().decode(ids, true);
  return result;
}

struct Options {
  uint64_t seed = 1;
  int max_steps = 2000;
  int compile_threads = 1;
  bool any_whitespace = true;
};

void run_vocabulary(const std::string& path, const std::vector<CorpusEntry>& corpus, const Options& options,
                    std::ofstream* outputs) {
  const Vocabulary vocab(path);
  GrammarCompilerConfig config;
  config.stop_token_ids = {vocab.stop_token()};
  config.vocab_size = static_cast<int32_t>(vocab.tokenizer().vocab_size());
  config.threads = options.compile_threads;
  const auto setup_start = bench::Clock::now();
  GrammarCompiler compiler(vocab.tokenizer(), config);
  const double setup_ms = 1e3 * bench::seconds(setup_start, bench::Clock::now());
  std::vector<double> compile_ms, mask_ms;
  int unterminated = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto start = bench::Clock::now();
    auto grammar = compiler.compile({OutputConstraint::Kind::kJsonSchema, corpus[i].schema, {}, options.any_whitespace});
    compile_ms.push_back(1e3 * bench::seconds(start, bench::Clock::now()));
    GrammarMatcher matcher(grammar);
    const Walk w = walk(matcher, vocab, compiler.bitmask_words(), options.max_steps, options.seed + i, mask_ms);
    unterminated += !w.terminated;
    if (outputs) {
      *outputs << json{{"name", corpus[i].name}, {"output", w.output}, {"terminated", w.terminated},
                       {"steps", w.steps}}.dump() << "\n";
    }
  }
  const json common = {{"impl", "xgrammar-0.2.8"}, {"shape", {{"vocab", config.vocab_size}, {"schemas", corpus.size()}}},
                       {"tokenizer", path}, {"device", cpu_name()}, {"compile_threads", options.compile_threads},
                       {"any_whitespace", options.any_whitespace}};
  json compile_line = common;
  compile_line["measure"] = "compile_per_schema";
  compile_line["slowest"] = slowest(corpus, compile_ms, 5);
  compile_line["tokenizer_setup_ms"] = setup_ms;
  compile_line.update(summary(compile_ms));
  bench::print_json_line(compile_line);
  json mask_line = common;
  mask_line["measure"] = "mask_per_token";
  mask_line["unterminated_walks"] = unterminated;
  mask_line.update(summary(mask_ms));
  bench::print_json_line(mask_line);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  CLI::App app{"Grammar engine benchmark over a JSON-schema corpus"};
  std::string corpus_path, outputs_path;
  std::vector<std::string> tokenizers;
  tessera::Options options;
  bool compact = false;
  app.add_option("--corpus", corpus_path, "JSON lines {name, schema}")->required();
  app.add_option("--tokenizer", tokenizers, "model name, folder or .gguf (repeatable)")->required();
  app.add_option("--outputs", outputs_path, "write the first tokenizer's walks here (JSON lines)");
  app.add_option("--seed", options.seed, "random model seed");
  app.add_option("--max-steps", options.max_steps, "tokens per walk at most");
  app.add_option("--compile-threads", options.compile_threads, "xgrammar compile threads (masks: always one)");
  app.add_flag("--compact", compact, "any_whitespace off: json.dumps's separators only");
  CLI11_PARSE(app, argc, argv);
  options.any_whitespace = !compact;
  try {
    const auto corpus = tessera::read_corpus(corpus_path);
    std::ofstream outputs;
    if (!outputs_path.empty()) outputs.open(outputs_path);
    for (size_t i = 0; i < tokenizers.size(); ++i) {
      tessera::run_vocabulary(tokenizers[i], corpus, options, i == 0 && outputs.is_open() ? &outputs : nullptr);
    }
  } catch (const std::exception& e) {
    std::cerr << "tessera-grammar-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
