// tests/gpu/backend/test_cuda_bert.cpp: BERT on the CUDA backend in bf16 and fp16 against the CPU
// backend's fp32: the tiny-bert fixture's hidden states, then the real all-MiniLM-L6-v2 on
// 200 varied texts, each alone and packed by the embedding engine's own round (run_embed_round).
// Every test skips itself without a GPU; the MiniLM tests also without the model
// ($TESSERA_MODEL_DIR/all-minilm-l6-v2, default ~/.cache/tessera/models; scripts/fetch-models).
//
// Tolerances, with ε the activation type's unit roundoff (bf16 2^-8, fp16 2^-11). The backend keeps
// fp32 accumulators but rounds every activation (GEMM outputs, LayerNorm, GELU, attention
// probabilities and output, the pooled and normalised embedding) to its type, so errors scale with ε:
// - tiny-bert hidden states: ‖gpu − cpu‖ / ‖cpu‖ ≤ 8ε and max |gpu − cpu| ≤ 8ε · max |cpu|. A numpy
//   emulation of these rounding points on the fixture's inputs gave 1.6–1.8ε and 1.8–1.9ε in both types
//   (fp16: rel L2 8.8e-4, max abs 2.7e-3 on |x| ≤ 3.1). Their embeddings: cosine ≥ 0.9999 (emulation:
//   1 − cos ≤ 1.7e-5 in bf16, 1.8e-7 in fp16).
// - MiniLM embeddings (unit vectors): cosine ≥ 0.9999 to the CPU for every text (the bar), in
//   fp16, the type `dtype: auto` serves encoders in. bf16 weights alone use up most of that bar:
//   minilm_rounding_emulation.py (beside this file) switches each rounding point on and off, and with
//   only the linear weights stored in bf16 and every activation exact, 1 − cos is already 3.2–4.1e-5
//   per text (mean 3.8e-5) on short and long texts; all points together give mean 7.5e-5, worst 8.7e-5.
//   On the H100 (2026-11-23) bf16 gave mean 6.3e-5, as emulated, with a tail to 1.8e-4 over 200 texts.
//   In fp16 the same emulation gives ≤ 1.4e-6 and the H100 mean 1.0e-6. So bf16 is held to 0.9995
//   (a fault such as a wrong position or a leaked neighbour costs 3e-2 or more) and fp16 to 0.9999.
// - packed against one by one on the GPU: both runs do the same per-row arithmetic except the GEMM
//   accumulation order (cuBLASLt tiles or split-K by batch size, the GEMV path for m ≤ 8), all in fp32,
//   so the difference is activations rounded one ulp the other way. The emulation (split-K 64 against
//   one dot product per output) gave 1 − cos ≤ 1.3e-6 in fp16 and ≤ 3.5e-5 in bf16 (64x ε² apart,
//   as expected). Bars: cosine ≥ 0.99999 in fp16, ≥ 0.9995 in bf16 (the H100: 1.5e-4), and max abs
//   ≤ 2ε (the emulation:
//   0.55ε in both). A packing fault is far outside them: in the emulation, positions off by one or
//   attention reaching a neighbouring text gave 1 − cos of 3e-2 to 0.7.
//
// TESSERA_BERT_TEST_DEVICE=cpu runs the "device" side on a second CpuBackend (fp32, both dtype
// instances alike): a check of this file's own logic (texts, truncation, packing rounds, comparisons)
// on a machine without a GPU. It is not a GPU result.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/scheduler/engine_embed.h"
#include "engine/scheduler/engine_loop.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "models/config/encoder_input.h"
#include "models/model_files.h"
#include "models/model_loader.h"
#include "models/tokenizer/tokenizer.h"

