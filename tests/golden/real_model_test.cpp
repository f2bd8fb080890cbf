// tests/golden/real_model_test.cpp: the CPU engine on real models fetched by scripts/fetch-models
// ($TESSERA_MODEL_DIR or ~/.cache/tessera/models):
//  - SmolLM2-135M-Instruct (GGUF Q4_1): greedy continuations of 5 prompts equal, token for token over
//    32 tokens, transformers' LlamaForCausalLM on the same dequantized weights
//    (smollm2_reference.json, made by make_smollm2_reference.py). That reference is fp32 arithmetic,
//    so it runs on a CpuBackend that dequantizes the weights to fp32; the default backend keeps them
//    quantized and quantizes activations per block to 16 bits, which moves logits by thousandths.
//    With 8-bit activations, as llama.cpp quantizes them, logits move by tenths and near-ties flip
//    (llama.cpp's own greedy output leaves this reference at tokens 5, 13, 16, 30 and 30). Both
//    quantized paths are checked against the fp32 one position by position;
//  - all-MiniLM-L6-v2: sentence embeddings have cosine >= 0.9999 with sentence-transformers' on 20
//    sentences (minilm_reference.json, made by make_minilm_reference.py).
// A missing model fails the test (CI fetches them first); set TESSERA_ALLOW_MISSING_MODELS=1 to skip.
// The same for the held-out Wikipedia text of the quantized-path check (scripts/fetch-models too).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/generation.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "models/config/encoder_input.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tokenizer/tokenizer.h"

namespace tessera::golden {
namespace {

nlohmann::json read_json(const std::string& file) {
  std::ifstream in(std::string(TESSERA_GOLDEN_DIR) + "/" + file);
  EXPECT_TRUE(in.good()) << "missing tests/golden/" << file;
  return nlohmann::json::parse(in);
}

// The model's files, or nullopt after recording a failure (or a skip when allowed).
std::optional<ModelFiles> find_model(const std::string& name) {
  try {
    return locate_model(name);
  } catch (const std::exception& e) {
    const char* allow = std::getenv("TESSERA_ALLOW_MISSING_MODELS");
    if (allow != nullptr && std::string(allow) == "1") {
      std::printf("[real-model] skipping: %s\n", e.what());
      return std::nullopt;
    }
    ADD_FAILURE() << name << " is not in " << default_model_dir() << " (run scripts/fetch-models): " << e.what();
    return std::nullopt;
  }
}

class SmolLm2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    files_ = find_model("smollm2-135m-instruct");
    if (!files_) return;
    config_ = load_model_config(*files_);
    backend_ = new CpuBackend(CpuBackendOptions{.num_threads = 0, .keep_weight_formats = false});
    quant_backend_ = new CpuBackend();
    quant8_backend_ = new CpuBackend(CpuBackendOptions{.activation_bits = 8});
    const WeightStore weights = load_weights(*files_);
    model_ = make_causal_lm(config_, weights, *backend_).release();
    quant_model_ = make_causal_lm(config_, weights, *quant_backend_).release();
    quant8_model_ = make_causal_lm(config_, weights, *quant8_backend_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete quant_model_;
    delete quant8_model_;
    delete backend_;
    delete quant_backend_;
    delete quant8_backend_;
    model_ = quant_model_ = quant8_model_ = nullptr;
    backend_ = quant_backend_ = quant8_backend_ = nullptr;
  }
  void SetUp() override {
    if (!files_) GTEST_SKIP() << "model not available";
  }

