// models/tokenizer/tokenizer_json.cpp: HF tokenizer.json (and BERT vocab.txt) -> PipelineTokenizer.
// Every component type is either supported or rejected by name: nothing is silently ignored.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/pipeline_tokenizer.h"

namespace tessera::tok {
namespace {

using nlohmann::json;

std::string type_of(const json& j, const std::string& what, const std::string& source) {
  TESSERA_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
                source << ": " << what << " has no \"type\"");
  return j["type"].get<std::string>();
}

template <typename T>
T get_or(const json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].get<T>();
}

// HF patterns are {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::string text;
  bool is_regex = false;
};
Pattern pattern_of(const json& j, const std::string& what, const std::string& source) {
  TESSERA_CHECK(j.contains("pattern") && j["pattern"].is_object(), source << ": " << what << " has no pattern");
  const json& p = j["pattern"];
  if (p.contains("String")) return {p["String"].get<std::string>(), false};
  if (p.contains("Regex")) return {p["Regex"].get<std::string>(), true};
  TESSERA_FAIL(source << ": " << what << " pattern is neither String nor Regex: " << p.dump());
}

NormalizerPtr build_normalizer(const json& j, const std::string& source) {
  const std::string type = type_of(j, "normalizer", source);
  if (type == "BertNormalizer") {
    BertNormalizerOptions o;
    o.clean_text = get_or(j, "clean_text", true);
    o.handle_chinese_chars = get_or(j, "handle_chinese_chars", true);
    o.lowercase = get_or(j, "lowercase", true);
    o.strip_accents = get_or(j, "strip_accents", o.lowercase);
    return make_bert_normalizer(o);
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") return make_unicode_normalizer(type);
  if (type == "Lowercase") return make_lowercase_normalizer();
  if (type == "Prepend") return make_prepend_normalizer(j.at("prepend").get<std::string>());
  if (type == "Strip") return make_strip_normalizer(get_or(j, "strip_left", true), get_or(j, "strip_right", true));
  if (type == "Replace") {
    const Pattern p = pattern_of(j, "Replace normalizer", source);
    TESSERA_CHECK(!p.is_regex, source << ": Replace normalizers with a Regex pattern are not supported");
    return make_replace_normalizer(p.text, j.at("content").get<std::string>());
  }
  if (type == "Sequence") {
    std::vector<NormalizerPtr> steps;
    for (const auto& step : j.at("normalizers")) steps.push_back(build_normalizer(step, source));
    return make_normalizer_sequence(std::move(steps));
  }
  TESSERA_FAIL(source << ": unsupported normalizer type '" << type
                      << "' (supported: BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, "
                         "Sequence)");
}

std::string prepend_scheme_of(const json& j) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) return j["prepend_scheme"].get<std::string>();
  return get_or(j, "add_prefix_space", true) ? "always" : "never";
}

PreTokenizerPtr build_pre_tokenizer(const json& j, const std::string& source) {
  const std::string type = type_of(j, "pre_tokenizer", source);
  if (type == "ByteLevel") return make_byte_level(get_or(j, "add_prefix_space", true), get_or(j, "use_regex", true));
  if (type == "Split") {
    const Pattern p = pattern_of(j, "Split pre-tokenizer", source);
    const SplitBehavior behavior = split_behavior_from_name(j.at("behavior").get<std::string>());
    const bool invert = get_or(j, "invert", false);
    return p.is_regex ? make_regex_split(p.text, behavior, invert) : make_literal_split(p.text, behavior, invert);
  }
  if (type == "Digits") return make_digits_split(get_or(j, "individual_digits", false));
  if (type == "BertPreTokenizer") return make_bert_pre_tokenizer();
  if (type == "Whitespace") return make_whitespace_pre_tokenizer();
  if (type == "WhitespaceSplit") return make_whitespace_split_pre_tokenizer();
  if (type == "Punctuation") {
    return make_punctuation_split(split_behavior_from_name(get_or<std::string>(j, "behavior", "Isolated")));
  }
  if (type == "Metaspace") {
    return make_metaspace(get_or<std::string>(j, "replacement", "\xE2\x96\x81"), prepend_scheme_of(j),
                          get_or(j, "split", true));
  }
  if (type == "Sequence") {
    std::vector<PreTokenizerPtr> steps;
    for (const auto& step : j.at("pretokenizers")) steps.push_back(build_pre_tokenizer(step, source));
    return make_pre_tokenizer_sequence(std::move(steps));
  }
  TESSERA_FAIL(source << ": unsupported pre_tokenizer type '" << type
                      << "' (supported: ByteLevel, Split, Digits, BertPreTokenizer, Whitespace, WhitespaceSplit, "
                         "Punctuation, Metaspace, Sequence)");
}