namespace tessera {
namespace {

// ---------------------------------------------------------------- the device side

bool cpu_stand_in() {
  const char* v = std::getenv("TESSERA_BERT_TEST_DEVICE");
  return v != nullptr && std::string(v) == "cpu";
}

#define REQUIRE_DEVICE()                                                                    \
  do {                                                                                      \
    if (!cpu_stand_in() && cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU present"; \
  } while (0)

std::unique_ptr<Backend> device_backend(ScalarType dtype) {
  if (cpu_stand_in()) return std::make_unique<CpuBackend>();
  CudaBackendConfig config;
  config.dtype = dtype;
  config.linear_weights = dtype;  // unquantized
  return std::make_unique<CudaBackend>(config);
}

const char* dtype_label(ScalarType t) { return cpu_stand_in() ? "cpu-stand-in" : scalar_type_name(t); }

// Unit roundoff of the activation type.
double unit_roundoff(ScalarType t) {
  if (cpu_stand_in()) return 1e-6;  // fp32 end to end: rounding noise of many ops, not one unit roundoff
  return t == ScalarType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

std::string dtype_param_name(const ::testing::TestParamInfo<ScalarType>& info) {
  return info.param == ScalarType::kF16 ? "fp16" : "bf16";
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  return dot / std::sqrt(std::max(na * nb, 1e-300));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// ---------------------------------------------------------------- tiny-bert hidden states

std::string fixture(const std::string& name) { return std::string(TESSERA_GOLDEN_FIXTURES) + "/" + name; }

struct HiddenError {
  double rel_l2 = 0, max_abs = 0, max_ref = 0;
};

HiddenError hidden_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  HiddenError e;
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
    e.max_ref = std::max(e.max_ref, std::fabs(double(want[i])));
  }
  e.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  return e;
}

class TinyBertHidden : public ::testing::TestWithParam<ScalarType> {};

// The reference inputs of tests/golden/fixtures/tiny-bert (token types 0 and 1), each alone and all
// packed: last hidden states and embeddings against the CPU backend.
TEST_P(TinyBertHidden, HiddenStatesWithinTheDtypeTolerance) {
  REQUIRE_DEVICE();
  const ScalarType dtype = GetParam();
  const ModelFiles files = locate_model(fixture("tiny-bert"));
  const ModelConfig config = load_model_config(files);
  const WeightStore weights = load_weights(files);
  CpuBackend cpu;
  const std::unique_ptr<Backend> device = device_backend(dtype);
  auto cpu_model = make_encoder(config, weights, cpu);
  auto device_model = make_encoder(config, weights, *device);
  std::ifstream in(fixture("tiny-bert") + "/reference.json");
  ASSERT_TRUE(in.good()) << "missing tests/golden/fixtures/tiny-bert/reference.json";
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_GE(ref["inputs"].size(), 2u);

  const MaskPolicy policy = MaskPolicy::bidirectional();
  std::vector<std::vector<int32_t>> ids, types;
  for (const auto& input : ref["inputs"]) {
    ids.push_back(input["ids"].get<std::vector<int32_t>>());
    types.push_back(input["token_type_ids"].get<std::vector<int32_t>>());
  }
  // {hidden, embeddings} of the given inputs packed into one step.
  auto run = [&](Encoder& model, Backend& backend, const std::vector<size_t>& which) {
    std::vector<int32_t> packed_ids, packed_types;
    std::vector<AttentionPlan::Sequence> seqs;
    for (size_t i : which) {
      packed_ids.insert(packed_ids.end(), ids[i].begin(), ids[i].end());
      packed_types.insert(packed_types.end(), types[i].begin(), types[i].end());
      const auto n = static_cast<int32_t>(ids[i].size());
      seqs.push_back({n, n, &policy, {}});
    }
    AttentionPlan plan = AttentionPlan::build(seqs, 0);
    backend.prepare_plan(plan);
    ForwardBatch batch{packed_ids, packed_types, &plan};
    std::vector<float> hidden = backend.download(model.encode(batch));
    backend.prepare_plan(plan);
    std::vector<float> embedding = backend.download(model.embed(batch));
    return std::make_pair(std::move(hidden), std::move(embedding));
  };
  const double eps = unit_roundoff(dtype);
  std::vector<std::vector<size_t>> cases;
  for (size_t i = 0; i < ids.size(); ++i) cases.push_back({i});
  std::vector<size_t> all(ids.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  cases.push_back(all);
  for (const auto& which : cases) {
    const auto [cpu_hidden, cpu_embedding] = run(*cpu_model, cpu, which);
    const auto [dev_hidden, dev_embedding] = run(*device_model, *device, which);
    ASSERT_EQ(dev_hidden.size(), cpu_hidden.size());
    ASSERT_EQ(dev_embedding.size(), cpu_embedding.size());
    const HiddenError e = hidden_error(dev_hidden, cpu_hidden);
    const size_t dim = static_cast<size_t>(config.hidden_size);
    double worst_cos = 1.0;
    for (size_t s = 0; s < which.size(); ++s) {
      const std::vector<float> a(cpu_embedding.begin() + s * dim, cpu_embedding.begin() + (s + 1) * dim);
      const std::vector<float> b(dev_embedding.begin() + s * dim, dev_embedding.begin() + (s + 1) * dim);
      worst_cos = std::min(worst_cos, cosine(a, b));
    }
    const std::string what = which.size() == 1 ? "input " + std::to_string(which[0]) + " (" +
                                                     std::to_string(ids[which[0]].size()) + " tokens)"
                                               : "all " + std::to_string(which.size()) + " packed";
    std::printf("[cuda-bert] tiny-bert %s %s: hidden rel L2 %.3g (%.2f eps), max abs %.3g (%.2f eps x max|x| %.2f); "
                "embedding cosine %.7f\n",
                dtype_label(dtype), what.c_str(), e.rel_l2, e.rel_l2 / eps, e.max_abs, e.max_abs / (eps * e.max_ref),
                e.max_ref, worst_cos);
    EXPECT_LE(e.rel_l2, 8 * eps) << what;
    EXPECT_LE(e.max_abs, 8 * eps * e.max_ref) << what;
    EXPECT_GE(worst_cos, 0.9999) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TinyBertHidden, ::testing::Values(ScalarType::kBF16, ScalarType::kF16),
                         dtype_param_name);

// ---------------------------------------------------------------- 200 varied texts

// xorshift32: the same sequence on every platform (std:: distributions are implementation-defined).
struct Rng {
  uint32_t x;
  uint32_t next() {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
  }
  size_t below(size_t n) { return next() % n; }
  template <size_t N>
  const char* pick(const char* const (&words)[N]) {
    return words[below(N)];
  }
};

constexpr const char* kNames[] = {"Alice", "Bob", "Dr. Okafor", "Mrs. Lindqvist", "the committee", "NASA", "Marie",
                                  "our team", "the city council", "Professor Tanaka"};
constexpr const char* kAdjectives[] = {"quiet", "rapid", "ancient", "green", "unexpected", "reliable", "narrow",
                                       "bright", "heavy", "curious", "modern", "fragile", "distant", "warm", "careful"};
constexpr const char* kNouns[] = {"river", "engine", "library", "report", "garden", "network", "museum", "storm",
                                  "kitchen", "protein", "market", "bridge", "telescope", "violin", "database",
                                  "harbor", "forest", "contract", "satellite", "recipe"};
constexpr const char* kVerbs[] = {"crossed", "repaired", "described", "measured", "ignored", "built", "studied",
                                  "painted", "delayed", "improved", "opened", "shared", "tested", "found", "moved"};
constexpr const char* kAdverbs[] = {"slowly", "carefully", "yesterday", "again", "quietly", "at last", "by noon",
                                    "twice", "without warning", "in 1998"};
constexpr const char* kPreps[] = {"near", "behind", "under", "across", "inside", "beyond", "along", "after"};

std::string prose_sentence(Rng& r) {
  std::string s;
  switch (r.below(6)) {
    case 0:
      s = std::string("The ") + r.pick(kAdjectives) + " " + r.pick(kNouns) + " " + r.pick(kVerbs) + " the " +
          r.pick(kNouns) + " " + r.pick(kPreps) + " the " + r.pick(kNouns) + ".";
      break;
    case 1:
      s = std::string(r.pick(kNames)) + " " + r.pick(kVerbs) + " a " + r.pick(kAdjectives) + " " + r.pick(kNouns) + " " +
          r.pick(kAdverbs) + ".";
      break;
    case 2:
      s = std::string("Why was the ") + r.pick(kNouns) + " " + r.pick(kVerbs) + " " + r.pick(kAdverbs) + "?";
      break;
    case 3:
      s = std::string("In ") + std::to_string(1900 + r.below(125)) + ", " + r.pick(kNames) + " " + r.pick(kVerbs) +
          " " + std::to_string(2 + r.below(998)) + " " + r.pick(kNouns) + "s, about " + std::to_string(r.below(100)) +
          "% of the total.";
      break;
    case 4:
      s = std::string("Although the ") + r.pick(kNouns) + " was " + r.pick(kAdjectives) + ", " + r.pick(kNames) + " " +
          r.pick(kVerbs) + " it " + r.pick(kAdverbs) + "; nobody " + r.pick(kVerbs) + " the " + r.pick(kNouns) + ".";
      break;
    default:
      s = std::string("A ") + r.pick(kAdjectives) + ", " + r.pick(kAdjectives) + " " + r.pick(kNouns) + " (" +
          r.pick(kAdverbs) + ") " + r.pick(kVerbs) + " everything!";
  }
  return s;
}

const std::vector<std::string>& empty_ish_texts() {
  static const std::vector<std::string> t = {
      "", " ", "   ", "\n", "\t", " \n\t \r\n ", "...", "!!!", "?", "?!", "—", "…", "()[]{}", "#", "   .   ",
      "\u3000", "\u00a0\u00a0", "- - -", "''\"\"", "*~*~*"};
  return t;
}

const std::vector<std::string>& single_token_texts() {
  static const std::vector<std::string> t = {"a",  "I",   "the", "hello", "world", "1",   "42",  ".",   "x",   "é",
                                             "猫", "😀", "ok",  "yes",   "no",    "cat", "dog", "THE", "Paris", "!"};
  return t;
}

const std::vector<std::string>& unicode_texts() {
  static const std::vector<std::string> t = {
      "東京は日本の首都で、人口は約1400万人です。",
      "北京是中国的首都，有着三千多年的历史。",
      "我喜欢在周末去公园散步和看书。",
      "서울은 대한민국의 수도이며 한강이 도시를 가로지릅니다.",
      "日本語と中国語と한국어が混ざった文章です。",
      "Ça va très bien, merci beaucoup ! À bientôt 😀🎉",
      "Größere Äpfel schmecken süßer, sagt Jürgen aus Köln.",
      "El niño comió piñata en la mañana del año nuevo, ¿verdad?",
      "Ação, coração e informação são palavras em português.",
      "Tiếng Việt có nhiều dấu: ắ, ặ, ể, ỗ, ự.",
      "Zażółć gęślą jaźń — polski pangram.",
      "Şu ağaçların gölgesinde İstanbul'u düşündüm.",
      "Москва — столица России, а Санкт-Петербург — северная столица.",
      "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
      "القاهرة هي عاصمة مصر وأكبر مدنها.",
      "ירושלים היא עיר עתיקה מאוד.",
      "नमस्ते, आप कैसे हैं? मैं ठीक हूँ।",
      "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
      "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs up",
      "🚀🚀🚀 launch day!!! 🌕 next stop",
      "e\u0301 (combining acute) versus é (precomposed)",
      "ﬁne ﬂour — ligatures ﬁ and ﬂ, fullwidth ＡＢＣ１２３",
      "Mixed: café, naïve, résumé, coöperate, Zoë, São Paulo",
      "Math: ∀x ∈ ℝ, x² ≥ 0; ∑ᵢ aᵢ = ∫ f(t) dt ≈ π",
      "Currency: €100, £50, ¥1000, ₹250, ₿0.01",
      "\u200bzero\u200bwidth\u200bspaces\u200b and a soft\u00adhyphen",
      "RTL mark \u200f inside and LTR \u200e mark",
      "Ｔｈｉｓ ｉｓ ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ",
      "Emoji only: 😂🤣😍🥰😎🤖👾",
      "Kanji かな カナ ｶﾅ 漢字 mixed with English words"};
  return t;
}

const std::vector<std::string>& code_texts() {
  static const std::vector<std::string> t = {
      "def f(x):\n    return x ** 2  # square",
      "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
      "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id DESC LIMIT 10;",
      "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }",
      "const add = (a, b) => a + b;\nconsole.log(add(2, 3));",
      "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
      "func handler(w http.ResponseWriter, r *http.Request) {\n\tfmt.Fprintf(w, \"ok\")\n}",
      "{\"model\": \"all-minilm-l6-v2\", \"input\": [\"a\", \"b\"], \"encoding_format\": \"float\"}",
      "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: tessera\nspec:\n  replicas: 3",
      "<div class=\"row\"><span id='x'>Hello</span></div>",
      "curl -sf http://127.0.0.1:8080/ready && echo up || echo down",
      "git commit -m \"fix: off-by-one in the packed plan\" && git push origin main",
      "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@[a-z0-9-]+\\.[a-z]{2,}$",
      "--- a/x.cpp\n+++ b/x.cpp\n@@ -1,3 +1,3 @@\n-int x = 1;\n+int x = 2;",
      "Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\nZeroDivisionError: division by zero",
      "\\begin{equation} E = mc^2 \\end{equation}",
      "all: build\n\tninja -C build tessera\n.PHONY: all",
      "x = np.linalg.norm(a - b, axis=-1).mean()",
      "template <typename T> T clamp(T v, T lo, T hi) { return v < lo ? lo : hi < v ? hi : v; }",
      "public static void main(String[] args) { System.out.println(\"hi\"); }",
      "UPDATE accounts SET balance = balance - 100 WHERE id = 42 RETURNING balance;",
      "import torch\nmodel = torch.compile(model, mode=\"max-autotune\")",
      "0x7fff + ((bits >> 16) & 1)",
      "while True:\n    line = sys.stdin.readline()\n    if not line:\n        break",
      "docker run --gpus all -p 8080:8080 tessera:latest serve --backend cuda",
      "kubectl get pods -n inference -o wide | grep tessera",
      "print(f\"{x=:.3f} {y!r}\")",
      "assert(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream) == cudaSuccess);",
      "<?php echo htmlspecialchars($_GET['q'], ENT_QUOTES); ?>",
      "(defun fact (n) (if (<= n 1) 1 (* n (fact (- n 1)))))"};
  return t;
}

// A text of at least `target` tokens (with [CLS] and [SEP]; usually exactly `target`): prose, or CJK,
// or code, grown a sentence at a time while far from the target and a word at a time near it.
std::string text_of_tokens(const Tokenizer& tokenizer, int64_t target, int style, Rng& r) {
  static constexpr const char* kCjk[] = {"東京", "は", "日本", "の", "首都", "です", "。", "北京", "是", "中国", "的", "城市", "，"};
  static constexpr const char* kCode[] = {"for", "(", "int", "i", "=", "0;", "i", "<", "n;", "++i)", "{", "sum", "+=", "a[i];",
                                "}", "return", "x", "*", "2;", "if", "(x", ">", "y)"};
  auto count = [&](const std::string& s) { return static_cast<int64_t>(tokenizer.encode(s, true).ids.size()); };
  std::string text;
  int64_t n = count(text);
  while (n < target) {
    if (target - n > 40) {
      for (int i = 0; i < 8; ++i) {
        if (style == 1) {
          text += r.pick(kCjk);
        } else if (style == 2) {
          text += std::string(text.empty() ? "" : " ") + r.pick(kCode);
        } else {
          text += (text.empty() ? "" : " ") + prose_sentence(r);
          break;
        }
      }
    } else if (style == 1) {
      text += r.pick(kCjk);
    } else if (style == 2) {
      text += std::string(text.empty() ? "" : " ") + r.pick(kCode);
    } else {
      text += std::string(text.empty() ? "" : " ") + r.pick(kNouns);
    }
    n = count(text);
  }
  return text;
}

// The 200 texts: 20 empty-ish, 20 single-token, 30 unicode, 30 code, 60 English paragraphs of 1 to 8
// sentences, and 40 long texts from 24 tokens to past the limit (every fifth CJK, every fifth code).
std::vector<std::string> varied_texts(const Tokenizer& tokenizer, int64_t limit) {
  std::vector<std::string> texts;
  for (const auto* group : {&empty_ish_texts(), &single_token_texts(), &unicode_texts(), &code_texts()}) {
    texts.insert(texts.end(), group->begin(), group->end());
  }
  Rng r{20261122u};
  for (int i = 0; i < 60; ++i) {
    std::string p;
    const size_t sentences = 1 + r.below(8);
    for (size_t s = 0; s < sentences; ++s) p += (s ? " " : "") + prose_sentence(r);
    texts.push_back(p);
  }
  const std::vector<int64_t> targets = {24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224,
                                        232, 240, 244, 248, limit - 6, limit - 4, limit - 3, limit - 2, limit - 1,
                                        limit, limit, limit + 1, limit + 2, limit + 4, limit + 14, limit + 44,
                                        limit + 64, limit + 128, limit + 144, limit + 194, 2 * limit - 1, 2 * limit,
                                        2 * limit + 1, 600, 800, 1000};
  for (size_t i = 0; i < targets.size(); ++i) {
    const int style = i % 5 == 1 ? 1 : i % 5 == 3 ? 2 : 0;
    texts.push_back(text_of_tokens(tokenizer, std::max<int64_t>(targets[i], 3), style, r));
  }
  return texts;
}

// ---------------------------------------------------------------- the engine's packing round

// Embeddings of `inputs` through run_embed_round, the embedding engine's own batching: the inputs
// split into requests of varied sizes (one text, a few, dozens), all in one round, packed greedily
// under `max_batch_tokens` (1: every input alone).
std::vector<std::vector<float>> embed_round(EngineLoop::ServedEncoder& encoder, Backend& backend,
                                            const std::vector<std::vector<int32_t>>& inputs, int64_t max_batch_tokens,
                                            int* forwards = nullptr) {
  static constexpr size_t kJobSizes[] = {1, 3, 8, 1, 17, 2, 40, 5, 1, 23};
  std::vector<std::unique_ptr<EmbedJob>> round;
  std::vector<std::future<EmbedResult>> futures;
  for (size_t at = 0, j = 0; at < inputs.size(); ++j) {
    const size_t n = std::min(kJobSizes[j % std::size(kJobSizes)], inputs.size() - at);
    auto job = std::make_unique<EmbedJob>();
    job->inputs.assign(inputs.begin() + static_cast<ptrdiff_t>(at), inputs.begin() + static_cast<ptrdiff_t>(at + n));
    futures.push_back(job->promise.get_future());
    round.push_back(std::move(job));
    at += n;
  }
  if (forwards != nullptr) {  // the round's greedy rule, counted
    *forwards = 0;
    int64_t tokens = 0;
    for (const auto& in : inputs) {
      const auto n = static_cast<int64_t>(in.size());
      if (tokens == 0 || tokens + n > max_batch_tokens) {
        ++*forwards;
        tokens = 0;
      }
      tokens += n;
    }
  }
  std::vector<EngineLoop::ServedEncoder> encoders;
  encoders.push_back(std::move(encoder));
  run_embed_round(round, encoders, backend, max_batch_tokens);
  encoder = std::move(encoders[0]);
  std::vector<std::vector<float>> out;
  for (auto& f : futures) {
    EmbedResult r = f.get();
    EXPECT_EQ(r.error, SubmitError::kNone) << r.message;
    for (auto& e : r.embeddings) out.push_back(std::move(e));
  }
  return out;
}

// ---------------------------------------------------------------- one text, captured

// One text a forward, as a single short query arrives: the engine's round runs a length's first
// forward eagerly, captures its second into a CUDA graph and replays it after. Every run of a text
// gives the eager run's bits, and two lengths keep two graphs.
TEST_P(TinyBertHidden, OneTextReplaysTheGraphOfItsLength) {
  REQUIRE_DEVICE();
  const ModelFiles files = locate_model(fixture("tiny-bert"));
  const ModelConfig config = load_model_config(files);
  const std::unique_ptr<Backend> device = device_backend(GetParam());
  EngineLoop::ServedEncoder enc{"tiny-bert", config, make_encoder(config, load_weights(files), *device), nullptr};
  const std::vector<int32_t> nine{2, 17, 33, 41, 5, 60, 71, 8, 3};
  const std::vector<int32_t> five{2, 41, 60, 8, 3};
  std::vector<std::vector<int32_t>> inputs;
  for (int run = 0; run < 4; ++run) {
    inputs.push_back(nine);
    inputs.push_back(five);
  }
  auto* cuda = dynamic_cast<CudaBackend*>(device.get());
  const int64_t captured_before = cuda != nullptr ? cuda->graphs_captured() : 0;
  const int64_t replays_before = cuda != nullptr ? cuda->graph_replays() : 0;
  const std::vector<std::vector<float>> out = embed_round(enc, *device, inputs, /*max_batch_tokens=*/1);
  ASSERT_EQ(out.size(), inputs.size());
  for (size_t i = 2; i < out.size(); ++i) {
    EXPECT_EQ(out[i], out[i % 2]) << "run " << i / 2 << " of the " << inputs[i].size() << "-token text";
  }
  EXPECT_NE(out[0], out[1]);
  if (cuda != nullptr) {
    EXPECT_EQ(cuda->graphs_captured() - captured_before, 2) << "one graph per length";
    EXPECT_EQ(cuda->graph_replays() - replays_before, 4) << "the third and fourth run of each length";
  }
}

// ---------------------------------------------------------------- real all-MiniLM-L6-v2

struct MiniLm {
  ModelFiles files;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  int64_t limit = 0;
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;    // [CLS] ... [SEP], truncated to `limit`
  std::vector<int64_t> untruncated_tokens;  // before truncation
  std::vector<std::vector<float>> cpu;      // fp32 CPU backend embeddings, one per text
};

constexpr const char* kMiniLmName = "all-minilm-l6-v2";

// Loaded once for every test; nullptr (and *why) when the model is not on disk. Any other failure
// (a tokenizer or load error) throws, so the test fails instead of skipping.
const MiniLm* minilm(std::string* why) {
  static std::unique_ptr<MiniLm> m;
  if (m) return m.get();
  auto x = std::make_unique<MiniLm>();
  try {
    x->files = locate_model(kMiniLmName);
  } catch (const std::exception& e) {
    *why = std::string(kMiniLmName) + " is not in the model dir " + default_model_dir() +
           " (set TESSERA_MODEL_DIR, or run scripts/fetch-models): " + e.what();
    return nullptr;
  }
  x->config = load_model_config(x->files);
  x->tokenizer = load_tokenizer(x->files);
  // The server's rule (models/config/encoder_input.h): max_seq_length (256), over it truncated
  // keeping [SEP], as sentence-transformers does.
  const EncoderInputLimit limit = encoder_input_limit(x->config);
  x->limit = limit.tokens;
  x->texts = varied_texts(*x->tokenizer, x->limit);
  for (const std::string& t : x->texts) {
    x->ids.push_back(x->tokenizer->encode(t, /*add_special=*/true).ids);
    x->untruncated_tokens.push_back(static_cast<int64_t>(x->ids.back().size()));
  }
  if (fit_encoder_inputs(x->ids, limit, /*truncate=*/true, *x->tokenizer)) {
    throw std::runtime_error("fit_encoder_inputs refused an input although asked to truncate");
  }
  CpuBackend cpu;
  EngineLoop::ServedEncoder enc{kMiniLmName, x->config, make_encoder(x->config, load_weights(x->files), cpu), nullptr};
  x->cpu = embed_round(enc, cpu, x->ids, 4096);
  m = std::move(x);
  return m.get();
}

#define REQUIRE_MINILM(var)                \
  std::string minilm_why;                  \
  const MiniLm* var = minilm(&minilm_why); \
  if (var == nullptr) GTEST_SKIP() << minilm_why

// What the 200 texts cover, checked (so the coverage this file claims holds for the tokenizer).
TEST(RealMiniLmTexts, CoverEmptyishSingleTokenAndTheLimit) {
  REQUIRE_DEVICE();
  REQUIRE_MINILM(m);
  ASSERT_EQ(m->texts.size(), 200u);
  int two = 0, three = 0, at_limit = 0, over_limit = 0;
  int64_t longest = 0, total = 0;
  for (size_t i = 0; i < m->ids.size(); ++i) {
    const auto n = static_cast<int64_t>(m->ids[i].size());
    two += n == 2;  // nothing but [CLS] [SEP]
    three += n == 3;
    at_limit += n == m->limit;
    over_limit += m->untruncated_tokens[i] > m->limit;
    longest = std::max(longest, m->untruncated_tokens[i]);
    total += n;
    EXPECT_LE(n, m->limit);
  }
  std::printf("[cuda-bert] minilm texts: %zu, %lld tokens after truncation to %lld; %d empty-ish ([CLS][SEP] only), "
              "%d single-token, %d at the limit (%d truncated, longest %lld tokens)\n",
              m->texts.size(), static_cast<long long>(total), static_cast<long long>(m->limit), two, three, at_limit,
              over_limit, static_cast<long long>(longest));
  EXPECT_GE(two, 8);     // whitespace of every kind: "", spaces, tabs, newlines, U+3000, U+00A0
  EXPECT_GE(three, 20);  // one word, digit, punctuation mark, CJK character or emoji ([UNK])
  EXPECT_GE(at_limit, 10);
  EXPECT_GE(over_limit, 10);
}

class RealMiniLm : public ::testing::TestWithParam<ScalarType> {};

// Every text alone and packed by the engine's round (the server's default 2048-token budget) on the
// device, each against the CPU backend's fp32 embedding.
TEST_P(RealMiniLm, TwoHundredVariedTextsMatchCpu) {
  REQUIRE_DEVICE();
  REQUIRE_MINILM(m);
  const ScalarType dtype = GetParam();
  const std::unique_ptr<Backend> device = device_backend(dtype);
  EngineLoop::ServedEncoder enc{kMiniLmName, m->config, make_encoder(m->config, load_weights(m->files), *device),
                                nullptr};
  // The bar, 0.9999, holds in fp16. bf16's weights alone cost about half of it (see the
  // header): on the H100 (2026-11-23) its worst text reached 0.99982 (29 of 200 under 0.9999); its bar
  // is 0.9995, still far from a fault.
  const double cos_bar = dtype == ScalarType::kBF16 && !cpu_stand_in() ? 0.9995 : 0.9999;
  for (const int64_t budget : {int64_t{1}, int64_t{2048}}) {
    int forwards = 0;
    const std::vector<std::vector<float>> got = embed_round(enc, *device, m->ids, budget, &forwards);
    ASSERT_EQ(got.size(), m->cpu.size());
    double worst = 1.0, mean_gap = 0;
    size_t worst_at = 0;
    int under = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double c = cosine(got[i], m->cpu[i]);
      mean_gap += (1.0 - c) / static_cast<double>(got.size());
      if (c < worst) {
        worst = c;
        worst_at = i;
      }
      if (c < 0.9999) ++under;
      if (c < cos_bar) {
        ADD_FAILURE() << "text " << i << " (" << m->ids[i].size() << " tokens) '" << m->texts[i].substr(0, 60)
                      << "': cosine " << c << " < " << cos_bar;
      }
    }
    std::string shown = m->texts[worst_at].substr(0, 40);
    std::replace(shown.begin(), shown.end(), '\n', ' ');
    std::printf("[cuda-bert] minilm %s %s (%d forwards): min cosine to the cpu backend %.7f (text %zu, %zu tokens, "
                "'%s'), mean 1-cos %.2e, %d under 0.9999\n",
                dtype_label(dtype), budget == 1 ? "one by one" : "packed, budget 2048", forwards, worst, worst_at,
                m->ids[worst_at].size(), shown.c_str(), mean_gap, under);
  }
}

// The same texts packed by the engine's round (the server's 2048-token budget, and one round of
// 16384 that takes all 200 texts, 13,293 tokens, in one forward) against each text alone, on the device.
TEST_P(RealMiniLm, PackedBatchEqualsOneByOne) {
  REQUIRE_DEVICE();
  REQUIRE_MINILM(m);
  const ScalarType dtype = GetParam();
  const double eps = unit_roundoff(dtype);
  // bf16: 0.99985 measured on the H100 (2026-11-23) for a 4-token text whose GEMMs took another
  // cuBLASLt tiling; a packing fault gives 1 - cos of 3e-2 or more.
  const double cos_bar = dtype == ScalarType::kF16 || cpu_stand_in() ? 0.99999 : 0.9995;
  const std::unique_ptr<Backend> device = device_backend(dtype);
  EngineLoop::ServedEncoder enc{kMiniLmName, m->config, make_encoder(m->config, load_weights(m->files), *device),
                                nullptr};
  const std::vector<std::vector<float>> solo = embed_round(enc, *device, m->ids, 1);
  ASSERT_EQ(solo.size(), m->ids.size());
  for (const int64_t budget : {int64_t{2048}, int64_t{16384}}) {
    int forwards = 0;
    const std::vector<std::vector<float>> packed = embed_round(enc, *device, m->ids, budget, &forwards);
    ASSERT_EQ(packed.size(), solo.size());
    double worst = 1.0, worst_abs = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < packed.size(); ++i) {
      const double c = cosine(packed[i], solo[i]);
      const double d = max_abs_diff(packed[i], solo[i]);
      worst_abs = std::max(worst_abs, d);
      if (c < worst) {
        worst = c;
        worst_at = i;
      }
      EXPECT_GE(c, cos_bar) << "text " << i << " (" << m->ids[i].size() << " tokens), budget " << budget;
      EXPECT_LE(d, 2 * eps) << "text " << i << " (" << m->ids[i].size() << " tokens), budget " << budget;
    }
    std::printf("[cuda-bert] minilm %s packed (budget %lld, %d forwards) against one by one: min cosine %.8f (text "
                "%zu, %zu tokens; bar %.5f), max abs diff %.3g (bar 2 eps = %.3g)\n",
                dtype_label(dtype), static_cast<long long>(budget), forwards, worst, worst_at,
                m->ids[worst_at].size(), cos_bar, worst_abs, 2 * eps);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RealMiniLm, ::testing::Values(ScalarType::kBF16, ScalarType::kF16), dtype_param_name);

}  // namespace
}  // namespace tessera