  static inline std::optional<ModelFiles> files_;
  static inline ModelConfig config_;
  static inline CpuBackend* backend_ = nullptr;        // weights dequantized to fp32
  static inline CausalLm* model_ = nullptr;
  static inline CpuBackend* quant_backend_ = nullptr;  // the default: weights in their GGUF formats
  static inline CausalLm* quant_model_ = nullptr;
  static inline CpuBackend* quant8_backend_ = nullptr;  // the same with 8-bit activations
  static inline CausalLm* quant8_model_ = nullptr;
};

TEST_F(SmolLm2, GreedyContinuationsMatchTransformersOnSameWeights) {
  const nlohmann::json ref = read_json("smollm2_reference.json");
  Generator generator(*model_, *backend_, GeneratorConfig{16, 64, 0});
  int exact = 0;
  for (const auto& p : ref["prompts"]) {
    GenerationRequest request;
    request.prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = ref["new_tokens"].get<int32_t>();
    request.sampling.ignore_eos = true;
    const GenerationResult result = generator.generate(request, [](int32_t) { return true; });
    const std::vector<int32_t> expected = p["generated_ids"].get<std::vector<int32_t>>();
    size_t first_diff = 0;
    while (first_diff < expected.size() && first_diff < result.tokens.size() &&
           result.tokens[first_diff] == expected[first_diff]) {
      ++first_diff;
    }
    std::printf("[real-model] smollm2 %s: %zu/%zu tokens equal (%.1f tok/s decode)\n", p["prompt"].dump().c_str(),
                first_diff, expected.size(), result.decode_tokens_per_s);
    EXPECT_EQ(result.tokens, expected) << "prompt " << p["prompt"] << " diverges at token " << first_diff
                                       << " (reference min top-2 margin " << p["min_top2_margin"] << ")";
    exact += result.tokens == expected;
  }
  EXPECT_EQ(exact, 5);
}

// Logits of every position of `tokens`, one unpaged causal forward.
std::vector<float> all_logits(CausalLm& model, Backend& backend, const std::vector<int32_t>& tokens) {
  const MaskPolicy policy = MaskPolicy::causal();
  const auto n = static_cast<int32_t>(tokens.size());
  const std::vector<AttentionPlan::Sequence> seqs{{n, n, &policy, {}}};
  AttentionPlan plan = AttentionPlan::build(seqs, 0);
  ForwardBatch batch;
  batch.token_ids = tokens;
  batch.plan = &plan;
  std::vector<int32_t> rows(tokens.size());
  for (int32_t i = 0; i < n; ++i) rows[i] = i;
  return backend.download(model.forward(batch, nullptr, rows));
}

// The quantized paths (weights in Q4_1 / Q8_0, activations quantized to 16 or 8 bits) against the
// fp32 path on the same weights, teacher-forced over the reference texts (prompts and continuations,
// 203 positions): the top-1 token agrees except at near-ties.
//  - 16-bit (the default): measured 203/203, max |logit diff| 0.010.
//  - 8-bit: llama.cpp's own quantized path agrees with our fp32 path at 197 of these 203 positions
//    and ours at 195-196 (by summation order), so the bar is 95%: chat and code text from a 135M
//    model has many near-ties (10k tokens of English prose: the test below).
// A kernel bug moves logits far more and fails both checks.
TEST_F(SmolLm2, QuantizedPathAgreesWithFp32Path) {
  EXPECT_EQ(quant_backend_->weight_formats().count("q4_1"), 1u) << quant_backend_->describe();
  EXPECT_EQ(backend_->weight_formats().count("q4_1"), 0u) << backend_->describe();
  const nlohmann::json ref = read_json("smollm2_reference.json");
  const auto vocab = static_cast<size_t>(config_.vocab_size);
  int64_t positions = 0, agree16 = 0, agree8 = 0;
  double worst16 = 0.0, worst8 = 0.0;
  for (const auto& p : ref["prompts"]) {
    std::vector<int32_t> tokens = p["prompt_ids"].get<std::vector<int32_t>>();
    for (int32_t t : p["generated_ids"].get<std::vector<int32_t>>()) tokens.push_back(t);
    const std::vector<float> exact = all_logits(*model_, *backend_, tokens);
    const std::vector<float> quant16 = all_logits(*quant_model_, *quant_backend_, tokens);
    const std::vector<float> quant8 = all_logits(*quant8_model_, *quant8_backend_, tokens);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const float* e = exact.data() + i * vocab;
      const float* q16 = quant16.data() + i * vocab;
      const float* q8 = quant8.data() + i * vocab;
      const auto top = [&](const float* l) { return std::max_element(l, l + vocab) - l; };
      agree16 += top(e) == top(q16);
      agree8 += top(e) == top(q8);
      ++positions;
      for (size_t v = 0; v < vocab; ++v) {
        worst16 = std::max(worst16, static_cast<double>(std::fabs(e[v] - q16[v])));
        worst8 = std::max(worst8, static_cast<double>(std::fabs(e[v] - q8[v])));
      }
    }
  }
  std::printf("[real-model] smollm2 quantized vs fp32 path: top-1 agrees at %lld/%lld positions with 16-bit "
              "activations (max |logit diff| %.3f), %lld with 8-bit (%.3f)\n",
              static_cast<long long>(agree16), static_cast<long long>(positions), worst16,
              static_cast<long long>(agree8), worst8);
  EXPECT_GE(static_cast<double>(agree16), 0.99 * static_cast<double>(positions));
  EXPECT_LT(worst16, 0.1) << "logits of order 10-30; 16-bit activations move them by thousandths";
  EXPECT_GE(static_cast<double>(agree8), 0.95 * static_cast<double>(positions));
  // The largest single difference is the noisiest number here: the row-layout and the interleaved
  // kernels agree within 1e-6 on the same inputs, yet last-bit differences flip some activation
  // roundings downstream, and the worst of 10M logits went 1.45 -> 2.22 between them.
  EXPECT_LT(worst8, 3.0) << "logits of order 10-30; 8-bit activations move them by tenths";
}

