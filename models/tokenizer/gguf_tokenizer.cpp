// models/tokenizer/gguf_tokenizer.cpp: GGUF tokenizer.ggml.* metadata -> PipelineTokenizer:
// "gpt2" (byte-level BPE; tokenizer.ggml.pre picks the pre-tokenizer) and "llama" (SentencePiece
// scores with byte fallback). CONTROL and USER_DEFINED tokens are the added tokens.
#include <string>

#include "common/error.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/pipeline_tokenizer.h"
#include "models/weights/gguf.h"

namespace tessera::tok {
namespace {

constexpr const char* kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

GgufTokenType type_at(const GgufTokenizerData& d, size_t id) {
  return d.token_types.empty() ? GgufTokenType::kNormal : static_cast<GgufTokenType>(d.token_types[id]);
}

std::optional<int32_t> valid_id(const GgufTokenizerData& d, std::optional<int32_t> id, const char* what) {
  if (!id || *id < 0) return std::nullopt;  // llama.cpp writes -1 for "none"
  TESSERA_CHECK(static_cast<size_t>(*id) < d.tokens.size(),
                "GGUF tokenizer: " << what << " id " << *id << " is outside the vocabulary of " << d.tokens.size());
  return id;
}

// CONTROL tokens are special (skipped by decode(skip_special)); USER_DEFINED ones are plain added
// tokens. Both are matched in the raw text before anything else, as HF and llama.cpp do.
std::vector<AddedToken> added_tokens_of(const GgufTokenizerData& d) {
  std::vector<AddedToken> added;
  for (size_t id = 0; id < d.tokens.size(); ++id) {
    const GgufTokenType type = type_at(d, id);
    if ((type != GgufTokenType::kControl && type != GgufTokenType::kUserDefined) || d.tokens[id].empty()) continue;
    AddedToken t;
    t.id = static_cast<int32_t>(id);
    t.content = d.tokens[id];
    t.special = type == GgufTokenType::kControl;
    added.push_back(std::move(t));
  }
  return added;
}

std::vector<TemplateItem> bos_eos_template(std::optional<int32_t> bos, std::optional<int32_t> eos) {
  std::vector<TemplateItem> items;
  if (bos) items.push_back({false, {*bos}});
  items.push_back({true, {}});
  if (eos) items.push_back({false, {*eos}});
  return items.size() == 1 ? std::vector<TemplateItem>{} : items;
}

PreTokenizerPtr byte_level_pre_tokenizer_for(const std::string& pre, BpeOptions& options) {
  if (pre == "smollm") {
    // SmolLM2's tokenizer.json: each digit alone, then the GPT-2 regex.
    std::vector<PreTokenizerPtr> steps;
    steps.push_back(make_digits_split(true));
    steps.push_back(make_byte_level(false, true));
    return make_pre_tokenizer_sequence(std::move(steps));
  }
  if (pre == "gpt2") return make_byte_level(false, true);
  if (pre == "llama-bpe") {
    // Llama-3's tokenizer.json: its own split regex, byte-level mapping without the GPT-2 regex,
    // and whole pieces found in the vocabulary taken as they are.
    options.ignore_merges = true;
    std::vector<PreTokenizerPtr> steps;
    steps.push_back(make_regex_split(kLlama3Pattern, SplitBehavior::kIsolated, false));
    steps.push_back(make_byte_level(false, false));
    return make_pre_tokenizer_sequence(std::move(steps));
  }
  TESSERA_FAIL("GGUF tokenizer.ggml.pre '" << pre << "' is not supported (supported: smollm, gpt2, llama-bpe)");
}

std::unique_ptr<Tokenizer> byte_level_bpe(const GgufTokenizerData& d) {
  TESSERA_CHECK(!d.pre.empty(), "GGUF tokenizer.ggml.pre is missing: the byte-level BPE pre-tokenizer is unknown "
                                "(supported: smollm, gpt2, llama-bpe)");
  Vocabulary vocab;
  vocab.reserve(d.tokens.size());
  for (size_t id = 0; id < d.tokens.size(); ++id) vocab.add(d.tokens[id], static_cast<int32_t>(id));
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(d.merges.size());
  for (const auto& m : d.merges) {
    const size_t space = m.find(' ', 1);
    TESSERA_CHECK(space != std::string::npos, "GGUF tokenizer.ggml.merges entry '" << m << "' is not \"left right\"");
    merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  PipelineParts parts;
  BpeOptions options;
  parts.pre_tokenizer = byte_level_pre_tokenizer_for(d.pre, options);
  parts.added_tokens = added_tokens_of(d);
  parts.model = make_bpe_model(std::move(vocab), merges, options);
  const auto bos = valid_id(d, d.bos_id, "BOS"), eos = valid_id(d, d.eos_id, "EOS");
  parts.single_template = bos_eos_template(d.add_bos.value_or(false) ? bos : std::nullopt,
                                           d.add_eos.value_or(false) ? eos : std::nullopt);
  parts.decoder = make_byte_level_decoder();
  parts.lossless = true;
  return std::make_unique<PipelineTokenizer>(std::move(parts));
}

std::unique_ptr<Tokenizer> sentencepiece_bpe(const GgufTokenizerData& d) {
  TESSERA_CHECK(d.scores.size() == d.tokens.size(),
                "GGUF tokenizer.ggml.scores has " << d.scores.size() << " entries for " << d.tokens.size() << " tokens");
  Vocabulary vocab;
  vocab.reserve(d.tokens.size());
  std::vector<ScoredPiece> pieces(d.tokens.size());
  bool has_bytes = false;
  for (size_t id = 0; id < d.tokens.size(); ++id) {
    vocab.add(d.tokens[id], static_cast<int32_t>(id));
    const GgufTokenType type = type_at(d, id);
    pieces[id].score = d.scores[id];
    pieces[id].mergeable = type == GgufTokenType::kNormal || type == GgufTokenType::kUserDefined ||
                           type == GgufTokenType::kUndefined;
    has_bytes = has_bytes || type == GgufTokenType::kByte;
  }
  const auto unk = valid_id(d, d.unk_id, "UNK");
  const bool add_space_prefix = d.add_space_prefix.value_or(true);
  PipelineParts parts;
  parts.added_tokens = added_tokens_of(d);
  // As HF's Llama tokenizer.json: "▁" before each text segment, spaces written as "▁".
  std::vector<NormalizerPtr> normalizers;
  if (add_space_prefix) normalizers.push_back(make_prepend_normalizer(kSpmSpace));
  normalizers.push_back(make_replace_normalizer(" ", kSpmSpace));
  parts.normalizer = make_normalizer_sequence(std::move(normalizers));
  parts.model = make_spm_bpe_model(std::move(vocab), std::move(pieces), unk.value_or(-1));
  const auto bos = valid_id(d, d.bos_id, "BOS"), eos = valid_id(d, d.eos_id, "EOS");
  parts.single_template = bos_eos_template(d.add_bos.value_or(true) ? bos : std::nullopt,
                                           d.add_eos.value_or(false) ? eos : std::nullopt);
  std::vector<DecoderPtr> decoders;
  decoders.push_back(make_replace_decoder(kSpmSpace, " "));
  decoders.push_back(make_byte_fallback_decoder());
  decoders.push_back(make_fuse_decoder());
  if (add_space_prefix) decoders.push_back(make_strip_decoder(" ", 1, 0));
  parts.decoder = make_decoder_sequence(std::move(decoders));
  parts.lossless = has_bytes;
  return std::make_unique<PipelineTokenizer>(std::move(parts));
}

}  // namespace

GgufTokenizerData read_gguf_tokenizer_data(const GgufFile& g) {
  GgufTokenizerData d;
  d.model = g.get_string("tokenizer.ggml.model");
  d.pre = g.find_string("tokenizer.ggml.pre").value_or("");
  d.tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (g.has("tokenizer.ggml.token_type")) {
    for (const int64_t t : g.get_int_array("tokenizer.ggml.token_type")) d.token_types.push_back(static_cast<int32_t>(t));
    TESSERA_CHECK(d.token_types.size() == d.tokens.size(), g.path() << ": tokenizer.ggml.token_type has "
                                                                    << d.token_types.size() << " entries for "
                                                                    << d.tokens.size() << " tokens");
  }
  if (g.has("tokenizer.ggml.scores")) {
    for (const double s : g.get_float_array("tokenizer.ggml.scores")) d.scores.push_back(static_cast<float>(s));
  }
  if (g.has("tokenizer.ggml.merges")) d.merges = g.get_string_array("tokenizer.ggml.merges");
  const auto id = [&](const char* key) -> std::optional<int32_t> {
    if (const auto v = g.find_int(key)) return static_cast<int32_t>(*v);
    return std::nullopt;
  };
  d.bos_id = id("tokenizer.ggml.bos_token_id");
  d.eos_id = id("tokenizer.ggml.eos_token_id");
  d.unk_id = id("tokenizer.ggml.unknown_token_id");
  d.pad_id = id("tokenizer.ggml.padding_token_id");
  const auto flag = [&](const char* key) -> std::optional<bool> {
    if (g.has(key)) return g.get_bool(key);
    return std::nullopt;
  };
  d.add_bos = flag("tokenizer.ggml.add_bos_token");
  d.add_eos = flag("tokenizer.ggml.add_eos_token");
  d.add_space_prefix = flag("tokenizer.ggml.add_space_prefix");
  return d;
}

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufTokenizerData& d) {
  TESSERA_CHECK(!d.tokens.empty(), "GGUF tokenizer.ggml.tokens is empty");
  TESSERA_CHECK(d.token_types.empty() || d.token_types.size() == d.tokens.size(),
                "GGUF tokenizer.ggml.token_type has " << d.token_types.size() << " entries for " << d.tokens.size()
                                                      << " tokens");
  if (d.model == "gpt2") return byte_level_bpe(d);
  if (d.model == "llama") return sentencepiece_bpe(d);
  TESSERA_FAIL("GGUF tokenizer.ggml.model '" << d.model << "' is not supported (supported: gpt2, llama)");
}

}  // namespace tessera::tok