Vocabulary vocab_of(const json& model, const std::string& source) {
  TESSERA_CHECK(model.contains("vocab") && model["vocab"].is_object(), source << ": model.vocab is not an object");
  Vocabulary vocab;
  vocab.reserve(model["vocab"].size());
  for (const auto& [token, id] : model["vocab"].items()) vocab.add(token, id.get<int32_t>());
  return vocab;
}

TokenModelPtr build_model(const json& j, const std::string& source) {
  const std::string type = type_of(j, "model", source);
  if (type == "BPE") {
    TESSERA_CHECK(!j.contains("dropout") || j["dropout"].is_null() || j["dropout"].get<double>() == 0.0,
                  source << ": BPE dropout is a training feature and is not supported at inference");
    BpeOptions o;
    if (j.contains("unk_token") && j["unk_token"].is_string()) o.unk_token = j["unk_token"].get<std::string>();
    o.continuing_subword_prefix = get_or<std::string>(j, "continuing_subword_prefix", "");
    o.end_of_word_suffix = get_or<std::string>(j, "end_of_word_suffix", "");
    o.fuse_unk = get_or(j, "fuse_unk", false);
    o.byte_fallback = get_or(j, "byte_fallback", false);
    o.ignore_merges = get_or(j, "ignore_merges", false);
    std::vector<std::pair<std::string, std::string>> merges;
    for (const auto& m : j.at("merges")) {
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        TESSERA_CHECK(space != std::string::npos, source << ": BPE merge '" << s << "' is not \"left right\"");
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else {
        TESSERA_CHECK(m.is_array() && m.size() == 2, source << ": BPE merge " << m.dump() << " is not a pair");
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
    }
    return make_bpe_model(vocab_of(j, source), merges, o);
  }
  if (type == "WordPiece") {
    WordPieceOptions o;
    o.unk_token = get_or<std::string>(j, "unk_token", "[UNK]");
    o.continuing_subword_prefix = get_or<std::string>(j, "continuing_subword_prefix", "##");
    o.max_input_chars_per_word = get_or<size_t>(j, "max_input_chars_per_word", 100);
    return make_wordpiece_model(vocab_of(j, source), o);
  }
  TESSERA_FAIL(source << ": unsupported model type '" << type << "' (supported: BPE, WordPiece)");
}

int32_t special_id(const json& pair, const std::string& source) {
  // BertProcessing / RobertaProcessing give ["[CLS]", 101].
  TESSERA_CHECK(pair.is_array() && pair.size() == 2, source << ": post_processor token " << pair.dump() << " is not [token, id]");
  return pair[1].get<int32_t>();
}

void build_post_processor(const json& j, const std::string& source, std::vector<TemplateItem>& single) {
  const std::string type = type_of(j, "post_processor", source);
  if (type == "TemplateProcessing") {
    const json& specials = j.at("special_tokens");
    for (const auto& item : j.at("single")) {
      if (item.contains("Sequence")) {
        single.push_back({true, {}});
        continue;
      }
      TESSERA_CHECK(item.contains("SpecialToken"), source << ": template item " << item.dump() << " is not understood");
      const std::string name = item["SpecialToken"].at("id").get<std::string>();
      TESSERA_CHECK(specials.contains(name), source << ": template names special token '" << name << "', which is not defined");
      single.push_back({false, specials[name].at("ids").get<std::vector<int32_t>>()});
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    single = {{false, {special_id(j.at("cls"), source)}}, {true, {}}, {false, {special_id(j.at("sep"), source)}}};
    return;
  }
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    for (const auto& step : j.at("processors")) build_post_processor(step, source, single);
    return;
  }
  TESSERA_FAIL(source << ": unsupported post_processor type '" << type
                      << "' (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)");
}

DecoderPtr build_decoder(const json& j, const std::string& source, bool& byte_level) {
  const std::string type = type_of(j, "decoder", source);
  if (type == "ByteLevel") {
    byte_level = true;
    return make_byte_level_decoder();
  }
  if (type == "WordPiece") return make_wordpiece_decoder(get_or<std::string>(j, "prefix", "##"), get_or(j, "cleanup", true));
  if (type == "Metaspace") {
    return make_metaspace_decoder(get_or<std::string>(j, "replacement", "\xE2\x96\x81"), prepend_scheme_of(j) != "never");
  }
  if (type == "Replace") {
    const Pattern p = pattern_of(j, "Replace decoder", source);
    TESSERA_CHECK(!p.is_regex, source << ": Replace decoders with a Regex pattern are not supported");
    return make_replace_decoder(p.text, j.at("content").get<std::string>());
  }
  if (type == "ByteFallback") return make_byte_fallback_decoder();
  if (type == "Fuse") return make_fuse_decoder();
  if (type == "Strip") {
    return make_strip_decoder(j.at("content").get<std::string>(), get_or<size_t>(j, "start", 0), get_or<size_t>(j, "stop", 0));
  }
  if (type == "Sequence") {
    std::vector<DecoderPtr> steps;
    for (const auto& step : j.at("decoders")) steps.push_back(build_decoder(step, source, byte_level));
    return make_decoder_sequence(std::move(steps));
  }
  TESSERA_FAIL(source << ": unsupported decoder type '" << type
                      << "' (supported: ByteLevel, WordPiece, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in.good(), "cannot open " << path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_json(const nlohmann::json& j, const std::string& source) {
  TESSERA_CHECK(j.is_object() && j.contains("model"), source << ": not a tokenizer.json (no \"model\")");
  PipelineParts parts;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& t : j["added_tokens"]) {
      AddedToken a;
      a.id = t.at("id").get<int32_t>();
      a.content = t.at("content").get<std::string>();
      a.special = get_or(t, "special", false);
      a.lstrip = get_or(t, "lstrip", false);
      a.rstrip = get_or(t, "rstrip", false);
      a.normalized = get_or(t, "normalized", !a.special);
      a.single_word = get_or(t, "single_word", false);
      parts.added_tokens.push_back(std::move(a));
    }
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) parts.normalizer = build_normalizer(j["normalizer"], source);
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    parts.pre_tokenizer = build_pre_tokenizer(j["pre_tokenizer"], source);
  }
  parts.model = build_model(j["model"], source);
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    build_post_processor(j["post_processor"], source, parts.single_template);
  }
  bool byte_level = false;
  if (j.contains("decoder") && !j["decoder"].is_null()) parts.decoder = build_decoder(j["decoder"], source, byte_level);
  parts.lossless = byte_level;
  return std::make_unique<PipelineTokenizer>(std::move(parts));
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path) {
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    TESSERA_FAIL(path << ": invalid JSON: " << e.what());
  }
  try {
    return tokenizer_from_json(j, path);
  } catch (const json::exception& e) {
    TESSERA_FAIL(path << ": unexpected tokenizer.json content: " << e.what());
  }
}