// The held-out text the quantized paths are checked on: Wikipedia prose (exllamav2's calibration text, fetched and
// hash-checked by scripts/fetch-models), without the <doc ...> markup lines; nullopt after recording
// a failure (or a skip when allowed) when it is missing.
std::optional<std::string> held_out_text() {
  const std::string path = default_model_dir() + "/eval-text-wiki/wiki.utf8";
  std::ifstream in(path);
  if (!in.good()) {
    const char* allow = std::getenv("TESSERA_ALLOW_MISSING_MODELS");
    if (allow != nullptr && std::string(allow) == "1") return std::nullopt;
    ADD_FAILURE() << path << " is missing (run scripts/fetch-models)";
    return std::nullopt;
  }
  std::string text, line;
  while (std::getline(in, line)) {
    if (line.rfind("<doc", 0) == 0 || line.rfind("</doc>", 0) == 0) continue;
    text += line + "\n";
  }
  return text;
}

// On 10,220 predictions of held-out English prose (teacher-forced, windows of 512
// tokens): the quantized paths against the fp32 path on the same weights.
//  - 16-bit activations (the default): top-1 agreement 100.00% (10,220 of 10,220), perplexity
//    +0.000% (20.6327 both; bench/results/2026-11-24-cpu-activation-bits.jsonl). Bars: 99% agreement
//    and 1% perplexity.
//  - 8-bit activations (activation_bits: 8): 96.67%, +0.34%. llama.cpp's own path (the same GGUF,
//    its q8 activations) agrees with our fp32 path at 96.59% of these positions, so the bar for
//    this path is 96%, what llama.cpp's arithmetic achieves; perplexity within 1% as well.
TEST_F(SmolLm2, QuantizedPathHoldsTopOneAndPerplexityOnTenThousandTokens) {
  const std::optional<std::string> text = held_out_text();
  if (!text) GTEST_SKIP() << "held-out text not available";
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(*files_);
  const std::vector<int32_t> ids = tokenizer->encode(text->substr(0, 120000), false).ids;
  constexpr size_t kWindow = 512, kWindows = 20;  // 10,240 tokens, 10,220 predictions
  ASSERT_GE(ids.size(), kWindow * kWindows);
  const auto vocab = static_cast<size_t>(config_.vocab_size);
  // -log softmax(logits)[target], in double.
  const auto nll = [&](const float* logits, int32_t target) {
    const double top = *std::max_element(logits, logits + vocab);
    double sum = 0.0;
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
    return top + std::log(sum) - logits[target];
  };
  const auto argmax = [&](const float* l) { return std::max_element(l, l + vocab) - l; };
  struct Path {
    const char* name;
    CausalLm* model;
    CpuBackend* backend;
    double min_agreement;
    int64_t agree = 0;
    double nll = 0.0;
  };
  Path paths[] = {{"16-bit", quant_model_, quant_backend_, 0.99}, {"8-bit", quant8_model_, quant8_backend_, 0.96}};
  int64_t predictions = 0;
  double nll_exact = 0.0;
  for (size_t w = 0; w < kWindows; ++w) {
    const std::vector<int32_t> window(ids.begin() + w * kWindow, ids.begin() + (w + 1) * kWindow);
    const std::vector<float> exact = all_logits(*model_, *backend_, window);
    for (size_t i = 0; i + 1 < kWindow; ++i) nll_exact += nll(exact.data() + i * vocab, window[i + 1]);
    predictions += kWindow - 1;
    for (Path& path : paths) {
      const std::vector<float> quant = all_logits(*path.model, *path.backend, window);
      for (size_t i = 0; i + 1 < kWindow; ++i) {
        const float* e = exact.data() + i * vocab;
        const float* q = quant.data() + i * vocab;
        path.agree += argmax(e) == argmax(q);
        path.nll += nll(q, window[i + 1]);
      }
    }
  }
  const double ppl_exact = std::exp(nll_exact / static_cast<double>(predictions));
  for (const Path& path : paths) {
    const double ppl_quant = std::exp(path.nll / static_cast<double>(predictions));
    const double agreement = static_cast<double>(path.agree) / static_cast<double>(predictions);
    std::printf("[real-model] smollm2 on %lld tokens of wiki text, %s activations: top-1 agreement %.4f "
                "(%lld positions), perplexity fp32 %.4f, quantized %.4f (%+.3f%%)\n",
                static_cast<long long>(predictions), path.name, agreement, static_cast<long long>(path.agree),
                ppl_exact, ppl_quant, 100.0 * (ppl_quant / ppl_exact - 1.0));
    EXPECT_GE(agreement, path.min_agreement) << path.name;
    EXPECT_LE(std::fabs(ppl_quant / ppl_exact - 1.0), 0.01) << path.name;
  }
}

// Our GGUF byte-level BPE gives the reference prompts' ids (which the reference took from
// transformers' GGUF tokenizer), so the continuation test above starts from the same prompt.
TEST_F(SmolLm2, TokenizerMatchesReferencePromptIds) {
  const nlohmann::json ref = read_json("smollm2_reference.json");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(*files_);
  for (const auto& p : ref["prompts"]) {
    EXPECT_EQ(tokenizer->encode(p["prompt"].get<std::string>(), false).ids, p["prompt_ids"].get<std::vector<int32_t>>())
        << "prompt " << p["prompt"];
  }
}

TEST(MiniLm, EmbeddingsMatchSentenceTransformers) {
  const std::optional<ModelFiles> files = find_model("all-minilm-l6-v2");
  if (!files) GTEST_SKIP() << "model not available";
  const ModelConfig config = load_model_config(*files);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(*files);
  CpuBackend backend;
  std::unique_ptr<Encoder> model;
  {
    const WeightStore weights = load_weights(*files);
    model = make_encoder(config, weights, backend);
  }
  const nlohmann::json ref = read_json("minilm_reference.json");
  // The limit and truncation every embedding path uses: the one sentence-transformers applied.
  const EncoderInputLimit limit = encoder_input_limit(config);
  EXPECT_EQ(limit, (EncoderInputLimit{ref["max_seq_length"].get<int64_t>(), "max_seq_length"}));
  std::vector<std::vector<int32_t>> inputs;
  for (const auto& s : ref["sentences"]) inputs.push_back(tokenizer->encode(s["text"].get<std::string>(), true).ids);
  const auto by_size = [](const auto& a, const auto& b) { return a.size() < b.size(); };
  const size_t longest = static_cast<size_t>(std::max_element(inputs.begin(), inputs.end(), by_size) - inputs.begin());
  ASSERT_GT(static_cast<int64_t>(inputs[longest].size()), limit.tokens) << "the reference should hold a truncated text";
  ASSERT_FALSE(fit_encoder_inputs(inputs, limit, /*truncate=*/true, *tokenizer).has_value());
  EXPECT_EQ(static_cast<int64_t>(inputs[longest].size()), limit.tokens);
  const MaskPolicy policy = MaskPolicy::bidirectional();
  std::vector<int32_t> ids;
  std::vector<AttentionPlan::Sequence> seqs;
  std::vector<std::vector<float>> expected;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t>& one = inputs[i];
    const auto& s = ref["sentences"][i];
    ids.insert(ids.end(), one.begin(), one.end());
    seqs.push_back({static_cast<int32_t>(one.size()), static_cast<int32_t>(one.size()), &policy, {}});
    expected.push_back(s["embedding"].get<std::vector<float>>());
  }
  AttentionPlan plan = AttentionPlan::build(seqs, 0);  // all 20 texts packed in one batch
  ForwardBatch batch;
  batch.token_ids = ids;
  batch.plan = &plan;
  const Tensor out = model->embed(batch);
  const std::vector<float> got = backend.download(out);
  const size_t dim = static_cast<size_t>(out.dim(1));
  ASSERT_EQ(dim, expected[0].size());
  double worst = 1.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    double dot = 0, na = 0, nb = 0;
    for (size_t j = 0; j < dim; ++j) {
      dot += static_cast<double>(got[i * dim + j]) * expected[i][j];
      na += static_cast<double>(got[i * dim + j]) * got[i * dim + j];
      nb += static_cast<double>(expected[i][j]) * expected[i][j];
    }
    const double cosine = dot / std::sqrt(na * nb);
    worst = std::min(worst, cosine);
    EXPECT_GE(cosine, 0.9999) << "sentence " << i << ": " << ref["sentences"][i]["text"];
  }
  std::printf("[real-model] all-minilm-l6-v2: %zu sentences, min cosine %.9f (1 - cosine = %.2e)\n", expected.size(), worst, 1.0 - worst);
}

}  // namespace
}  // namespace tessera::golden