std::unique_ptr<Tokenizer> load_wordpiece_vocab(const std::string& path, bool lowercase) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "cannot open " << path);
  Vocabulary vocab;
  std::string line;
  for (int32_t id = 0; std::getline(in, line); ++id) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.add(line, id);
  }
  PipelineParts parts;
  for (const char* special : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (const int32_t id = vocab.find(special); id >= 0) {
      parts.added_tokens.push_back({id, special, true, false, false, false, false});
    }
  }
  const int32_t cls = vocab.find("[CLS]"), sep = vocab.find("[SEP]");
  TESSERA_CHECK(cls >= 0 && sep >= 0, path << ": a BERT vocabulary needs [CLS] and [SEP]");
  BertNormalizerOptions normalizer;
  normalizer.lowercase = normalizer.strip_accents = lowercase;
  parts.normalizer = make_bert_normalizer(normalizer);
  parts.pre_tokenizer = make_bert_pre_tokenizer();
  parts.model = make_wordpiece_model(std::move(vocab), WordPieceOptions{});
  parts.single_template = {{false, {cls}}, {true, {}}, {false, {sep}}};
  parts.decoder = make_wordpiece_decoder("##", true);
  return std::make_unique<PipelineTokenizer>(std::move(parts));
}

}  // namespace tessera::tok
